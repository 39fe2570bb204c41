"""A run's summary, as `vllm bench serve` defines its metrics (DESIGN.md, "Words").

TTFT = first token − arrival; TPOT = (E2E − TTFT) / (output − 1) for requests with more than one
output token; ITL = every gap between consecutive tokens of a request; E2E = last token − arrival.
Throughput = finished requests / (last finish − first arrival), and ``duration_s`` is that span.
Goodput counts only requests that meet every bounded SLO. Utilizations are time averages weighted
by step duration.

Two utilizations mean the same thing for every policy, unlike ``slots`` (a share of the policy's
*own* slot count: static's batch size, ``max_num_seqs`` for the others, so "60 % of 32" and "1 %
of 1024" cannot be compared): ``batch_vs_memory`` is the mean batch over ``memory_sequences``,
the most sequences this GPU's KV pool holds at once when each takes the workload's mean running
footprint (prompt + half the output) and nothing is reserved ahead; ``kv_written`` is the share of
that pool's token capacity holding a written token (``kv`` counts blocks held, reserved-but-empty
ones included). MFU and MBU are comparable already (busy compute and bandwidth per step).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.metrics.prefix_reuse import prefix_reuse
from sim.metrics.steady import (
    MIN_WINDOW_REQUESTS,
    MIN_WINDOW_TURNOVERS,
    session_scale,
    steady_window,
    turnover_s,
)

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


def refused_mask(requests: pd.DataFrame) -> np.ndarray:
    """Requests rejected for the load at the time (TGI's 429: ``refused``), as opposed to those
    rejected for themselves (a prompt longer than the model takes, a request no empty pool holds).
    A frame without the column (a recorded run) has none."""
    if "refused" not in requests:
        return np.zeros(len(requests), dtype=bool)
    return requests["refused"].to_numpy(dtype=bool) & (requests["state"] == "rejected").to_numpy()


def run_meets_slo(requests: pd.DataFrame, slo) -> bool | None:
    """A run meets the SLO when the SLO's percentile of each bounded metric is within bound.

    Requests that did not finish count as infinitely late, so an overloaded run that leaves a
    backlog cannot pass, and so do requests *refused* for the load (``refused``: HTTP 429, a full
    queue): a client turned away was not served in time, and an engine must not meet an SLO by
    refusing the requests that would have missed it. Only requests rejected for themselves (a
    prompt longer than the model takes) stay out of the percentiles. A run that finished nothing
    does not meet it. (A percentile that falls between two infinite values is NaN, which must
    count as a violation: hence ``not (p <= bound)`` rather than ``p > bound``.)"""
    if slo is None or all(getattr(slo, k) is None for k in ("ttft_s", "tpot_s", "e2e_s")):
        return None
    state = requests["state"]
    unfinished = (state != "finished").to_numpy()
    invalid = (state == "rejected").to_numpy() & ~refused_mask(requests)
    if unfinished.all():
        return False
    for col, bound in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2e_s", slo.e2e_s)):
        if bound is None:
            continue
        vals = requests[col].to_numpy(dtype=float).copy()
        if col == "tpot_s":
            vals[np.isnan(vals) & ~unfinished] = 0.0
        vals[unfinished] = np.inf
        vals = vals[~invalid]
        with np.errstate(invalid="ignore"):  # inf - inf between two unfinished requests
            p = np.percentile(vals, slo.percentile) if vals.size else None
        if p is not None and not p <= bound:
            return False
    return True


def _rows(requests: pd.DataFrame, mask, columns) -> pd.DataFrame:
    """The rows of ``mask``, only the ``columns`` the caller reads (those the frame has): a
    boolean selection copies every column it keeps, which for a million requests is the
    largest allocation of the summary."""
    return requests.loc[mask, [c for c in columns if c in requests.columns]]


_VERDICT_COLUMNS = ("state", "refused", "ttft_s", "tpot_s", "e2e_s")  # meets_slo_mask, run_meets_slo


def steady_summary(requests: pd.DataFrame, slo=None) -> dict:
    """The ``steady`` block of a summary: the window, offered vs achieved rate, and the latency
    figures and SLO verdict of the requests arriving in it (nulls when the window is too short)."""
    window = steady_window(requests)
    arr = requests["arrival_s"]
    inside = _rows(requests, (arr >= window[0]) & (arr < window[1]) if window else np.zeros(len(requests), bool),
                   _VERDICT_COLUMNS)
    turnover = turnover_s(requests)
    too_short = (window is None or len(inside) < MIN_WINDOW_REQUESTS
                 or window[1] - window[0] < MIN_WINDOW_TURNOVERS * turnover
                 or session_scale(requests) > 1.0)  # sessions: their starts span too few lifetimes
    out = {"window_start_s": window[0] if window else None, "window_end_s": window[1] if window else None,
           "requests_in_window": int(len(inside)),
           "turnover_s": turnover, "too_short": too_short,
           "refused": int(refused_mask(inside).sum()),
           "offered_rps": None, "achieved_rps": None, "goodput_rps": None, "slo_met": None,
           "ttft_s": stats([]), "tpot_s": stats([]), "e2e_s": stats([])}
    if too_short:
        return out
    span = window[1] - window[0]
    finish = requests["finish_s"].to_numpy(dtype=float)
    done = int(((finish >= window[0]) & (finish < window[1])).sum())
    finished = inside[inside["state"] == "finished"]
    out.update({
        "offered_rps": len(inside) / span,
        "achieved_rps": done / span,
        "goodput_rps": int(meets_slo_mask(inside, slo).sum()) / span,
        "slo_met": run_meets_slo(inside, slo),
        "ttft_s": stats(inside["ttft_s"]),
        "tpot_s": stats(finished["tpot_s"]),
        "e2e_s": stats(finished["e2e_s"]),
    })
    return out


def weighted_mean(values: pd.Series, weights: pd.Series) -> float | None:
    w = weights.to_numpy(dtype=float)
    v = values.to_numpy(dtype=float)
    mask = ~np.isnan(v)
    if mask.all():  # no value missing: the arrays themselves (a selection copies every step's)
        return float(np.average(v, weights=w)) if len(v) and w.sum() > 0 else None
    if not mask.any() or w[mask].sum() <= 0:
        return None
    return float(np.average(v[mask], weights=w[mask]))


def memory_sequences(requests: pd.DataFrame, kv_tokens: int | None) -> float | None:
    """The most sequences a KV pool of ``kv_tokens`` tokens holds at once, each at the workload's
    mean running footprint: its prompt plus half the tokens it generates (its output, cut at
    ``max_tokens``; a decoding sequence holds half its output on average over its life). It
    depends on the workload and the pool only, not the policy, so a batch measured against it
    compares across policies; a paged policy that fills memory reaches about 100 %."""
    if not kv_tokens or requests.empty:
        return None
    out = np.minimum(requests["output_tokens"].to_numpy(dtype=float), requests["max_tokens"].to_numpy(dtype=float))
    footprint = float(np.mean(requests["prompt_tokens"].to_numpy(dtype=float) + out / 2))
    return kv_tokens / footprint if footprint > 0 else None


def cut_requests(requests: pd.DataFrame, max_model_len: int | None = None) -> dict[str, int]:
    """Finished requests the engine stopped before their own end (``generated < output_tokens``,
    vLLM's finish reason "length"), by why: ``max_model_len`` (prompt + output filled the context,
    whether through the engine's ``max_tokens`` fill-in or the context check) or ``max_tokens``
    (the client's own limit)."""
    fin = _rows(requests, requests["state"] == "finished", ("generated", "output_tokens", "prompt_tokens",
                                                             "max_tokens"))
    gen = fin["generated"].to_numpy()
    short = gen < fin["output_tokens"].to_numpy()
    if max_model_len is not None:
        context = short & (fin["prompt_tokens"].to_numpy() + gen >= max_model_len)
    else:
        context = short & (gen < fin["max_tokens"].to_numpy())
    return {"max_model_len": int(context.sum()), "max_tokens": int((short & ~context).sum())}


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, *, max_slots: int,
              token_budget: int | None, kv_blocks_total: int, peak_flops: float,
              hbm_bandwidth: float, slo=None, num_replicas: int = 1, itl: dict | None = None,
              kv_tokens_per_replica: int | None = None, max_model_len: int | None = None) -> dict:
    """``kv_tokens_per_replica``: one replica's KV pool in tokens (blocks × block size), for
    ``memory_sequences``, ``utilization.batch_vs_memory`` and ``utilization.kv_written`` (null
    without it). ``itl``: the ITL figures (``{"mean", "p50", "p90", "p99"}``) computed elsewhere: the
    runner passes ``sim.metrics.recorder.Recorder.itl_stats()`` (exact, from runs of token times; the only
    source when a large run keeps no ``token_times_s``); None computes them from ``token_times_s``."""
    finished = _rows(requests, requests["state"] == "finished",
                     ("finish_s", "generated", "prompt_tokens", "tpot_s", "e2e_s")
                     + (("token_times_s",) if itl is None else ()))
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
    util = {"slots": None, "token_budget": None, "kv": None, "mfu": None, "mbu": None,
            "batch_vs_memory": None, "kv_written": None}
    kv_waste = None
    mem_seqs = memory_sequences(requests, kv_tokens_per_replica)
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
        if mem_seqs:  # per replica: num_seqs and kv_used_tokens are one replica's, each step
            batch = weighted_mean(steps["num_seqs"].astype(float), dur)
            util["batch_vs_memory"] = batch / mem_seqs if batch is not None else None
            util["kv_written"] = weighted_mean(steps["kv_used_tokens"] / kv_tokens_per_replica, dur)
    summary = {
        "steps": int(len(steps)),
        "replicas": num_replicas,
        "requests_total": int(len(requests)),
        "requests_finished": n_fin,
        "requests_rejected": int((requests["state"] == "rejected").sum()),
        # of those: refused for the load (429: infinitely late in every verdict) and invalid on
        # their own (left out of the verdicts)
        "requests_refused": int(refused_mask(requests).sum()),
        "requests_invalid": int((requests["state"] == "rejected").sum() - refused_mask(requests).sum()),
        "requests_unfinished": int((requests["state"] == "unfinished").sum()),
        "requests_cut": cut_requests(requests, max_model_len),
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
        "recomputed_tokens": int(steps["recomputed_tokens"].sum()) if len(steps) else 0,
        "swapped_blocks": int(steps["swap_out_blocks"].sum()) if len(steps) else 0,
        "max_running": int(steps["running"].max()) if len(steps) else 0,
        "mean_running": weighted_mean(steps["running"].astype(float), dur) if len(steps) else None,
        "mean_batch": weighted_mean(steps["num_seqs"].astype(float), dur) if len(steps) else None,
        "memory_sequences": mem_seqs,
        "steady": steady_summary(requests, slo),
        "prefix_reuse": prefix_reuse(requests, steps),
    }
    return summary
