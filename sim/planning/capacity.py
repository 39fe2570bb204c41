"""Capacity: per policy, the highest arrival rate at which the server still meets the SLO *in
steady state*; and the same for the scenario's disaggregated entry (``disaggregation.label``,
e.g. ``1P2D``), the whole topology searched as one unit. Closed-loop clients
(``workload.arrival.process: closed``) have no rate to vary: their capacity is the highest
*concurrency* meeting the SLO (:mod:`sim.planning.concurrency`).

"Meets the SLO" is the run-level test of DESIGN.md (the SLO's percentile, default p99, of each
bounded metric within its bound, unfinished requests counted as infinitely late), applied to the
requests of the run's steady window: warm-up and drain left out (:mod:`sim.metrics.steady`).
Every probe is judged by :func:`sim.planning.probe.judge`: a rate at or above the policy's
*saturated throughput* violates without a run, and otherwise the probe's request count doubles
from ``workload.num_requests`` until two sizes in a row agree (up to 8 ×; an unstable probe is
reported).

The search, for one policy (the same seeded arrival pattern, time-scaled, at every rate):

0. measure the saturated throughput ``S`` (one run with every request arriving at once): of one
   replica, times ``replicas.count`` (the router spreads the arrivals over identical replicas,
   each of which saturates at its own ``S``: the rule of :mod:`sim.planning.plan`); of the whole
   topology for the disaggregated entry (a burst through its prefill pool, links and decode pool);
1. bracket: from ``min(scenario rate, S)``, double while the probe meets the SLO (capped at
   ``S``, which violates by definition), or halve until it does, so that ``lo`` meets and ``hi``
   violates;
2. bisect geometrically (``sqrt(lo·hi)``) until ``hi ≤ lo·(1 + tolerance)``;
3. verify: probe ``lo·(1 + tolerance)``. It must violate; if it meets (the meets-SLO curve is
   not monotone there), the search continues above it from step 1. Then probe
   ``lo·(1 − tolerance)``, which must meet; if it does not, the result is flagged
   ``monotone: false`` (a dip below the boundary).

Guarantee: the returned ``rate_rps`` meets the SLO in steady state and is below the saturated
throughput, a probe at ``rate_rps·(1 + tolerance)`` violates it (simulated, or at or above
saturation), and (unless ``monotone`` is false) one at ``rate_rps·(1 − tolerance)`` meets it.
``goodput_rps``, ``offered_rps`` and ``achieved_rps`` are the steady-window figures of the run at
``rate_rps``; offered and achieved side by side show that the server keeps up there.

Seeds: with ``seeds`` = K every probe is judged at the scenario's seed and the K − 1 after it, and a
rate meets only when every seed meets (:func:`sim.planning.probe.judge_seeds`); ``spread`` states the
binding percentile's min and max over the seeds at ``rate_rps``. ``cbsim capacity`` judges 3 seeds
by default (``--seeds``); the Python API 1.

Requests: the probe size grows until the verdict is stable, so the scenario's ``num_requests``
is where growth starts. ``min_requests`` (:func:`min_requests`) is still reported: below it a
run of the scenario's own size could not show an overload of ``tolerance`` in its TTFT tail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from sim.errors import CbsimError, nearest

DEFAULT_TOLERANCE = 0.02
MAX_DOUBLINGS = 24  # 2^24: a rate 16 million times the start is "any rate"
MAX_HALVINGS = 24


@dataclass
class Capacity:
    """The result of one policy's search (rates in requests per second)."""

    policy: str  # the label: a colocated policy entry or the disaggregated entry
    rate_rps: float  # highest rate found to meet the SLO in steady state
    goodput_rps: float  # steady-window goodput of the run at rate_rps
    throughput_rps: float  # whole-run throughput of that run
    offered_rps: float | None  # steady window: arrival rate ...
    achieved_rps: float | None  # ... and finish rate, side by side
    saturated_rps: float | None  # the ceiling: burst finish rate (× replicas.count when colocated)
    violating_rate_rps: float  # rate_rps × (1 + tolerance): violates (simulated or above saturation)
    tolerance: float
    runs: int
    monotone: bool  # rate_rps × (1 − tolerance) was probed and met the SLO
    num_requests: int  # the scenario's: where each probe's size starts
    probe_requests: int  # requests in the run at rate_rps whose verdict was used
    stable: bool  # every probe's verdict agreed between two sizes in a row (or was above saturation)
    unstable_rates: list[float] = field(default_factory=list)
    min_requests: int | None = None  # see the module doc
    probes: list[tuple[float, bool]] = field(default_factory=list)  # (rate, met), in probe order
    disaggregated: bool = False  # the scenario's disaggregated entry, searched as one topology
    gpus: int | None = None  # GPUs the searched layout runs on (all replicas, or both pools)
    seeds: int = 1  # workload seeds judged at every probe (each must meet: sim.planning.probe.judge_seeds)
    spread: dict | None = None  # at rate_rps, over the seeds: the binding percentile's min and max
    summary: dict = field(default_factory=dict, repr=False)  # the run at rate_rps
    # closed-loop clients (sim.planning.concurrency): the highest concurrency meeting the SLO, the
    # lowest found to violate it; rate_rps is then the steady finish rate of the run there
    concurrency: int | None = None
    violating_concurrency: int | None = None

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


