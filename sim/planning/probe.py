"""One planning probe: does a policy meet the SLO at a load, judged so the answer can be trusted?

Why a module of its own: ``cbsim capacity`` and ``cbsim plan`` both ask "does this load meet the
SLO?" many times, and a finite run answers it badly in two ways: its warm-up and drain flatter the
latencies, and a run too short to build a backlog meets the SLO at loads no server sustains. So
every probe here is judged by three rules:

1. **Saturation.** No load at or above the *saturated throughput* (the finish rate when every
   request arrives at once: :func:`sim.metrics.steady.saturated_throughput`) is sustainable: the
   queue grows without bound, however long the SLO takes to notice. Such a probe violates without
   being simulated, so a capacity never exceeds the saturated throughput and a plan never gives a
   replica more than it can serve.
2. **Steady state.** The verdict is the summary's ``steady.slo_met``: the SLO percentiles of the
   requests arriving in the steady window, warm-up and drain left out (:mod:`sim.metrics.steady`).
3. **Probe size.** The run starts with the scenario's ``workload.num_requests`` and doubles until
   its steady window is long enough to judge (at least ``MIN_WINDOW_TURNOVERS`` batch turnovers:
   the first too-short run says how many doublings that takes, :func:`sim.metrics.steady.needed_scale`)
   and then until two sizes in a row give the same verdict, up to ``MAX_GROWTH`` times the start.
   Sizes stay on the ladder ``num_requests × 2^k``, so scenarios whose sizes differ by a power of
   two probe the same runs. If the bound is reached first the verdict of the largest run is used
   and the probe is marked *unstable* (the CLI warns, naming the sizes tried). One shortcut: a
   violation by a clear margin (a bounded steady percentile above ``CLEAR_VIOLATION`` × its bound,
   in a window long enough to judge) is final at once: more requests only lengthen a queue, and
   warm-up is already left out. A *met* verdict is always confirmed at twice the size, since a
   short run is exactly what hides a slowly growing queue. A searcher that probes many loads
   passes ``start`` (the first size that was long enough before) to skip the too-short runs.

4. **Seeds.** A verdict near the SLO edge flips with the workload's seed (the arrival pattern and
   the lengths drawn). :func:`judge_seeds` judges the load once per seed (``seed``, ``seed + 1``,
   ...), each by rules 1-3, and the load meets the SLO only when every seed meets it (the first
   seed that fails ends the probe: later seeds cannot change a failed verdict); the verdict
   carries the *spread*: the min and max over the seeds judged of the binding percentile (the
   bounded metric closest to, or furthest past, its bound).

A label is a colocated policy entry or the scenario's disaggregated entry (``disaggregation.label``,
e.g. ``1P2D``: :func:`is_disaggregated`). A disaggregated topology is judged as one unit: its
saturated throughput is that of a burst through the whole topology (prefill pool, links, decode
pool), and its load is the whole arrival rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_GROWTH = 32  # probe sizes from num_requests up to 32 × num_requests
BURST_RATE = 1e6  # requests per second: every request arrives within a few milliseconds
CLEAR_VIOLATION = 1.25
BURST_SLOTS_FACTOR = 4  # a burst holds at least 4 × max_num_seqs requests, so the batch stays full


@dataclass
class Verdict:
    """The answer of one probe, with how it was reached."""

    met: bool
    stable: bool  # two probe sizes in a row agreed (or the load is above saturation)
    saturated: bool  # decided by rule 1, without a run
    sizes: list[tuple[int, bool | None]] = field(default_factory=list)  # (num_requests, steady verdict)
    summary: dict = field(default_factory=dict, repr=False)  # of the largest run
    runs_extra: int = 0  # runs of the other seeds (judge_seeds)
    spread: dict | None = None  # over the seeds (judge_seeds): metric, percentile, min, max, per_seed

    @property
    def runs(self) -> int:
        return len(self.sizes) + self.runs_extra

    @property
    def first_judged(self) -> int | None:
        """The first probe size whose steady window was long enough to judge."""
        return next((n for n, v in self.sizes if v is not None), None)


def size_key(scn) -> tuple[str, int]:
    """The key that sizes a probe and its value in ``scn``: ``workload.num_requests``, or
    ``workload.sessions.count`` for a workload of sessions (whose requests are their turns)."""
    w = scn.workload
    if w.sessions is not None:
        return "workload.sessions.count", int(w.sessions.count)
    return "workload.num_requests", int(w.num_requests or 0)


def is_disaggregated(scn, label: str) -> bool:
    """Whether ``label`` names the scenario's disaggregated entry (not a colocated policy)."""
    return scn.disaggregation is not None and label == scn.disaggregation.name


def saturated_rate(scn, label: str, overrides=()) -> tuple[float | None, int]:
    """(saturated throughput in requests per second of one replica of ``label``, or of the whole
    topology of a disaggregated label; requests in the burst that measured it)."""
    from sim.metrics.steady import saturated_throughput

    if load_sessions(scn, overrides):
        return None, 0  # a burst of sessions is no burst: their later turns wait for think times
    res, n = saturated_run(scn, label, overrides)
    return saturated_throughput(res.requests), n


