"""Plan a disaggregated deployment: the cheapest xPyD split meeting the SLO at a target rate,
against the best colocated layout on the same GPUs.

Disaggregated side. For each pair of tensor-parallel sizes (prefill, decode) from ``tp_choices``,
the fewest GPUs ``x·tp_p + y·tp_d`` over prefill instance counts ``x`` and decode instance counts
``y`` (each at most ``max_instances``) whose run at ``workload.arrival.rate = R`` meets the SLO.
Assuming more instances in either pool never hurt, the layouts that meet form a staircase, and
the search walks it:

1. grow ``x = y = 1, 2, 4, ...`` until a layout meets (none up to ``max_instances``: no plan);
2. bisect ``x`` down with that ``y``, then ``y`` down with the smallest ``x``;
3. for each larger ``x`` whose prefill GPUs alone leave room to beat the best, bisect the
   smallest ``y`` that meets (it can only be smaller than the last one).

Every layout reported was simulated and met; ``probes`` lists every run ``(x, y, met)``.

Colocated side. For each policy of ``policies`` and each TP size, the smallest replica count
meeting the SLO (doubling, then bisection, as :mod:`sim.planning.plan`), and one run of that
policy on the *same number of GPUs* as the disaggregated plan (``⌊GPUs / tp⌋`` replicas), whose
p99 figures show by how much a colocated layout of that size misses the SLO.

Verdicts are the steady-state test of :func:`sim.planning.probe.judge`, the same on both sides
(and the same as ``cbsim plan`` and ``cbsim capacity``), so the comparison is fair and does not
hinge on the run's length: the SLO percentiles of the requests arriving after warm-up and before
drain, the probe size doubled from ``workload.num_requests`` until two sizes agree, and no layout
meeting at a load at or above its saturated throughput (a burst of every request at once: through
the whole topology for an xPyD layout, the whole rate its load; one replica for a colocated layout,
``R / replicas`` its load). Each layout has a saturated throughput of its own, so it is measured
only for layouts whose runs meet (:func:`sim.planning.probe.judge_saturation_last`: the same
verdicts, fewer bursts); colocated ones once per policy and TP size. When step 1's ``nPnD`` runs
meet, the layout the search asks for next, ``1PnD``, is judged first; if it meets, ``nPnD`` meets
without a burst of its own (``implied_by``: more instances never lower the saturated throughput,
the staircase assumption above; its ``saturated_rps`` is then None). ``p99`` figures are those of
the steady window (of the whole run when no window was long enough).

Speed. Every verdict is a deterministic simulation, so where they are independent they run at
once, in forked worker processes (``jobs``, default 2: this machine class has two cores): each
colocated policy's cheapest-layout search runs beside the disaggregated search, every xPyD
layout's saturation burst starts beside its runs (with several seeds, once its first seed meets,
so a layout failing at its first seed costs no burst), and the colocated layout on the plan's
GPUs is judged here while the workers search. Results are merged in the order a sequential
search judges them, so the plan, its ``probes`` and ``runs`` are the same for every ``jobs``.

Seeds. With ``seeds`` = K every layout, xPyD and colocated, is judged at the scenario's seed and
the K − 1 after it and meets only when each does (:func:`sim.planning.probe.judge_seeds`, as
``cbsim plan`` and ``cbsim capacity``); its ``spread`` states the binding percentile's min and
max over them, and its ``p99`` figures are those of the first seed that failed (else of the
scenario's own seed); the seeds are judged in order and the first that fails ends the layout's
probe. Saturation bursts run at the scenario's seed only, as in ``cbsim plan``
(the bound is one measured throughput, not a per-seed verdict; its lengths do vary with the seed,
so a layout just below it at one seed may be just above it at another). K seeds cost K times the
runs of a layout that meets, the bursts excepted.

Cost. GPUs × ``cost_per_gpu_hour`` per hour of traffic, and per million requests
``GPUs × price / (3600 · R) × 10⁶`` (as :mod:`sim.planning.plan`); the pools may have GPUs of
different kinds, all priced at ``cost_per_gpu_hour``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from sim.errors import CbsimError
from sim.planning.capacity import smallest
from sim.planning.progress import point, probe, reporting, silence

DEFAULT_MAX_INSTANCES = 16
SLO_METRICS = ("ttft_s", "tpot_s", "e2e_s")


@dataclass
class Layout:
    """One simulated layout and its verdict."""

    prefill: int  # instances (for a colocated layout: replicas)
    decode: int  # instances (0 for a colocated layout)
    prefill_tp: int
    decode_tp: int
    gpus: int
    met: bool
    p99: dict = field(default_factory=dict)  # the SLO percentile of ttft_s, tpot_s, e2e_s (steady window)
    saturated: bool = False  # violates because its load is at or above its saturated throughput
    saturated_rps: float | None = None  # that throughput (per replica when colocated), when measured
    stable: bool = True  # the verdict agreed between two probe sizes in a row
    probe_requests: int | None = None  # requests in the run whose verdict was used
    spread: dict | None = None  # with seeds > 1: the binding percentile's min and max over them
    # met without a burst of its own: this smaller layout (e.g. 1P2D) met, and more instances never
    # lower the saturated throughput (the search's staircase assumption); saturated_rps is then None
    implied_by: str | None = None
    summary: dict = field(default_factory=dict, repr=False)


@dataclass
class DisaggPlan:
    """The cheapest disaggregated layout, and the colocated layouts it is compared with."""

    label: str
    target_rate_rps: float
    best: Layout | None  # None: no layout up to max_instances met the SLO
    max_instances: int
    cost_per_gpu_hour: float | None
    cost_per_hour: float | None
    cost_per_million_requests: float | None
    runs: int  # simulations: every probe size of every layout, and the saturation bursts
    probes: list[Layout] = field(default_factory=list)
    colocated: dict[str, dict] = field(default_factory=dict)  # policy label -> comparison
    stable: bool = True  # every layout's verdict agreed between two probe sizes in a row
    seeds: int = 1  # workload seeds judged for every layout (each must meet)

    @property
    def split(self) -> str | None:
        b = self.best
        return None if b is None else f"{b.prefill}P{b.decode}D"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["split"] = self.split
        for layout in [d["best"], *d["probes"]]:
            if layout:
                layout.pop("summary", None)
        return d


def costs(gpus: int | None, rate: float, price: float | None) -> tuple[float | None, float | None]:
    if gpus is None or price is None:
        return None, None
    return gpus * price, gpus * price / (3600.0 * rate) * 1e6


def percentile_of(summary: dict, slo) -> dict:
    """The SLO's percentile of each metric, from the summary's fixed percentiles (p50/p90/p99;
    the closest at or above the SLO's)."""
    key = next((f"p{p}" for p in (50, 90, 99) if p >= slo.percentile), "p99")
    return {m: summary[m][key] for m in SLO_METRICS}


class _Verdicts:
    """Judges layouts once each (:func:`sim.planning.probe.judge_saturation_last`), keeps them in
    judging order, and counts the simulations."""

    def __init__(self, scn, rate: float, pool=None, seeds: int = 1) -> None:
        self.scn, self.rate, self.seeds = scn, rate, seeds
        self.seen: dict[tuple, Layout] = {}
        self.order: list[Layout] = []
        self.saturation: dict[tuple, float | None] = {}
        self.runs = 0
        self.pool = pool  # a multiprocessing pool for saturation bursts ahead of need, or None
        self._bursts: dict[tuple, object] = {}  # saturation key -> its burst started in the pool
        self._ahead: dict[tuple, tuple] = {}  # layout key -> (layout, runs) judged ahead (_implied)
        self.hint: tuple | None = None  # (x, y, tp_p, tp_d): a smaller layout the search asks for next

    def disaggregated(self, x: int, y: int, tp_p: int, tp_d: int) -> Layout:
        key = ("d", x, y, tp_p, tp_d)
        if key not in self.seen:
            with point(f"{x}P{y}D (TP {tp_p}/{tp_d}) at {self.rate:g} req/s"):
                self._judge(key, _split_sets(x, y, tp_p, tp_d), None, 1,
                            Layout(x, y, tp_p, tp_d, x * tp_p + y * tp_d, False))
        return self.seen[key]

    def colocated(self, label: str, n: int, tp: int) -> Layout:
        key = ("c", label, n, tp)
        if key not in self.seen:
            with point(f"{label} colocated, {n} replica(s) of TP {tp} at {self.rate:g} req/s"):
                self._judge(key, [f"replicas.count={n}", f"hardware.tensor_parallel={tp}"], label, n,
                            Layout(n, 0, tp, 0, n * tp, False))
        return self.seen[key]

    def merge(self, state: tuple) -> None:
        """Take in what a worker's search judged (:func:`_cheapest_in_worker`), after this one's."""
        seen, order, saturation, runs = state
        for key, layout in seen.items():
            self.seen.setdefault(key, layout)
        self.order.extend(order)
        for key, sat in saturation.items():
            self.saturation.setdefault(key, sat)
        self.runs += runs

    def take_side(self, side: _Verdicts | None) -> None:
        """Take in layouts judged ahead in this process (:func:`_same_gpus_beside`) after the
        worker's search, as if judged now: a layout the search already judged is dropped, and a
        burst the search already ran is not counted again."""
        if side is None:
            return
        runs = side.runs - sum(1 for key in side.saturation if key in self.saturation)
        fresh = [layout for key, layout in side.seen.items() if key not in self.seen]
        if not fresh:
            return
        for key, sat in side.saturation.items():
            self.saturation.setdefault(key, sat)
        for key, layout in side.seen.items():
            if key not in self.seen:
                layout.saturated_rps = self.saturation.get(("c", key[1], key[3]))
                self.seen[key] = layout
                self.order.append(layout)
        self.runs += runs

    def _judge(self, key, sets: list[str], label: str | None, units: int, layout: Layout) -> None:
        """Judge a layout and keep it in judging order (a layout judged ahead, :meth:`_implied`,
        is taken as it was judged, and its runs counted now)."""
        done = self._ahead.pop(key, None)
        if done is None:
            done = self._evaluate(key, sets, label, units, layout)
        layout, runs = done
        self.runs += runs
        self.seen[key] = layout
        self.order.append(layout)

    def _evaluate(self, key, sets: list[str], label: str | None, units: int, layout: Layout) -> tuple[Layout, int]:
        """``(layout with its verdict, simulations it took)``. ``units``: what shares the rate, each
        saturating at the measured throughput (the colocated replicas; 1 for a topology)."""
        from sim.planning.probe import saturation_last

        before = self.runs
        hint = self.hint if key[0] == "d" else None
        scn, label, sat_key, v = self._runs(key, sets, label, units, start_early=hint is None)
        implied = self._implied(hint) if v.met and hint is not None else None
        if implied is None:
            v = saturation_last(v, self.rate / units, lambda: self._saturated(sat_key, scn, label))
        else:
            layout.implied_by = f"{implied.prefill}P{implied.decode}D"
        summary = v.summary
        steady = summary.get("steady") or {}
        figures = steady if steady.get("slo_met") is not None else summary
        layout.met, layout.saturated, layout.stable = v.met, v.saturated, v.stable
        layout.saturated_rps = self.saturation.get(sat_key)
        layout.p99 = percentile_of(figures, scn.slo) if figures else dict.fromkeys(SLO_METRICS)
        layout.probe_requests = summary.get("requests_total")
        layout.spread = v.spread
        layout.summary = summary
        runs = self.runs - before + v.runs  # bursts run meanwhile, and this layout's runs
        self.runs = before
        return layout, runs

    def _implied(self, hint: tuple) -> Layout | None:
        """The layout ``hint`` (fewer or as many instances in each pool as the one being judged),
        judged now, ahead of the search asking for it; returned when it meets. Then the larger
        layout, whose runs met, meets too without a burst of its own: more instances never lower
        the saturated throughput (the staircase assumption of the module docstring), and the
        rate is below the smaller one's."""
        x, y, tp_p, tp_d = hint
        key = ("d", x, y, tp_p, tp_d)
        self.hint = None
        if key in self.seen:
            found = self.seen[key]
        else:
            if key not in self._ahead:
                with point(f"{x}P{y}D (TP {tp_p}/{tp_d}) at {self.rate:g} req/s, judged ahead"):
                    self._ahead[key] = self._evaluate(key, _split_sets(x, y, tp_p, tp_d), None, 1,
                                                      Layout(x, y, tp_p, tp_d, x * tp_p + y * tp_d, False))
            found = self._ahead[key][0]
        return found if found.met else None

    def _runs(self, key, sets: list[str], label: str | None, units: int, start_early: bool = True) -> tuple:
        """The verdict of a layout's runs, every seed (:func:`sim.planning.probe.judge_seeds`),
        before rule 1: ``(scenario, label, saturation key, verdict)``. ``start_early``: start the
        layout's burst in the pool ahead of need (not when a smaller layout may make it needless)."""
        from sim.planning.probe import judge_seeds
        from sim.scenario.schema import load_scenario

        scn = load_scenario(self.scn, [f"workload.arrival.rate={self.rate!r}", *sets])
        if label is None:
            label = scn.disaggregation.name
        # a topology saturates as a whole (its own burst); colocated replicas as one replica of
        # the policy at that TP size (one burst shared by every replica count)
        sat_key = key if key[0] == "d" else ("c", label, key[3])

        def start_burst(_k: int = 0) -> None:
            if self.pool is not None and sat_key not in self.saturation and sat_key not in self._bursts:
                self._bursts[sat_key] = self.pool.apply_async(_burst_in_worker, (scn, label))

        # one seed: the burst starts beside the runs; several: once the first seed meets (a layout
        # whose first seed fails never needs its burst, and the other seeds' runs still overlap it)
        early = start_burst if start_early else None
        if self.seeds <= 1 and early is not None:
            early()
        v = judge_seeds(scn, label, [], self.rate / units, None, self.seeds,
                        on_met=early if self.seeds > 1 else None)
        return scn, label, sat_key, v

    def _saturated(self, sat_key: tuple, scn, label: str) -> float | None:
        from sim.planning.probe import saturated_rate

        if sat_key not in self.saturation:
            started = self._bursts.pop(sat_key, None)
            if started is not None:
                with point(f"{label} saturation burst"):
                    probe("waiting for the burst started beside the runs")
                    self.saturation[sat_key] = started.get()
            else:
                self.saturation[sat_key], _ = saturated_rate(scn, label)
            self.runs += 1
        return self.saturation[sat_key]


def _split_sets(x: int, y: int, tp_p: int, tp_d: int) -> list[str]:
    return [f"disaggregation.prefill.replicas={x}", f"disaggregation.decode.replicas={y}",
            f"disaggregation.prefill.hardware.tensor_parallel={tp_p}",
            f"disaggregation.decode.hardware.tensor_parallel={tp_d}"]


def _burst_in_worker(scn, label: str) -> float | None:
    """A saturation burst in a worker process (:meth:`_Verdicts._judge` starts it ahead of need)."""
    from sim.planning.probe import saturated_rate

    silence()
    return saturated_rate(scn, label)[0]


def _same_gpus_beside(scn, rate: float, pool, seeds: int, label: str, tps: list[int],
                      best: Layout | None) -> _Verdicts | None:
    """The colocated layout on the disaggregated plan's GPUs (:func:`compare_colocated`), judged
    here while a worker searches the policy's cheapest one (for :meth:`_Verdicts.take_side`)."""
    if best is None or best.gpus // min(tps) < 1:
        return None
    side = _Verdicts(scn, rate, pool, seeds)
    side.colocated(label, best.gpus // min(tps), min(tps))
    return side


def _cheapest_in_worker(scn, rate: float, label: str, tps: list[int], max_replicas: int, seeds: int) -> tuple:
    """One colocated policy's cheapest-layout search in a worker process: what it judged, for
    :meth:`_Verdicts.merge`."""
    silence()
    v = _Verdicts(scn, rate, seeds=seeds)
    cheapest_colocated(v, label, tps, max_replicas)
    return v.seen, v.order, v.saturation, v.runs


@contextlib.contextmanager
def _worker_pool(jobs: int):
    """``jobs`` forked workers (none for 1), terminated on the way out: a burst started ahead of
    need and never needed is not waited for."""
    if jobs <= 1:
        yield None
        return
    from sim.planning.sweep import _pool_context

    pool = _pool_context().Pool(jobs)
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


def search_split(v: _Verdicts, tp_p: int, tp_d: int, max_instances: int) -> Layout | None:
    """The fewest-GPU xPyD layout at these TP sizes (module docstring, steps 1-3)."""
    n = 1
    while True:
        # if nPnD's runs meet, the bisection of x asks for 1PnD first: it is judged then, and if it
        # meets nPnD needs no burst of its own (_Verdicts._implied); the order and verdicts are the
        # search's either way
        v.hint = (1, n, tp_p, tp_d) if n > 1 else None
        met = v.disaggregated(n, n, tp_p, tp_d).met
        v.hint = None
        if met:
            break
        if n >= max_instances:
            return None
        n = min(2 * n, max_instances)
    x0 = smallest(lambda x: v.disaggregated(x, n, tp_p, tp_d).met, n)
    y0 = smallest(lambda y: v.disaggregated(x0, y, tp_p, tp_d).met, n)
    best = v.disaggregated(x0, y0, tp_p, tp_d)
    y_prev = y0
    for x in range(x0 + 1, max_instances + 1):
        if x * tp_p + tp_d >= best.gpus or y_prev <= 1:
            break
        y = smallest(lambda y, x=x: v.disaggregated(x, y, tp_p, tp_d).met, y_prev - 1)
        if y is None:
            continue
        y_prev = y
        cand = v.disaggregated(x, y, tp_p, tp_d)
        if cand.gpus < best.gpus:
            best = cand
    return best


DEFAULT_JOBS = 2


def plan_disaggregated(scenario, target_rate: float, overrides: Iterable[str] = (),
                       tp_choices: Iterable[int] | None = None, max_instances: int = DEFAULT_MAX_INSTANCES,
                       policies: Iterable[str] | None = None, jobs: int = DEFAULT_JOBS,
                       reporter=None, seeds: int = 1) -> DisaggPlan:
    """The plan (module docstring). ``tp_choices``: TP sizes tried for each pool and for the
    colocated layouts (default: the pools' own and the scenario's ``hardware.tensor_parallel``).
    ``jobs``: worker processes beside this one (1: everything here, one run at a time).
    ``seeds``: workload seeds judged for every layout, each of which must meet (module docstring).
    ``reporter``: a ``sim.planning.progress.Reporter`` (and context manager) to show the probes;
    it starts after the workers are forked."""
    from sim.planning.capacity import check_seeds, labels_of, require_rate, require_slo
    from sim.scenario.schema import load_scenario

    if not target_rate > 0:
        raise CbsimError(f"--target-rate must be a positive number of requests per second, got {target_rate}")
    if max_instances < 1:
        raise CbsimError(f"--max-replicas must be at least 1, got {max_instances}")
    scn = load_scenario(scenario, list(overrides))
    if scn.disaggregation is None:
        raise CbsimError("planning a disaggregated layout needs a disaggregation section in the scenario "
                         "(see scenarios/disaggregation.yaml), or --set 'disaggregation={}'")
    require_slo(scn, "plan")
    require_rate(scn, "plan")
    check_seeds(seeds)
    dis = scn.disaggregation
    if tp_choices is None:
        own = [(getattr(dis, p).hardware or scn.hardware).tensor_parallel for p in ("prefill", "decode")]
        pairs = [tuple(own)]
        colocated_tps = [scn.hardware.tensor_parallel]
    else:
        tps = sorted(set(int(t) for t in tp_choices))
        if not tps or tps[0] < 1:
            raise CbsimError(f"--tp takes tensor-parallel sizes of at least 1, got {tps}")
        pairs = [(a, b) for a in tps for b in tps]
        colocated_tps = tps
    if jobs < 1:
        raise CbsimError(f"--workers must be at least 1, got {jobs}")
    labels = labels_of(scn, policies)
    rate = float(target_rate)
    with _worker_pool(jobs) as pool, (reporter or contextlib.nullcontext()), reporting(reporter):
        v = _Verdicts(scn, rate, pool, seeds)
        searches = {label: pool.apply_async(_cheapest_in_worker, (scn, rate, label, colocated_tps, max_instances,
                                                                  seeds))
                    for label in labels} if pool is not None else {}
        best = None
        for tp_p, tp_d in pairs:
            found = search_split(v, tp_p, tp_d, max_instances)
            if found is not None and (best is None or (found.gpus, found.prefill_tp + found.decode_tp)
                                      < (best.gpus, best.prefill_tp + best.decode_tp)):
                best = found
        # while a worker searches a policy's cheapest colocated layout, this process judges its
        # layout on the plan's GPUs (judged last either way), then takes in the worker's search
        side = {label: _same_gpus_beside(scn, rate, pool, seeds, label, colocated_tps, best) for label in searches}
        colocated = {}
        for label in labels:
            if label in searches:
                with point(f"{label} colocated: its cheapest layout, searched beside"):
                    probe("waiting for the search")
                    v.merge(searches[label].get())
                v.take_side(side[label])
            colocated[label] = compare_colocated(v, label, colocated_tps, best, max_instances, scn.slo)
    per_hour, per_million = costs(best.gpus if best else None, target_rate, scn.cost_per_gpu_hour)
    return DisaggPlan(label=dis.name, target_rate_rps=float(target_rate), best=best, max_instances=max_instances,
                      cost_per_gpu_hour=scn.cost_per_gpu_hour, cost_per_hour=per_hour,
                      cost_per_million_requests=per_million, runs=v.runs, probes=list(v.order),
                      colocated=colocated, stable=all(layout.stable for layout in v.order), seeds=seeds)


def compare_colocated(v: _Verdicts, label: str, tps: list[int], best: Layout | None, max_replicas: int,
                      slo) -> dict:
    """One colocated policy: its cheapest layout meeting the SLO (any of ``tps``; ``replicas``
    None when none up to ``max_replicas`` does), and its run on the disaggregated plan's GPUs."""
    cheapest = cheapest_colocated(v, label, tps, max_replicas)
    out = {"replicas": cheapest.prefill if cheapest else None,
           "tensor_parallel": cheapest.prefill_tp if cheapest else None,
           "gpus": cheapest.gpus if cheapest else None,
           "p99": cheapest.p99 if cheapest else None,
           "spread": cheapest.spread if cheapest else None,
           "max_replicas": max_replicas, "same_gpus": None}
    price, rate = None, v.rate
    price = v.scn.cost_per_gpu_hour
    out["cost_per_hour"], out["cost_per_million_requests"] = costs(out["gpus"], rate, price)
    if best is not None:
        tp = min(tps)
        n = best.gpus // tp
        if n >= 1:
            same = v.colocated(label, n, tp)
            out["same_gpus"] = {"replicas": n, "tensor_parallel": tp, "gpus": same.gpus, "met": same.met,
                                "p99": same.p99, "violations": {} if same.met else violations(same.p99, slo),
                                "saturated": same.saturated, "saturated_rps": same.saturated_rps,
                                "spread": same.spread}
    return out


def cheapest_colocated(v: _Verdicts, label: str, tps: list[int], max_replicas: int) -> Layout | None:
    """The fewest-GPU colocated layout of one policy meeting the SLO (any of ``tps``), or None."""
    cheapest = None
    for tp in tps:
        n = smallest(lambda n, tp=tp: v.colocated(label, n, tp).met, max_replicas)
        if n is not None:
            layout = v.colocated(label, n, tp)
            if cheapest is None or layout.gpus < cheapest.gpus:
                cheapest = layout
    return cheapest


def violations(p99: dict, slo) -> dict:
    """Each bounded metric whose SLO percentile exceeds its bound: ``{metric: [value, bound]}``
    (a NaN percentile, a backlog, counts as a violation)."""
    out = {}
    for m in SLO_METRICS:
        bound = getattr(slo, m)
        value = p99.get(m)
        if bound is not None and not (value is not None and value <= bound):
            out[m] = [value, bound]
    return out