def is_closed_loop(scn) -> bool:
    """Whether the scenario's load is closed-loop clients (searched by concurrency, not rate)."""
    return scn.workload.requests is None and scn.workload.arrival.process == "closed"


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


def labels_of(scn, policies: Iterable[str] | None, disaggregated: bool = False) -> list[str]:
    """The chosen labels (all when ``policies`` is empty), checked against the scenario's colocated
    policies, and with ``disaggregated`` its disaggregated entry too (run after them, as the runner
    does)."""
    labels = [e.label or e.name for e in scn.policies]
    if disaggregated and scn.disaggregation is not None:
        labels.append(scn.disaggregation.name)
    if not policies:
        return labels
    chosen = list(policies)
    for label in chosen:
        if label not in labels:
            raise CbsimError(f"--policy {label!r} is not in the scenario{nearest(label, labels)}; "
                             f"its policies are: {', '.join(labels)}")
    return chosen


class _Probe:
    """Judges one policy at a rate (:func:`sim.planning.probe.judge`), caching by rate, and keeps
    the order of the probes."""

    def __init__(self, scn, label: str, saturated: float | None, seeds: int = 1):
        self.scn, self.label, self.saturated, self.seeds = scn, label, saturated, seeds
        self.verdicts: dict = {}
        self.order: list[float] = []

    def met(self, rate: float) -> bool:
        from sim.planning.probe import judge_seeds
        from sim.planning.progress import point

        if rate not in self.verdicts:
            # every probe sizes itself from num_requests (no carried-over start), so a fresh probe
            # at the same rate reproduces its verdict exactly
            with point(f"{self.label} at {rate:.4g} req/s"):
                self.verdicts[rate] = judge_seeds(self.scn, self.label, [f"workload.arrival.rate={rate!r}"], rate,
                                                  self.saturated, self.seeds)
            self.order.append(rate)
        return self.verdicts[rate].met

    def describe(self, rate: float) -> str:
        v = self.verdicts[rate]
        if v.saturated:
            return f"at or above the saturated throughput {self.saturated:.3g} req/s"
        s = v.summary.get("steady") or v.summary
        bits = [f"p99 {m.removesuffix('_s').upper()} {s[m]['p99']:.3g} s" for m in ("ttft_s", "tpot_s", "e2e_s")
                if s[m]["p99"] is not None]
        bits.append(f"{v.summary['requests_finished']}/{v.summary['requests_total']} finished")
        return ", ".join(bits)

    @property
    def runs(self) -> int:
        return sum(v.runs for v in self.verdicts.values())