def burst_size(scn, label: str) -> int:
    """Requests in the burst that measures ``label``'s saturated throughput: the scenario's
    ``num_requests``, but at least ``BURST_SLOTS_FACTOR`` times the most requests one replica
    runs at once, so the batch stays full; for a disaggregated topology, the most either pool's
    instances run at once together (requests pass through both pools)."""
    from sim.runner import policy_knobs
    from sim.scenario.resolved import resolve

    if is_disaggregated(scn, label):
        from sim.disaggregation.run import resolve_pool

        pools = [resolve_pool(scn, name, policy_knobs) for name in ("prefill", "decode")]
        slots = max(p.instances * p.limits.max_num_seqs for p in pools)
    else:
        entry = next(e for e in scn.policies if (e.label or e.name) == label)
        slots = resolve(scn).limits_for(entry.name, policy_knobs(scn, entry)).max_num_seqs
    return max(int(scn.workload.num_requests or 0), BURST_SLOTS_FACTOR * slots)


def load_sessions(scn, overrides=()) -> bool:
    from sim.scenario.schema import load_scenario

    return load_scenario(scn, list(overrides)).workload.sessions is not None


def saturated_run(scn, label: str, overrides=()):
    """(the burst run that measures ``label``'s saturated throughput, its request count): every
    request arriving at once on one replica, or on the whole topology of a disaggregated label
    (:func:`saturated_rate`; the quickstart's story also reads how full the batch and memory were
    while it ran)."""
    from sim.planning.progress import probe
    from sim.runner import run
    from sim.scenario.schema import load_scenario

    one = load_scenario(scn, list(overrides))
    if not is_disaggregated(one, label):
        one = load_scenario(one, ["replicas.count=1"])
    n = burst_size(one, label)
    res = run(one, [f"workload.num_requests={n}", f"workload.arrival.rate={BURST_RATE!r}"], policies=[label],
              progress=probe(f"saturation burst of {n:,} requests"))
    return res, n


def _clearly_violated(steady: dict, slo) -> bool:
    pct = f"p{getattr(slo, 'percentile', 99):g}"
    for metric in ("ttft_s", "tpot_s", "e2e_s"):
        bound = getattr(slo, metric, None)
        value = (steady.get(metric) or {}).get(pct)
        if bound is not None and value is not None and value > CLEAR_VIOLATION * bound:
            return True
    return False


def judge(scn, label: str, overrides, load_per_replica: float, saturated: float | None,
          max_growth: int = MAX_GROWTH, start: int | None = None) -> Verdict:
    """The verdict at ``overrides`` (the probe's rate, replica count, ...): rules 1-3 above."""
    from sim.metrics.steady import needed_scale
    from sim.planning.progress import probe
    from sim.runner import run
    from sim.scenario.schema import load_scenario

    if saturated is not None and load_per_replica >= saturated:
        return Verdict(met=False, stable=True, saturated=True)
    base = load_scenario(scn, list(overrides))
    key, n0 = size_key(base)
    n0 = n0 or 1
    what = "sessions" if key == "workload.sessions.count" else "requests"
    sizes: list[tuple[int, bool | None]] = []
    summary: dict = {}
    n, stable = (start if start and n0 <= start <= n0 * max_growth else n0), False
    while True:
        result = run(base, [f"{key}={n}"], policies=[label],
                     progress=probe(f"{n:,} {what}" + (f" (probe size {len(sizes) + 1})" if sizes else "")))
        summary = result.summaries[label]
        verdict = summary["steady"]["slo_met"]
        if verdict is not None and sizes and sizes[-1][1] == verdict:
            sizes.append((n, verdict))
            stable = True
            break
        if verdict is False and base.slo is not None and _clearly_violated(summary["steady"], base.slo):
            sizes.append((n, verdict))
            stable = True
            break
        sizes.append((n, verdict))
        if n >= n0 * max_growth:
            break
        steps = 1
        if verdict is None:  # too short: jump to the first size whose window is long enough
            steps = max(1, math.ceil(math.log2(needed_scale(result.requests))))
        n = min(n * 2**steps, n0 * max_growth)
    final = sizes[-1][1]
    if final is None:  # no steady window even at the bound: the whole run's verdict
        final = bool(summary["slo_met"])
    return Verdict(met=bool(final), stable=stable, saturated=False, sizes=sizes, summary=summary)


