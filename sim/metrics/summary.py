"""A run's summary, as `vllm bench serve` defines its metrics (DESIGN.md, "Words").

TTFT = first token − arrival; TPOT = (E2E − TTFT) / (output − 1) for requests with more than one
output token; ITL = every gap between consecutive tokens of a request; E2E = last token − arrival.
Throughput = finished requests / (last finish − first arrival), and ``duration_s`` is that span.
Goodput counts only requests that meet every bounded SLO. Utilizations are time averages weighted
by step duration.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)


def stats(values) -> dict:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    out = {"mean": float(arr.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    return out


def meets_slo_mask(requests: pd.DataFrame, slo) -> pd.Series:
    """Per finished request: is each bounded metric within its bound?"""
    ok = requests["state"] == "finished"
    if slo is None:
        return ok
    if slo.ttft_s is not None:
        ok &= requests["ttft_s"] <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= requests["tpot_s"].fillna(0.0) <= slo.tpot_s
    if slo.e2e_s is not None:
        ok &= requests["e2e_s"] <= slo.e2e_s
    return ok


def run_meets_slo(requests: pd.DataFrame, slo) -> bool | None:
    """A run meets the SLO when the SLO's percentile of each bounded metric is within bound.

    Requests that did not finish count as infinitely late, so an overloaded run that leaves a
    backlog cannot pass; a run that finished nothing does not meet it either. (A percentile that
    falls between two infinite values is NaN, which must count as a violation: hence
    ``not (p <= bound)`` rather than ``p > bound``.)"""
    if slo is None or all(getattr(slo, k) is None for k in ("ttft_s", "tpot_s", "e2e_s")):
        return None
    state = requests["state"]
    unfinished = (state != "finished").to_numpy()
    rejected = (state == "rejected").to_numpy()
    if unfinished.all():
        return False
    for col, bound in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2e_s", slo.e2e_s)):
        if bound is None:
            continue
        vals = requests[col].to_numpy(dtype=float).copy()
        if col == "tpot_s":
            vals[np.isnan(vals) & ~unfinished] = 0.0
        vals[unfinished] = np.inf
        vals = vals[~rejected]
        with np.errstate(invalid="ignore"):  # inf - inf between two unfinished requests
            p = np.percentile(vals, slo.percentile) if vals.size else None
        if p is not None and not p <= bound:
            return False
    return True


def weighted_mean(values: pd.Series, weights: pd.Series) -> float | None:
    w = weights.to_numpy(dtype=float)
    v = values.to_numpy(dtype=float)
    mask = ~np.isnan(v)
    if not mask.any() or w[mask].sum() <= 0:
        return None
    return float(np.average(v[mask], weights=w[mask]))


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, *, max_slots: int,
              token_budget: int | None, kv_blocks_total: int, peak_flops: float,
              hbm_bandwidth: float, slo=None, num_replicas: int = 1, itl: dict | None = None) -> dict:
    """``itl``: the ITL figures (``{"mean", "p50", "p90", "p99"}``) computed elsewhere: the
    runner passes ``sim.metrics.recorder.Recorder.itl_stats()`` (exact, from runs of token times; the only
    source when a large run keeps no ``token_times_s``); None computes them from ``token_times_s``."""
    finished = requests[requests["state"] == "finished"]
    n_fin = len(finished)
    if n_fin:
        span = float(finished["finish_s"].max() - requests["arrival_s"].min())
    else:
        span = 0.0
    throughput = n_fin / span if span > 0 else 0.0
    out_tokens = int(finished["generated"].sum()) if n_fin else 0
    good = int(meets_slo_mask(requests, slo).sum())
    if itl is None:
        gaps = []
        for times in finished["token_times_s"]:
            if len(times) > 1:
                gaps.append(np.diff(np.asarray(times, dtype=float)))
        itl = stats(np.concatenate(gaps) if gaps else np.array([]))

    dur = steps["duration_s"]
    util = {"slots": None, "token_budget": None, "kv": None, "mfu": None, "mbu": None}
    kv_waste = None
    if len(steps):
        # slots in use = sequences computed this step (a finished static member's slot is idle)
        util["slots"] = weighted_mean(steps["num_seqs"] / max_slots, dur) if max_slots else None
        if token_budget:
            util["token_budget"] = weighted_mean(steps["batch_tokens"] / token_budget, dur)
        util["kv"] = weighted_mean(steps["kv_blocks_used"] / kv_blocks_total, dur) if kv_blocks_total else None
        util["mfu"] = weighted_mean(steps["flops"] / (peak_flops * dur), dur) if peak_flops else None
        util["mbu"] = weighted_mean(steps["bytes"] / (hbm_bandwidth * dur), dur) if hbm_bandwidth else None
        reserved = steps["kv_reserved_tokens"].astype(float)
        waste = (reserved - steps["kv_used_tokens"]) / reserved.where(reserved > 0)
        kv_waste = weighted_mean(waste, dur)
    summary = {
        "steps": int(len(steps)),
        "replicas": num_replicas,
        "requests_total": int(len(requests)),
        "requests_finished": n_fin,
        "requests_rejected": int((requests["state"] == "rejected").sum()),
        "requests_unfinished": int((requests["state"] == "unfinished").sum()),
        "duration_s": span,
        "throughput_rps": throughput,
        "output_tps": out_tokens / span if span > 0 else 0.0,
        "total_tps": (int(finished["prompt_tokens"].sum()) + out_tokens) / span if span > 0 else 0.0,
        "goodput_rps": good / span if span > 0 else 0.0,
        "slo_met": run_meets_slo(requests, slo),
        "ttft_s": stats(requests["ttft_s"]),
        "tpot_s": stats(finished["tpot_s"]),
        "itl_s": itl,
        "e2e_s": stats(finished["e2e_s"]),
        "utilization": util,
        "kv_waste": kv_waste,
        "preemptions": int(requests["preemptions"].sum()),
        "swapped_blocks": int(steps["swap_out_blocks"].sum()) if len(steps) else 0,
        "max_running": int(steps["running"].max()) if len(steps) else 0,
        "mean_running": weighted_mean(steps["running"].astype(float), dur) if len(steps) else None,
        "mean_batch": weighted_mean(steps["num_seqs"].astype(float), dur) if len(steps) else None,
    }
    return summary
