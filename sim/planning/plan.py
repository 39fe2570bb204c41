"""Plan: how many replicas meet the SLO at a target rate, and what they cost.

For each policy, the smallest ``replicas.count`` whose run at ``workload.arrival.rate = R`` meets
the SLO *in steady state*, with the scenario's router (``replicas.router``) spreading the
arrivals. Every candidate count is judged by :func:`sim.planning.probe.judge`: a count whose
replicas would each get ``R / n`` at or above one replica's saturated throughput ``S`` violates
without a run (so the search starts at the first count below saturation, ``⌊R/S⌋ + 1``);
otherwise the verdict is the steady-window SLO test (warm-up and drain left out), with the probe
size doubled from ``workload.num_requests`` until two sizes in a row agree. The search doubles
the count until it meets, then bisects between the last count that failed and the first that
met, so the answer ``n`` is verified both ways: ``n`` replicas meet the SLO and ``n − 1`` do not
(simulated, or at or above saturation), assuming more replicas never hurt.

Cost. One replica is one tensor-parallel group of ``hardware.count`` GPUs (which equals
``hardware.tensor_parallel``), so the plan uses ``GPUs = replicas × hardware.count``. Running
them for an hour of traffic costs ``GPUs`` GPU-hours, i.e. ``GPUs × cost_per_gpu_hour`` per
hour; at R requests per second an hour serves ``3600·R`` requests, so

    cost per million requests = GPUs × cost_per_gpu_hour / (3600 · R) × 10⁶.

This is the cost of provisioning for R (all the replicas stay up for the hour), not of only the
busy time; without ``cost_per_gpu_hour`` only GPU-hours are reported.

Replicas smooth arrivals. A router spreading a Poisson stream of R req/s round-robin gives each of
n replicas R/n req/s with *more regular* gaps (every n-th arrival: gamma-distributed gaps, cv
1/√n) than one replica sees at that rate from its own Poisson stream, so queues are shorter and n
replicas can pass at R/n above one replica's capacity. ``per_replica_rps`` is the R/n each
replica was judged at.

Seeds: with ``seeds`` = K every count is judged at K workload seeds and meets only when each
does (:func:`sim.planning.probe.judge_seeds`); ``spread`` states the binding percentile's min and
max over them at the chosen count. ``cbsim plan`` judges 3 by default (``--seeds``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from sim.errors import CbsimError
from sim.planning.capacity import check_seeds, labels_of, require_rate, require_slo, smallest

DEFAULT_MAX_REPLICAS = 64


@dataclass
class Plan:
    policy: str
    target_rate_rps: float
    router: str
    replicas: int | None  # None: not met with max_replicas
    max_replicas: int
    gpus_per_replica: int
    gpus: int | None
    gpu_hours_per_hour: float | None
    cost_per_gpu_hour: float | None
    cost_per_hour: float | None
    cost_per_million_requests: float | None
    runs: int
    saturated_rps: float | None = None  # one replica's saturated throughput
    offered_rps: float | None = None  # steady window of the run with `replicas`: arrival rate ...
    achieved_rps: float | None = None  # ... and finish rate
    probe_requests: int | None = None  # requests in that run
    stable: bool = True  # every probe's verdict agreed between two sizes in a row
    unstable_counts: list[int] = field(default_factory=list)
    probes: list[tuple[int, bool]] = field(default_factory=list)  # (replicas, met), in probe order
    per_replica_rps: float | None = None  # the offered rate each of the `replicas` replicas was judged at
    seeds: int = 1  # workload seeds judged for every count (each must meet)
    spread: dict | None = None  # at `replicas`, over the seeds: the binding percentile's min and max
    summary: dict = field(default_factory=dict, repr=False)  # the run with `replicas` replicas
    # closed-loop clients: the concurrency planned for (target_rate_rps is then the steady finish
    # rate of the run with `replicas`, which the cost figures use)
    target_concurrency: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["probes"] = [list(p) for p in self.probes]
        return d


def costs(replicas: int, gpus_per_replica: int, rate: float, price: float | None) -> dict:
    gpus = replicas * gpus_per_replica
    out = {"gpus": gpus, "gpu_hours_per_hour": float(gpus), "cost_per_hour": None,
           "cost_per_million_requests": None}
    if price is not None:
        out["cost_per_hour"] = gpus * price
        out["cost_per_million_requests"] = gpus * price / (3600.0 * rate) * 1e6
    return out


def plan_policy(scn, label: str, target_rate: float, max_replicas: int = DEFAULT_MAX_REPLICAS,
                seeds: int = 1) -> Plan:
    """The smallest replica count for one policy (see the module docstring); with ``seeds`` > 1 a
    count meets only when every seed meets."""
    from sim.planning.probe import judge_seeds, saturated_rate
    from sim.planning.progress import point

    with point(label):
        saturated, _ = saturated_rate(scn, label)
    verdicts: dict = {}
    order: list[int] = []

    def met(n: int) -> bool:
        if n not in verdicts:
            with point(f"{label}, {n} replica(s) at {target_rate:g} req/s"):
                verdicts[n] = judge_seeds(scn, label, [f"workload.arrival.rate={target_rate!r}", f"replicas.count={n}"],
                                          target_rate / n, saturated, seeds)
            order.append(n)
        return verdicts[n].met

    first = 1 if saturated is None else min(max_replicas, math.floor(target_rate / saturated) + 1)
    if first > 1:
        met(first - 1)  # above saturation: decided without a run, kept as the failing side
    best = smallest(met, max_replicas, lo_fail=first - 1)
    per = scn.hardware.count
    c = costs(best, per, target_rate, scn.cost_per_gpu_hour) if best is not None else {}
    s = verdicts[best].summary if best is not None else {}
    steady = s.get("steady") or {}
    return Plan(
        policy=label, target_rate_rps=target_rate, router=scn.replicas.router, replicas=best,
        max_replicas=max_replicas, gpus_per_replica=per, gpus=c.get("gpus"),
        gpu_hours_per_hour=c.get("gpu_hours_per_hour"), cost_per_gpu_hour=scn.cost_per_gpu_hour,
        cost_per_hour=c.get("cost_per_hour"), cost_per_million_requests=c.get("cost_per_million_requests"),
        runs=sum(v.runs for v in verdicts.values()) + 1, saturated_rps=saturated,
        offered_rps=steady.get("offered_rps"), achieved_rps=steady.get("achieved_rps"),
        probe_requests=s.get("requests_total"),
        stable=all(v.stable for v in verdicts.values()),
        unstable_counts=[k for k in order if not verdicts[k].stable],
        probes=[(k, verdicts[k].met) for k in order],
        per_replica_rps=target_rate / best if best is not None else None,
        seeds=seeds,
        spread=verdicts[best].spread if best is not None else None,
        summary=s,
    )


def plan_closed_loop(scn, label: str, concurrency: int, max_replicas: int = DEFAULT_MAX_REPLICAS,
                     seeds: int = 1) -> Plan:
    """The smallest replica count whose run with ``concurrency`` closed-loop clients meets the SLO
    in steady state (:mod:`sim.planning.concurrency`: no saturation shortcut, the clients pace
    themselves); the cost figures use that run's steady finish rate."""
    from sim.planning.concurrency import probe_overrides
    from sim.planning.probe import judge_seeds

    verdicts: dict = {}
    order: list[int] = []

    def met(n: int) -> bool:
        if n not in verdicts:
            verdicts[n] = judge_seeds(scn, label, probe_overrides(scn, concurrency, [f"replicas.count={n}"]),
                                      concurrency / n, None, seeds)
            order.append(n)
        return verdicts[n].met

    best = smallest(met, max_replicas)
    per = scn.hardware.count
    s = verdicts[best].summary if best is not None else {}
    steady = s.get("steady") or {}
    rate = steady.get("achieved_rps") or s.get("throughput_rps") or 0.0
    c = costs(best, per, rate, scn.cost_per_gpu_hour) if best is not None and rate > 0 else {}
    return Plan(
        policy=label, target_rate_rps=rate, router=scn.replicas.router, replicas=best,
        max_replicas=max_replicas, gpus_per_replica=per, gpus=c.get("gpus"),
        gpu_hours_per_hour=c.get("gpu_hours_per_hour"), cost_per_gpu_hour=scn.cost_per_gpu_hour,
        cost_per_hour=c.get("cost_per_hour"), cost_per_million_requests=c.get("cost_per_million_requests"),
        runs=sum(v.runs for v in verdicts.values()), saturated_rps=None,
        offered_rps=steady.get("offered_rps"), achieved_rps=steady.get("achieved_rps"),
        probe_requests=s.get("requests_total"), stable=all(v.stable for v in verdicts.values()),
        unstable_counts=[k for k in order if not verdicts[k].stable],
        probes=[(k, verdicts[k].met) for k in order], summary=s, target_concurrency=concurrency,
        seeds=seeds, spread=verdicts[best].spread if best is not None else None,
    )