def judge_saturation_last(scn, label: str, overrides, load_per_replica: float,
                          saturated: Callable[[], float | None], seeds: int = 1, **kw) -> Verdict:
    """:func:`judge` with rule 1 checked last: the runs first, then, only if they meet, the
    saturated throughput (``saturated()``, a burst). The verdict's ``met`` is the same as
    :func:`judge` given the saturated throughput up front (rule 1 only ever turns a *met* into a
    violation); a searcher whose every candidate has a saturated throughput of its own (each
    xPyD layout of the disaggregated planner) then measures it only for the candidates that meet."""
    return saturation_last(judge_seeds(scn, label, overrides, load_per_replica, None, seeds, **kw),
                           load_per_replica, saturated)


def saturation_last(v: Verdict, load_per_replica: float, saturated: Callable[[], float | None]) -> Verdict:
    """Rule 1 applied to the verdict of the runs (:func:`judge_saturation_last`): a *met* becomes a
    violation when the load is at or above the saturated throughput (``saturated()``, asked only
    then)."""
    if not v.met:
        return v
    sat = saturated()
    if sat is not None and load_per_replica >= sat:
        return Verdict(met=False, stable=True, saturated=True, sizes=v.sizes, summary=v.summary,
                       runs_extra=v.runs_extra, spread=v.spread)
    return v


SLO_METRICS = ("ttft_s", "tpot_s", "e2e_s")


def binding(summary: dict, slo) -> tuple[str, float] | None:
    """The bounded metric whose SLO percentile (steady window, else the whole run) is highest
    relative to its bound, and that percentile; None without a judged figure."""
    pct = f"p{getattr(slo, 'percentile', 99):g}"
    steady = summary.get("steady") or {}
    best = None
    for metric in SLO_METRICS:
        bound = getattr(slo, metric, None)
        if bound is None:
            continue
        value = (steady.get(metric) or {}).get(pct)
        if value is None:
            value = (summary.get(metric) or {}).get(pct)
        if value is None:
            continue
        if best is None or value / bound > best[2]:
            best = (metric, float(value), value / bound)
    return None if best is None else best[:2]


def judge_seeds(scn, label: str, overrides, load_per_replica: float, saturated: float | None,
                seeds: int = 1, on_met: Callable[[int], None] | None = None, **kw) -> Verdict:
    """:func:`judge` once per seed (``seed`` … ``seed + seeds − 1``, rule 4 of the module doc): met
    only when every seed meets, so the seeds are judged in order and the first that fails ends the
    probe (the seeds after it could not change the verdict: a search pays for them only where a load
    meets). The verdict is that of the first seed that fails (else of the scenario's own seed), with
    ``spread`` over the seeds judged (``per_seed`` lists them). ``seeds`` = 1 is :func:`judge`
    itself. ``on_met(k)``: called after the ``k``-th seed (0-based) met, before the next is judged
    (the disaggregated planner starts a layout's saturation burst there)."""
    from sim.scenario.schema import load_scenario

    if seeds <= 1:
        return judge(scn, label, overrides, load_per_replica, saturated, **kw)
    from sim.planning import seed_pool

    base = load_scenario(scn, list(overrides)).seed

    def args(k: int) -> tuple:
        return scn, label, [*overrides, f"seed={base + k}"], load_per_replica, saturated

    verdicts, beside = [], {}
    for k in range(seeds):
        v = beside.pop(k).get() if k in beside else judge(*args(k), **kw)
        verdicts.append(v)
        if not v.met:
            break
        if on_met is not None and k + 1 < seeds:
            on_met(k)
        pool = seed_pool.current()
        if k == 0 and pool is not None:
            # every later seed is needed unless one fails: seeds 2, 3, ... in the spare workers
            # while this process judges seed 1 (any after a failure are discarded, not counted)
            beside = {j: pool.apply_async(judge, args(j), kw) for j in range(2, seeds)}
    chosen = verdicts[-1] if not verdicts[-1].met else verdicts[0]
    slo = load_scenario(scn).slo
    figures = [binding(v.summary, slo) if v.summary else None for v in verdicts]
    metrics = [f[0] for f in figures if f is not None]
    spread = None
    if metrics:
        # the metric that binds most often over the seeds; its percentile in every seed
        metric = max(dict.fromkeys(metrics), key=metrics.count)
        pct = f"p{getattr(slo, 'percentile', 99):g}"
        values = []
        for v in verdicts:
            steady = (v.summary.get("steady") or {}).get(metric) or {}
            value = steady.get(pct)
            if value is None:
                value = (v.summary.get(metric) or {}).get(pct)
            values.append(value)
        known = [x for x in values if x is not None]
        spread = {"metric": metric, "percentile": getattr(slo, "percentile", 99),
                  "min": min(known) if known else None, "max": max(known) if known else None,
                  "per_seed": [[base + k, v.met, x] for k, (v, x) in enumerate(zip(verdicts, values))]}
    return Verdict(met=all(v.met for v in verdicts), stable=all(v.stable for v in verdicts),
                   saturated=all(v.saturated for v in verdicts), sizes=chosen.sizes, summary=chosen.summary,
                   runs_extra=sum(v.runs for v in verdicts) - len(chosen.sizes), spread=spread)
