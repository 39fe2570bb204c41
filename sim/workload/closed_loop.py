"""Closed-loop clients as data: how many, when each first sends, and the think times they wait.

A closed-loop benchmark (``vllm bench serve --max-concurrency N``, aiperf / genai-perf
``--concurrency N``) keeps N requests in flight: N clients each send a request, wait for its
last token (or its rejection: an HTTP error frees the client too), think, and send the next one;
the requests are taken in the workload's order by whichever client is free first. The load is
then set by the concurrency, not by a rate: the server's own latency paces the arrivals.

This module holds only what can be drawn before the run (the SimPy side is :mod:`sim.clients`):

* ``first_send_s[c]``: when client ``c`` sends its first request (the first ``min(N, num_requests)``
  requests in order), as ``start`` places them: ``together`` all at 0; ``even`` at ``c × ramp_s / N``;
  ``random`` N independent uniform draws over ``[0, ramp_s)`` on their own random stream, sorted, so
  the workload's order is still the send order (client ``c`` is the ``c``-th to send). ``random``
  is what a long benchmark's clients look like once jitter (response handling, tokenization, the
  API server's event loop, none of which repeats exactly) has drifted their phases apart: each
  phase anywhere in the cycle, independently of the others, where ``even`` is the special case of
  no two ever closer than ``ramp_s / N``;
* ``think_s[k]``: the think time of the ``k``-th time a client is freed (in the order the run frees
  them), drawn from ``think_time_s`` on its own random stream, so a change of concurrency or of
  any length leaves these draws alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

THINK = 6  # the think times' random stream: numpy.random.default_rng([seed, THINK])
FIRST_SENDS = 12  # start: random's draws (streams 1-11 are sim.workload.draws' and sessions')


@dataclass(frozen=True)
class ClosedLoop:
    concurrency: int
    first_send_s: tuple[float, ...]  # one per client that sends at all (min(concurrency, n))
    think_s: np.ndarray  # think time of the k-th client freed, seconds (>= 0)

    @property
    def min_think_s(self) -> float:
        return float(self.think_s.min()) if self.think_s.size else 0.0


def think_times(think, n: int, seed: int, stream: int = THINK) -> np.ndarray:
    """``n`` think times from a ``think_time_s`` (a number, a ``TimeDist`` or null)."""
    if think is None:
        return np.zeros(n)
    if isinstance(think, int | float):
        return np.full(n, float(think))
    gen = np.random.default_rng([seed, stream])
    if think.dist == "fixed":
        return np.full(n, float(think.value))
    if think.dist == "uniform":
        return gen.uniform(think.min, think.max, n) if think.max > think.min else np.full(n, float(think.min))
    if think.dist == "exponential":
        return gen.exponential(think.mean, n)
    if think.dist == "lognormal":
        from sim.workload.distributions import lognormal_params

        mu, sigma = lognormal_params(think.mean, think.p99)
        return gen.lognormal(mu, sigma, n)
    raise ValueError(f"no think-time distribution {think.dist!r}")


def closed_loop(scenario, n: int) -> ClosedLoop | None:
    """The scenario's clients for ``n`` requests; None when its arrivals are open-loop."""
    a = scenario.workload.arrival
    if scenario.workload.requests is not None or not a.closed:
        return None
    clients = min(a.concurrency, n)
    first = first_sends(a, clients, scenario.seed)
    return ClosedLoop(a.concurrency, first, think_times(a.think_time_s, n, scenario.seed))


def first_sends(arrival, clients: int, seed: int) -> tuple[float, ...]:
    """The first send of each of the ``clients`` that send at all (module docstring: ``start``)."""
    ramp = float(arrival.ramp_s or 0.0)
    if arrival.start == "random":
        # N draws whatever the request count, so num_requests < N takes a prefix of the same phases
        draws = np.sort(np.random.default_rng([seed, FIRST_SENDS]).uniform(0.0, ramp, arrival.concurrency))
        return tuple(float(t) for t in draws[:clients])
    return tuple(c * ramp / arrival.concurrency for c in range(clients))


@dataclass(frozen=True)
class SendPlan:
    """Which requests are sent during the run, and after what (:mod:`sim.clients`): the sessions
    (request indices in turn order; a request alone is a session of one turn), and the closed-loop
    clients that run them one after another, or None when each session's first turn arrives at
    its own ``arrival_s``. A later turn is sent its ``think_s`` after the previous turn ended."""

    sessions: tuple[tuple[int, ...], ...]
    closed: ClosedLoop | None

    def min_think_s(self, specs) -> float:
        """No send follows an end sooner than this (the fast-forward's bound)."""
        turn = [specs[i].think_s for sess in self.sessions for i in sess[1:]]
        values = turn + ([self.closed.min_think_s] if self.closed is not None else [])
        return min(values) if values else 0.0


def send_plan(scenario, specs) -> SendPlan | None:
    """The scenario's sends during the run: closed-loop clients, sessions, or both; None when every
    request arrives at its own time (open loop, no sessions)."""
    # sim.workload.spec_columns: requests of their own content, none in a session
    in_sessions = not getattr(specs, "all_own", False) and any(s.session >= 0 for s in specs)
    w = scenario.workload
    closed_wanted = w.requests is None and w.arrival.process == "closed"
    if not closed_wanted and not in_sessions:
        return None
    groups: dict[int, list[int]] = {}
    order: list[list[int]] = []
    for i, spec in enumerate(specs):
        if spec.session < 0:
            order.append([i])
        elif spec.session in groups:
            groups[spec.session].append(i)
        else:
            groups[spec.session] = [i]
            order.append(groups[spec.session])
    sessions = tuple(tuple(sorted(g, key=lambda i: specs[i].turn)) for g in order)
    return SendPlan(sessions, closed_loop(scenario, len(sessions)))