def plan(scenario, target_rate: float | None, overrides: Iterable[str] = (), policies: Iterable[str] | None = None,
         max_replicas: int = DEFAULT_MAX_REPLICAS, workers: int | None = None, backend: str = "local",
         ray_address: str | None = None, target_concurrency: int | None = None,
         seeds: int = 1) -> dict[str, Plan]:
    """A plan per (chosen) policy, searched in parallel over policies; label -> Plan. The load is
    ``target_rate`` (open-loop arrivals) or ``target_concurrency`` (closed-loop clients)."""
    from sim.planning.capacity import is_closed_loop
    from sim.planning.sweep import execute
    from sim.scenario.schema import load_scenario

    if max_replicas < 1:
        raise CbsimError(f"--max-replicas must be at least 1, got {max_replicas}")
    scn = load_scenario(scenario, list(overrides))
    require_slo(scn, "plan")
    check_seeds(seeds)
    closed = is_closed_loop(scn)
    if closed:
        if target_rate is not None:
            raise CbsimError("--target-rate: this scenario's clients are closed-loop (workload.arrival.process: "
                             "closed), their load is a concurrency; use --target-concurrency N")
        if target_concurrency is None:
            target_concurrency = int(scn.workload.arrival.concurrency)
        if target_concurrency < 1:
            raise CbsimError(f"--target-concurrency must be at least 1 client, got {target_concurrency}")
    else:
        if target_concurrency is not None:
            raise CbsimError("--target-concurrency needs closed-loop clients: set workload.arrival.process=closed "
                             "(--set workload.arrival={process: closed, concurrency: 8}) or use --target-rate")
        if target_rate is None or not target_rate > 0:
            raise CbsimError(f"--target-rate must be a positive number of requests per second, got {target_rate}")
        require_rate(scn, "plan")
    labels = labels_of(scn, policies)
    results: dict[str, Plan] = {}

    def keep(i: int, res: Plan) -> None:
        results[labels[i]] = res

    if closed:
        execute(plan_closed_loop, [(scn, label, target_concurrency, max_replicas, seeds) for label in labels], keep,
                backend=backend, workers=workers, ray_address=ray_address)
    else:
        execute(plan_policy, [(scn, label, float(target_rate), max_replicas, seeds) for label in labels], keep,
                backend=backend, workers=workers, ray_address=ray_address)
    return {label: results[label] for label in labels}
