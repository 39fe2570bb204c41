"""Multi-turn sessions as requests: each turn's prompt is the session's whole history plus a new
message, described by prompt runs that the session's earlier turns share.

A chat or agent session resends its conversation every turn: turn k's prompt is the system
prompt, every earlier user (or tool) message and every earlier answer, then the new message.
With content described as runs (:mod:`policies.prefix_hash`: token ``i`` of run ``(key, n)`` is
``(key, i)``, and a request's generated token ``j`` is ``(output_key, j)``), turn k is

    (("system", g), S), (("user", s, 0), n0), (("answer", s, 0), o0), ..., (("user", s, k), nk)

and turn k's ``output_key`` is ``("answer", s, k)``: so turn k + 1's prompt agrees token by token
with turn k's prompt *and* with what turn k generated, and the engines' prefix caches (vLLM V1's
block hashes, SGLang's and TGI's radix trees) hit on the history exactly as far as its KV is still
held. Sessions with the same system prompt group share it too.

Draws (each quantity its own random stream, :func:`sim.workload.draws.rng`): per session its
turn count and system-prompt group; per turn (session-major) its new message, its answer and the
think time before it. A turn whose prompt would not fit ``max_model_len − 1`` tokens ends its
session there (the client's context is full); an answer is cut to the room left. Requests are
numbered session by session, turn by turn; a session's first turn arrives by ``workload.arrival``
(a rate of sessions, or closed-loop clients running one session after another), each later turn
``think_time_s`` after the previous turn's last token (:mod:`sim.clients`).
"""

from __future__ import annotations

import numpy as np

from sim.workload.closed_loop import think_times
from sim.workload.draws import rng, sample_lengths, synthetic_arrivals
from sim.workload.request_spec import RequestSpec

# random streams (sim.workload.draws uses 1-5, sim.workload.closed_loop 6)
TURNS, NEW, ANSWER, TURN_THINK, SYSTEM = 7, 8, 9, 10, 11


def build_sessions(scenario) -> list[RequestSpec]:
    w = scenario.workload
    ss, seed, max_len = w.sessions, scenario.seed, scenario.engine.max_model_len
    count = ss.count
    turns = np.maximum(sample_lengths(ss.turns, count, rng(seed, TURNS)), 1)
    total = int(turns.sum())
    new = np.maximum(sample_lengths(ss.new_tokens, total, rng(seed, NEW), "prompt"), 1).tolist()
    answer = np.maximum(sample_lengths(ss.output_tokens, total, rng(seed, ANSWER), "output"), 1).tolist()
    think = think_times(ss.think_time_s, total, seed, TURN_THINK).tolist()
    groups = rng(seed, SYSTEM).integers(0, ss.system_prompt.num_groups, size=count).tolist()
    closed = w.arrival.process == "closed"
    if closed:
        starts = [float("nan")] * count
    else:
        from sim.workload.clock import fit_to_clock

        starts = fit_to_clock(synthetic_arrivals(w.arrival, count, seed), "workload.arrival.rate",
                              f"raise workload.arrival.rate ({w.arrival.rate:g} sessions/s)").tolist()
    system = ss.system_prompt.tokens
    width = max(6, len(str(max(total - 1, 0))))
    specs: list[RequestSpec] = []
    d = 0  # the turn's index in the per-turn draws
    for s in range(count):
        history: tuple = ((("system", groups[s]), system),) if system else ()
        held = system
        for k in range(int(turns[s])):
            n, o = new[d + k], answer[d + k]
            prompt = held + n
            if prompt > max_len - 1:
                break  # the context is full: the session ends
            o = min(o, max_len - prompt)
            own = (("user", s, k), n)
            rid = f"r{len(specs):0{width}d}"
            specs.append(RequestSpec(rid, starts[s] if k == 0 else float("nan"), prompt, o, max_len - prompt, 0,
                                     history + (own,), ("answer", s, k), session=s, turn=k,
                                     think_s=0.0 if k == 0 else float(think[d + k])))
            history += (own, (("answer", s, k), o))
            held = prompt + o
        d += int(turns[s])
    return specs


def session_runs(prompts: list[int], outputs: list[int], session: int, key) -> list[tuple]:
    """A trace's session (its turns' prompt and output lengths, in turn order) as prompt runs:
    each turn's prompt is the previous turn's prompt and answer, then its own tokens, as far as
    its length reaches (a shorter prompt than the history keeps the history's first tokens)."""
    runs: list[tuple] = []
    history: tuple = ()
    for k, (p, o) in enumerate(zip(prompts, outputs)):
        cut, left = [], p
        for run_key, length in history:
            if left <= 0:
                break
            cut.append((run_key, min(length, left)))
            left -= min(length, left)
        if left > 0:
            cut.append(((key, session, k), left))
        runs.append(tuple(cut))
        history = tuple(cut) + ((answer_key(key, session, k), o),)
    return runs


def answer_key(key, session: int, turn: int) -> tuple:
    """The ``output_key`` of a trace session's turn: what the next turn's prompt resends."""
    return ("answer", key, session, turn)


def trace_sessions(session: list[int], turn: list[int], prompts: list[int], outputs: list[int]) -> list[tuple]:
    """Per trace row: (prompt runs, output key) of its session's history (:func:`session_runs`),
    the rows of each session taken in turn order."""
    by_session: dict[int, list[int]] = {}
    for i, sid in enumerate(session):
        by_session.setdefault(sid, []).append(i)
    out: list[tuple] = [()] * len(session)
    for sid, rows in by_session.items():
        rows.sort(key=lambda i: turn[i])
        runs = session_runs([prompts[i] for i in rows], [outputs[i] for i in rows], sid, "trace")
        for k, (i, r) in enumerate(zip(rows, runs)):
            out[i] = (r, answer_key("trace", sid, k))
    return out
