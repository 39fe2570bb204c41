"""Capacity: per policy, the highest arrival rate at which a run still meets the SLO.

"Meets the SLO" is the run-level test of DESIGN.md, computed by :func:`sim.metrics.summary.run_meets_slo`
and reported as the summary's ``slo_met``: the SLO's percentile (default p99) of each bounded
metric (TTFT, TPOT, E2E) is within its bound, with unfinished requests counted as infinitely late.

The search, for one policy, with every probe a full simulation at ``workload.arrival.rate = r``
(the same seeded arrival pattern, time-scaled, and the same request lengths at every rate):

1. bracket: from the scenario's own rate, double while the run meets the SLO, or halve until it
   does, so that ``lo`` meets and ``hi`` violates;
2. bisect geometrically (``sqrt(lo·hi)``) until ``hi ≤ lo·(1 + tolerance)``;
3. verify: run at ``lo·(1 + tolerance)``. It must violate; if it meets (the meets-SLO curve is
   not monotone there), the search continues above it from step 1. Then run at
   ``lo·(1 − tolerance)``, which must meet; if it does not, the result is flagged
   ``monotone: false`` (a dip below the boundary).

Guarantee: the returned ``rate_rps`` meets the SLO, a run at ``rate_rps·(1 + tolerance)``
violates it, and (unless ``monotone`` is false) one at ``rate_rps·(1 − tolerance)`` meets it;
each of the three was simulated, not assumed. ``goodput_rps`` is the goodput of the run at
``rate_rps``. About 10 runs per policy at the default 2 % tolerance.

A finite workload and the rate: a workload is ``num_requests`` requests, so a run at a rate just
above capacity builds a backlog of only about ``N·tol/(1 + tol)`` requests before arrivals stop.
The 99th-percentile request then waits roughly ``N·tol/((1 + tol)·rate)`` seconds more than at
capacity; if that is below the TTFT (or E2E) bound, a short run meets the SLO at rates a server
could not sustain, and the capacity found is too high. So use at least about
``N ≥ ttft_s · rate · (1 + tol) / tol`` requests (:func:`min_requests`; 2 s, 20 req/s and 2 %
need ~2000), or read the result as the capacity *for bursts of N requests*. Each result carries
``min_requests`` and the CLI says when ``num_requests`` is below it. At the other extreme, a
workload whose every request can arrive at once and still meet the SLO has no capacity: the
search stops with an error saying so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from sim.errors import CbsimError, nearest

DEFAULT_TOLERANCE = 0.02
MAX_DOUBLINGS = 24  # 2^24: a rate 16 million times the start is "any rate"
MAX_HALVINGS = 24


@dataclass
class Capacity:
    """The result of one policy's search (rates in requests per second)."""

    policy: str
    rate_rps: float  # highest rate found to meet the SLO
    goodput_rps: float  # goodput of the run at rate_rps
    throughput_rps: float
    violating_rate_rps: float  # rate_rps × (1 + tolerance): simulated, violates the SLO
    tolerance: float
    runs: int
    monotone: bool  # rate_rps × (1 − tolerance) was simulated and met the SLO
    num_requests: int
    min_requests: int | None  # requests needed for the finite-run caveat not to bite (module doc)
    probes: list[tuple[float, bool]] = field(default_factory=list)  # (rate, met), in run order
    summary: dict = field(default_factory=dict, repr=False)  # the run at rate_rps

    def to_dict(self) -> dict:
        d = asdict(self)
        d["probes"] = [list(p) for p in self.probes]
        return d


def has_slo(slo) -> bool:
    return slo is not None and any(getattr(slo, k, None) is not None for k in ("ttft_s", "tpot_s", "e2e_s"))


def require_slo(scn, what: str = "capacity") -> None:
    if not has_slo(scn.slo):
        raise CbsimError(f"{what} needs an SLO: add slo: {{ttft_s: ..., tpot_s: ..., percentile: 99}} to "
                         f"the scenario (or --set slo.ttft_s=2.0)")


def require_rate(scn, what: str = "capacity") -> float:
    from sim.planning.sweep import arrival_rate

    w = scn.workload
    rate = arrival_rate(scn)
    if rate is None:
        src = "written-out workload.requests" if w.requests is not None else "a replayed trace's timestamps"
        raise CbsimError(f"{what} varies workload.arrival.rate, but this scenario's arrivals come from {src}; "
                         f"use a synthetic arrival process (arrival: {{process: poisson, rate: ...}}; "
                         f"lengths may still come from a trace with dist: trace)")
    return float(rate)


def min_requests(slo, rate: float, tolerance: float) -> int | None:
    """Requests a run needs so that an overload of ``tolerance`` at ``rate`` pushes the
    99th-percentile request past the tightest queueing-sensitive bound (TTFT or E2E)."""
    bounds = [b for b in (getattr(slo, "ttft_s", None), getattr(slo, "e2e_s", None)) if b is not None]
    if not bounds or rate <= 0:
        return None
    return math.ceil(min(bounds) * rate * (1 + tolerance) / tolerance)