def search_capacity(scn, label: str, tolerance: float = DEFAULT_TOLERANCE, seeds: int = 1) -> Capacity:
    """The capacity of one policy, or of the disaggregated topology (see the module docstring for
    the algorithm and guarantee); with ``seeds`` > 1 a rate meets only when every seed meets."""
    from sim.planning.probe import is_disaggregated, saturated_rate

    if not 0 < tolerance < 1:
        raise CbsimError(f"--tolerance must be between 0 and 1 (a fraction: 0.02 is 2 %), got {tolerance}")
    require_slo(scn)
    if is_closed_loop(scn):
        from sim.planning.concurrency import search_concurrency

        return Capacity(**search_concurrency(scn, label, tolerance, seeds))
    start = require_rate(scn)
    disaggregated = is_disaggregated(scn, label)
    units = 1 if disaggregated else scn.replicas.count  # what saturates at the burst's rate
    one, _ = saturated_rate(scn, label)
    saturated = None if one is None else one * units
    probe = _Probe(scn, label, saturated, seeds)
    ceiling = saturated if saturated is not None else math.inf
    if start >= ceiling:
        start = ceiling * (1 - tolerance) / (1 + tolerance)

    def grow(lo: float) -> tuple[float, float]:
        hi = min(lo * 2, ceiling)
        for _ in range(MAX_DOUBLINGS):
            if hi >= ceiling or not probe.met(hi):
                return lo, hi
            lo, hi = hi, min(hi * 2, ceiling)
        raise CbsimError(
            f"{label}: the SLO is met at every rate up to {lo:.3g} req/s and no saturated throughput "
            f"could be measured; raise workload.num_requests or tighten the SLO")

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
    best = probe.verdicts[lo]
    s = best.summary
    unstable = [r for r in probe.order if not probe.verdicts[r].stable]
    return Capacity(
        policy=label,
        rate_rps=lo,
        goodput_rps=s["steady"]["goodput_rps"] if s["steady"]["goodput_rps"] is not None else s["goodput_rps"],
        throughput_rps=s["throughput_rps"],
        offered_rps=s["steady"]["offered_rps"],
        achieved_rps=s["steady"]["achieved_rps"],
        saturated_rps=saturated,
        violating_rate_rps=up,
        tolerance=tolerance,
        runs=probe.runs + 1,  # the burst that measured the saturated throughput
        monotone=monotone,
        num_requests=int(scn.workload.num_requests or s["requests_total"]),
        probe_requests=s["requests_total"],
        stable=not unstable,
        unstable_rates=unstable,
        min_requests=min_requests(scn.slo, lo, tolerance),
        probes=[(r, probe.verdicts[r].met) for r in probe.order],
        disaggregated=disaggregated,
        gpus=s.get("gpus", scn.replicas.count * scn.hardware.count),
        seeds=seeds,
        spread=best.spread,
        summary=s,
    )


def capacity(scenario, overrides: Iterable[str] = (), policies: Iterable[str] | None = None,
             tolerance: float = DEFAULT_TOLERANCE, workers: int | None = None, backend: str = "local",
             ray_address: str | None = None, seeds: int = 1) -> dict[str, Capacity]:
    """Every (or the chosen) policy's capacity, and the disaggregated entry's when the scenario has
    one, searched in parallel over labels; label -> result in the scenario's policy order, the
    disaggregated entry last."""
    from sim.planning.sweep import execute
    from sim.scenario.schema import load_scenario

    scn = load_scenario(scenario, list(overrides))
    require_slo(scn)
    if not is_closed_loop(scn):
        require_rate(scn)
    if not 0 < tolerance < 1:
        raise CbsimError(f"--tolerance must be between 0 and 1 (a fraction: 0.02 is 2 %), got {tolerance}")
    check_seeds(seeds)
    labels = labels_of(scn, policies, disaggregated=True)
    results: dict[str, Capacity] = {}

    def keep(i: int, res: Capacity) -> None:
        results[labels[i]] = res

    execute(search_capacity, [(scn, label, tolerance, seeds) for label in labels], keep, backend=backend,
            workers=workers, ray_address=ray_address)
    return {label: results[label] for label in labels}


def check_seeds(seeds: int) -> None:
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= 100:
        raise CbsimError(f"--seeds must be a whole number of workload seeds from 1 to 100, got {seeds!r}")


def smallest(met: Callable[[int], bool], hi: int, lo_fail: int = 0) -> int | None:
    """The smallest ``n`` in ``(lo_fail, hi]`` with ``met(n)``, doubling from ``lo_fail + 1`` then
    bisecting (``met`` assumed monotone); None when even ``hi`` does not meet."""
    n, fail = lo_fail + 1, lo_fail
    while not met(n):
        fail = n
        if n >= hi:
            return None
        n = min(2 * n, hi)
    best = n
    while best - fail > 1:
        mid = (fail + best) // 2
        if met(mid):
            best = mid
        else:
            fail = mid
    return best
