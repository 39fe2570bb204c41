"""Capacity of a closed loop: the highest client concurrency at which a policy meets the SLO in
steady state, and the replicas a fleet needs for a target concurrency.

Why a search of its own: with closed-loop clients (``workload.arrival.process: closed``) the load
is a number of clients, not a rate, and it regulates itself: a slower server slows its clients'
sends, so no concurrency is "above saturation" in the open-loop sense (the queue cannot grow past
the clients), and the rate search of :mod:`sim.planning.capacity` has nothing to vary. What grows
with the concurrency is the batch and then, past the engine's ``max_num_seqs``, the queue: TTFT
(and E2E) rise with every extra client while TPOT levels off. So:

1. each probe is :func:`sim.planning.probe.judge` at ``workload.arrival.concurrency = N`` (the
   steady window, probe sizes doubling until two agree), with ``workload.num_requests`` at least
   ``REQUESTS_PER_CLIENT × N`` so that every client sends many requests after the warm-up;
2. bracket from the scenario's concurrency: double while it meets, halve while it violates (down
   to 1, where a violation means no concurrency meets);
3. bisect over integers until ``hi − lo ≤ max(1, tolerance × lo)``.

Past ``CEILING_FACTOR`` × the most requests the deployment runs at once (``max_num_seqs`` ×
replicas) more clients only wait in the queue; an SLO met there (one with no TTFT or E2E bound) is
met at any concurrency, which the search says instead of doubling forever.
"""

from __future__ import annotations

from sim.errors import CbsimError

REQUESTS_PER_CLIENT = 8
CEILING_FACTOR = 8


def probe_overrides(scn, concurrency: int, extra=()) -> list[str]:
    """A probe at ``concurrency`` clients, each sending at least ``REQUESTS_PER_CLIENT`` requests
    (or sessions, for a workload of sessions)."""
    from sim.planning.probe import size_key

    key, n = size_key(scn)
    n = max(n, REQUESTS_PER_CLIENT * concurrency)
    return [*extra, f"workload.arrival.concurrency={concurrency}", f"{key}={n}"]


def batch_slots(scn, label: str) -> int:
    """The most requests the deployment runs at once: max_num_seqs × replicas (or of the larger
    pool of a disaggregated label), as :func:`sim.planning.probe.burst_size` counts them."""
    from sim.planning.probe import is_disaggregated
    from sim.runner import policy_knobs

    if is_disaggregated(scn, label):
        from sim.disaggregation.run import resolve_pool

        return max(p.instances * p.limits.max_num_seqs
                   for p in (resolve_pool(scn, name, policy_knobs) for name in ("prefill", "decode")))
    from sim.scenario.resolved import resolve

    entry = next(e for e in scn.policies if (e.label or e.name) == label)
    return resolve(scn).limits_for(entry.name, policy_knobs(scn, entry)).max_num_seqs * scn.replicas.count


def search_concurrency(scn, label: str, tolerance: float, seeds: int = 1) -> dict:
    """The highest concurrency meeting the SLO (module docstring), as the fields of a
    :class:`sim.planning.capacity.Capacity` (which builds it: no import circle) whose
    ``concurrency`` is set and whose rates are those of the run there."""
    from sim.planning.probe import is_disaggregated, judge_seeds

    verdicts: dict[int, object] = {}
    order: list[int] = []

    def met(n: int) -> bool:
        if n not in verdicts:
            verdicts[n] = judge_seeds(scn, label, probe_overrides(scn, n), float(n), None, seeds)
            order.append(n)
        return verdicts[n].met

    ceiling = CEILING_FACTOR * batch_slots(scn, label)
    start = min(int(scn.workload.arrival.concurrency), ceiling)
    if met(start):
        lo, hi = start, None
        while hi is None:
            if lo >= ceiling:
                raise CbsimError(f"{label}: the SLO is met at every concurrency up to {lo} clients, "
                                 f"{CEILING_FACTOR} × the {ceiling // CEILING_FACTOR} requests it runs at once: "
                                 f"beyond that more clients only wait in its queue; bound slo.ttft_s or slo.e2e_s "
                                 f"to find where they wait too long")
            nxt = min(2 * lo, ceiling)
            if met(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        hi, lo = start, None
        while lo is None:
            if hi == 1:
                raise CbsimError(f"{label}: the SLO is not met even by one client "
                                 f"({describe(verdicts[1])}): a single request cannot meet it on this "
                                 f"hardware; loosen the SLO or use faster hardware")
            nxt = max(1, hi // 2)
            if met(nxt):
                lo = nxt
            else:
                hi = nxt
    while hi - lo > max(1, int(tolerance * lo)):
        mid = (lo + hi) // 2
        if met(mid):
            lo = mid
        else:
            hi = mid
    best = verdicts[lo]
    s = best.summary
    steady = s.get("steady") or {}
    unstable = [n for n in order if not verdicts[n].stable]
    return dict(
        policy=label,
        rate_rps=steady.get("achieved_rps") or s["throughput_rps"],
        goodput_rps=steady["goodput_rps"] if steady.get("goodput_rps") is not None else s["goodput_rps"],
        throughput_rps=s["throughput_rps"],
        offered_rps=steady.get("offered_rps"),
        achieved_rps=steady.get("achieved_rps"),
        saturated_rps=None,
        violating_rate_rps=float("nan"),
        tolerance=tolerance,
        runs=sum(v.runs for v in verdicts.values()),
        monotone=all(verdicts[n].met for n in order if n < lo),
        num_requests=int(scn.workload.num_requests or s["requests_total"]),
        probe_requests=s["requests_total"],
        stable=not unstable,
        unstable_rates=[float(n) for n in unstable],
        probes=[(float(n), verdicts[n].met) for n in order],
        disaggregated=is_disaggregated(scn, label),
        gpus=s.get("gpus", scn.replicas.count * scn.hardware.count),
        summary=s,
        concurrency=lo,
        violating_concurrency=hi,
        seeds=seeds,
        spread=best.spread,
    )


def describe(verdict) -> str:
    s = verdict.summary.get("steady") or verdict.summary
    bits = [f"p99 {m.removesuffix('_s').upper()} {s[m]['p99']:.3g} s" for m in ("ttft_s", "tpot_s", "e2e_s")
            if s.get(m) and s[m]["p99"] is not None]
    return ", ".join(bits) or "no finished request"