def labels_of(scn, policies: Iterable[str] | None) -> list[str]:
    labels = [e.label or e.name for e in scn.policies]
    if not policies:
        return labels
    chosen = list(policies)
    for label in chosen:
        if label not in labels:
            raise CbsimError(f"--policy {label!r} is not in the scenario{nearest(label, labels)}; "
                             f"its policies are: {', '.join(labels)}")
    return chosen


def simulate_at(scn, label: str, rate: float) -> dict:
    """The summary of one policy's run at ``rate`` requests per second (one probe)."""
    from sim.runner import run

    return run(scn, [f"workload.arrival.rate={rate!r}"], policies=[label]).summaries[label]


class _Probe:
    """Runs one policy at a rate, caching by rate, and keeps the order of the runs."""

    def __init__(self, scn, label: str):
        self.scn, self.label = scn, label
        self.summaries: dict[float, dict] = {}
        self.order: list[float] = []

    def met(self, rate: float) -> bool:
        if rate not in self.summaries:
            self.summaries[rate] = simulate_at(self.scn, self.label, rate)
            self.order.append(rate)
        return bool(self.summaries[rate]["slo_met"])

    def describe(self, rate: float) -> str:
        s = self.summaries[rate]
        bits = [f"p99 {m.removesuffix('_s').upper()} {s[m]['p99']:.3g} s" for m in ("ttft_s", "tpot_s", "e2e_s")
                if s[m]["p99"] is not None]
        bits.append(f"{s['requests_finished']}/{s['requests_total']} finished")
        return ", ".join(bits)


def search_capacity(scn, label: str, tolerance: float = DEFAULT_TOLERANCE) -> Capacity:
    """The capacity of one policy (see the module docstring for the algorithm and guarantee)."""
    if not 0 < tolerance < 1:
        raise CbsimError(f"--tolerance must be between 0 and 1 (a fraction: 0.02 is 2 %), got {tolerance}")
    require_slo(scn)
    start = require_rate(scn)
    probe = _Probe(scn, label)

    def grow(lo: float) -> tuple[float, float]:
        hi = lo * 2
        for _ in range(MAX_DOUBLINGS):
            if not probe.met(hi):
                return lo, hi
            lo, hi = hi, hi * 2
        raise CbsimError(
            f"{label}: the SLO is met at every rate up to {lo:.3g} req/s: with "
            f"{scn.workload.num_requests} requests nearly all arrive at once and are still served in time, "
            f"so the rate does not matter; raise workload.num_requests (capacity needs a workload long "
            f"enough to build a queue) or tighten the SLO")

    if probe.met(start):
        lo, hi = grow(start)
    else:
        hi = start
        for _ in range(MAX_HALVINGS):
            lo = hi / 2
            if probe.met(lo):
                break
            hi = lo
        else:
            raise CbsimError(f"{label}: the SLO is not met even at {hi:.3g} req/s, an almost idle server "
                             f"({probe.describe(hi)}): a single request cannot meet it on this hardware; "
                             f"loosen the SLO or use faster hardware")
    while True:
        while hi > lo * (1 + tolerance):
            mid = math.sqrt(lo * hi)
            if probe.met(mid):
                lo = mid
            else:
                hi = mid
        up = lo * (1 + tolerance)
        if not probe.met(up):
            break
        lo, hi = grow(up)  # not monotone: a higher rate meets after all; search above it
    monotone = probe.met(lo * (1 - tolerance))
    s = probe.summaries[lo]
    return Capacity(
        policy=label,
        rate_rps=lo,
        goodput_rps=s["goodput_rps"],
        throughput_rps=s["throughput_rps"],
        violating_rate_rps=up,
        tolerance=tolerance,
        runs=len(probe.order),
        monotone=monotone,
        num_requests=s["requests_total"],
        min_requests=min_requests(scn.slo, lo, tolerance),
        probes=[(r, bool(probe.summaries[r]["slo_met"])) for r in probe.order],
        summary=s,
    )


def capacity(scenario, overrides: Iterable[str] = (), policies: Iterable[str] | None = None,
             tolerance: float = DEFAULT_TOLERANCE, workers: int | None = None, backend: str = "local",
             ray_address: str | None = None) -> dict[str, Capacity]:
    """Every (or the chosen) policy's capacity, searched in parallel over policies; label -> result
    in the scenario's policy order."""
    from sim.planning.sweep import execute
    from sim.scenario.schema import load_scenario

    scn = load_scenario(scenario, list(overrides))
    require_slo(scn)
    require_rate(scn)
    if not 0 < tolerance < 1:
        raise CbsimError(f"--tolerance must be between 0 and 1 (a fraction: 0.02 is 2 %), got {tolerance}")
    labels = labels_of(scn, policies)
    results: dict[str, Capacity] = {}

    def keep(i: int, res: Capacity) -> None:
        results[labels[i]] = res

    execute(search_capacity, [(scn, label, tolerance) for label in labels], keep, backend=backend,
            workers=workers, ray_address=ray_address)
    return {label: results[label] for label in labels}
