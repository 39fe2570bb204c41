"""A disaggregated run's requests frame, steps frame and summary.

One row per request, as a client sees it: arrival, its first token, the decode instance's tokens, the
end. The first token reaches the client from the decode side, after the KV cache has arrived
(vLLM's P/D proxy sends the prefill instance ``max_tokens = 1`` and streams the decode instance's
answer; SGLang's PD router and Dynamo do the same): TTFT = prefill queue + prefill + transfer
(room on the decode instance, the link, the wire) + decode admission + the first decode step. The
prefill instance's token travels with the KV and reaches the client together with that step's token.
``prefill_ttft_s`` keeps the prefill instance's own first token (arrival to it), for the hand-off's
share of TTFT. A request that ends on the prefill instance (one output token) has its TTFT there. The columns are the
colocated run's (``sim.metrics.recorder.REQUEST_COLUMNS``) with ``replica`` the instance that held
the request last (its decode instance once handed off, numbered after the prefill instances),
plus ``prefill_replica`` and ``transfer_s`` (first token to KV landed on the decode instance:
waiting for room there, for the link, and the wire time; NaN when the request never got that far).
Steps carry a ``pool`` column (``prefill`` | ``decode``).

The summary has every key of a colocated policy's (:func:`sim.metrics.summary.summarize` over both
pools together: ``utilization`` is then the mean over all their GPUs), and:

* ``gpus``, ``goodput_rps_per_gpu``;
* the hand-off, each ``{mean, p50, p90, p99}`` over the requests that were handed off:
  ``transfer_s`` (as the column), ``transfer_queue_s`` (first token to the start of the wire time:
  room on the decode instance, then the link), ``transfer_wire_s`` (latency + bytes / bandwidth),
  ``decode_queue_s`` (KV landed to admitted by the decode policy), ``handoff_gap_s`` (the prefill
  instance's first token to the client's: what the hand-off adds to TTFT);
* decode-side token timing: ``decode_itl_s`` (every gap after the second token) and
  ``decode_tpot_s`` ((last token − second token) / (output − 2)); ``ttft_s``, ``itl_s`` and
  ``tpot_s`` keep the client's definitions, so SLOs compare with colocated runs as they are;
* ``transfers`` (count), ``transfer_bytes`` (total);
* ``pools``: per pool ``{instances, gpus_per_instance, gpus, gpu, tensor_parallel, policy,
  kv_blocks_per_instance, steps, busy, utilization, kv_waste, mean_batch, mean_running,
  max_running, preemptions}`` (``busy``: share of the pool's instance-time spent in steps).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sim.metrics.kv_tiers import kv_tiers_report, returning_turn_ttft, tier_store_of
from sim.metrics.recorder import KV_REQUEST_COLUMNS, REQUEST_COLUMNS
from sim.metrics.summary import stats, summarize

NAN = math.nan
POOL_KEYS = ("steps", "utilization", "kv_waste", "mean_batch", "mean_running", "max_running")


def request_rows(top) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """The requests frame of a finished :class:`DisaggregatedSimulation`, and each request's token
    times (the ``token_times_s`` column, also kept for the ITL figures)."""
    n_prefill = len(top.prefill)
    cols: dict[str, list] = {c: [] for c in REQUEST_COLUMNS if c != "token_times_s"}
    for c in KV_REQUEST_COLUMNS:
        cols[c] = []
    cols["prefill_replica"] = []
    cols["transfer_s"] = []
    cols["prefill_ttft_s"] = []
    times: list[np.ndarray] = []
    for h in top.handoffs:
        p, d, spec = h.prefill, h.decode, h.spec
        landed = h.landed_s == h.landed_s
        first = p.first_token_s
        prefill_first = first
        if landed:
            state, reason = d.state, d.reason
            if state == "rejected":
                reason = f"decode instance: {reason}"
            finish, generated = d.finish_s, d.generated
            decoded = np.asarray(d.token_times, dtype=float)
            # the client's first token leaves with the decode instance's first step (module doc)
            first = float(decoded[0]) if decoded.size else NAN
            tt = np.concatenate(([first], decoded)) if decoded.size else np.zeros(0)
            replica = n_prefill + h.decode_replica
        elif h.handed_off:  # prefilled, KV still in transfer when time stopped: the client saw nothing
            state, reason = "unfinished", top.horizon_reason
            finish, generated, tt, first = NAN, 1, np.zeros(0), NAN
            replica = n_prefill + h.decode_replica
        else:
            state, reason = p.state, p.reason
            if state == "rejected":
                reason = f"prefill instance: {reason}"
            finish, generated = p.finish_s, p.generated
            tt = np.asarray(p.token_times, dtype=float)
            replica = max(h.prefill_replica, 0)
        arrival = spec.arrival_s
        done = state == "finished"
        cols["id"].append(spec.id)
        cols["replica"].append(replica)
        cols["arrival_s"].append(arrival)
        cols["prompt_tokens"].append(spec.prompt_tokens)
        cols["output_tokens"].append(spec.output_tokens)
        cols["max_tokens"].append(spec.max_tokens)
        cols["generated"].append(generated)
        cols["admitted_s"].append(p.admitted_s)
        cols["first_token_s"].append(first)
        cols["finish_s"].append(finish)
        cols["ttft_s"].append(first - arrival)
        cols["tpot_s"].append((finish - first) / (generated - 1) if done and generated > 1 else NAN)
        cols["e2e_s"].append(finish - arrival if done else NAN)
        cols["state"].append(state)
        cols["reason"].append(reason)
        cols["refused"].append(bool(state == "rejected" and (d.refused if landed else p.refused)))
        cols["preemptions"].append(p.preemptions + (d.preemptions if landed else 0))
        cols["swaps"].append(p.swaps + (d.swaps if landed else 0))
        cols["client"].append(spec.client)
        cols["session"].append(spec.session)
        cols["turn"].append(spec.turn)
        cols["prefix_hit_tokens"].append(p.prefix_hit_tokens)  # the prefill pool's prefix cache
        cols["tier_hit_tokens"].append(p.tier_hit_tokens)
        cols["kv_load_s"].append(p.kv_load_s)
        cols["prefill_replica"].append(h.prefill_replica)
        cols["transfer_s"].append(h.landed_s - h.prefilled_s)
        cols["prefill_ttft_s"].append(prefill_first - arrival)
        times.append(tt)
    frame = pd.DataFrame(cols)
    for c in ("replica", "prompt_tokens", "output_tokens", "max_tokens", "generated", "preemptions", "swaps",
              "client", "session", "turn", "prefill_replica", "prefix_hit_tokens", "tier_hit_tokens"):
        frame[c] = frame[c].astype(np.int64)
    for c in ("arrival_s", "admitted_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "transfer_s",
              "kv_load_s", "prefill_ttft_s"):
        frame[c] = frame[c].astype(np.float64)
    tt_col = np.empty(len(times), dtype=object)
    for i, t in enumerate(times):
        tt_col[i] = t
    frame.insert(list(frame.columns).index("swaps") + 1, "token_times_s", tt_col)
    return frame, times


def steps_frame(top) -> pd.DataFrame:
    steps = top.recorder.steps_frame()
    steps.insert(1, "pool", np.where(steps["replica"].to_numpy() < len(top.prefill), "prefill", "decode"))
    return steps


def token_timing(requests: pd.DataFrame, times: list[np.ndarray]) -> dict:
    """ITL over every gap (the client's), the decode side's ITL and TPOT without the first gap, and
    the hand-off's share of TTFT (client's first token − the prefill instance's)."""
    done = (requests["state"] == "finished").to_numpy()
    handed = done & requests["transfer_s"].notna().to_numpy()
    handoff = (requests["ttft_s"] - requests["prefill_ttft_s"]).to_numpy()[handed]
    all_gaps, decode_gaps, decode_tpot = [], [], []
    for ok, t in zip(done, times):
        if not ok or len(t) < 2:
            continue
        g = np.diff(t)
        all_gaps.append(g)
        if len(g) > 1:
            decode_gaps.append(g[1:])
            decode_tpot.append((t[-1] - t[1]) / (len(t) - 2))
    def cat(parts):
        return np.concatenate(parts) if parts else np.zeros(0)

    return {"itl_s": stats(cat(all_gaps)), "decode_itl_s": stats(cat(decode_gaps)),
            "handoff_gap_s": stats(np.asarray(handoff)), "decode_tpot_s": stats(np.asarray(decode_tpot))}


def handoff_stats(top) -> dict:
    hs = [h for h in top.handoffs if h.landed_s == h.landed_s]

    def arr(f):
        return np.asarray([f(h) for h in hs], dtype=float)

    queue_s = arr(lambda h: h.transfer_start_s - h.prefilled_s)
    decode_queue = arr(lambda h: h.decode.admitted_s - h.landed_s)
    return {
        "transfers": len(hs),
        "transfer_bytes": int(sum(h.bytes for h in hs)),
        "transfer_s": stats(arr(lambda h: h.landed_s - h.prefilled_s)),
        "transfer_queue_s": stats(queue_s),
        "transfer_wire_s": stats(arr(lambda h: h.landed_s - h.transfer_start_s)),
        "decode_queue_s": stats(decode_queue),
    }


def pool_summary(requests: pd.DataFrame, steps: pd.DataFrame, pool, slo) -> dict:
    """One pool's figures (``pool``: :class:`sim.disaggregation.run.PoolDeployment`)."""
    n = pool.instances
    s = summarize(requests, steps, max_slots=pool.max_slots * n,
                  token_budget=pool.token_budget * n if pool.token_budget else None,
                  kv_blocks_total=pool.kv_blocks * n, peak_flops=pool.dep.gpu.peak_flops * n,
                  hbm_bandwidth=pool.dep.gpu.hbm_bandwidth * n, slo=slo, num_replicas=n,
                  itl={"mean": None, "p50": None, "p90": None, "p99": None})
    out = {"instances": n, "gpus_per_instance": pool.gpus_per_instance, "gpus": pool.gpus,
           "gpu": pool.dep.gpu.name, "tensor_parallel": pool.dep.tensor_parallel, "policy": pool.entry.name,
           "kv_blocks_per_instance": pool.kv_blocks}
    out.update({k: s[k] for k in POOL_KEYS})
    span = _span(requests)
    out["busy"] = float(steps["duration_s"].sum()) / (n * span) if span > 0 and len(steps) else None
    return out


def _span(requests: pd.DataFrame) -> float:
    fin = requests[requests["state"] == "finished"]
    return float(fin["finish_s"].max() - requests["arrival_s"].min()) if len(fin) else 0.0


def summarize_disaggregated(top, requests: pd.DataFrame, steps: pd.DataFrame, times, prefill, decode,
                            slo) -> dict:
    """The summary of a disaggregated run (module docstring)."""
    pools = (prefill, decode)
    timing = token_timing(requests, times)
    summary = summarize(
        requests, steps,
        max_slots=sum(p.max_slots * p.instances for p in pools),
        token_budget=(sum(p.token_budget * p.instances for p in pools)
                      if all(p.token_budget for p in pools) else None),
        kv_blocks_total=sum(p.kv_blocks * p.instances for p in pools),
        peak_flops=sum(p.dep.gpu.peak_flops * p.instances for p in pools),
        hbm_bandwidth=sum(p.dep.gpu.hbm_bandwidth * p.instances for p in pools),
        slo=slo, num_replicas=sum(p.instances for p in pools), itl=timing["itl_s"],
        max_model_len=min(p.limits.max_model_len for p in pools),
    )
    gpus = sum(p.gpus for p in pools)
    summary["gpus"] = gpus
    summary["goodput_rps_per_gpu"] = summary["goodput_rps"] / gpus
    summary.update(handoff_stats(top))
    summary["handoff_gap_s"] = timing["handoff_gap_s"]
    summary["decode_itl_s"] = timing["decode_itl_s"]
    summary["decode_tpot_s"] = timing["decode_tpot_s"]
    pool_col = steps["pool"]
    summary["pools"] = {
        "prefill": pool_summary(requests, steps[pool_col == "prefill"], prefill, slo),
        "decode": pool_summary(requests, steps[pool_col == "decode"], decode, slo),
    }
    # KV offloading and sessions: the prefill pool's tiers (the decode pool has none)
    summary["kv_tiers"] = kv_tiers_report([tier_store_of(r.policy) for r in top.prefill],
                                          prefill.limits.block_size, requests)
    summary["sessions"] = returning_turn_ttft(requests)
    summary["pools"]["prefill"]["preemptions"] = int(sum(h.prefill.preemptions for h in top.handoffs))
    summary["pools"]["decode"]["preemptions"] = int(sum(h.decode.preemptions for h in top.handoffs
                                                        if h.landed_s == h.landed_s))
    return summary
