"""The summary's ``kv_tiers`` section: what KV offloading did in a run (policies.kv.tiers).

Per tier (summed over replicas): tokens whose KV was loaded from it instead of recomputed
(``hit_tokens``: the recomputation it saved), bytes written into it (write-through stores and
demotions from the tier above) and read back to the GPU, blocks held at the end. Per request
(``requests.parquet`` columns ``tier_hit_tokens``, ``kv_load_s``): the load time of the requests
that loaded, mean and p50 / p99; and, when the workload has sessions, the TTFT p50 of returning
turns (turn >= 1), the figure offloading exists to change.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def tier_store_of(policy):
    """A policy's tiers below the GPU, or None: vLLM V1's :class:`policies.kv.tiers.TierStore`
    (``policy.kv.tiers``) or SGLang's HiCache host tier (``policy.tier_store``)."""
    store = getattr(getattr(policy, "kv", None), "tiers", None)
    return store if store is not None else getattr(policy, "tier_store", None)


def kv_tiers_report(stores, block_size: int, requests: pd.DataFrame) -> dict | None:
    """``stores``: each replica's :func:`tier_store_of` (None when offloading is off)."""
    stores = [s for s in stores if s is not None]
    if not stores:
        return None
    tiers: dict = {}
    for s in stores:
        for name, row in s.report(block_size).items():
            acc = tiers.setdefault(name, dict.fromkeys(row, 0))
            for k, v in row.items():
                acc[k] += v
    out: dict = {"tiers": tiers, "recomputed_tokens_saved": int(sum(t["hit_tokens"] for t in tiers.values()))}
    loads = requests["kv_load_s"].to_numpy() if "kv_load_s" in requests else np.zeros(0)
    loaded = loads[loads > 0]
    out["requests_loaded"] = int(loaded.size)
    out["load_s_mean"] = float(loaded.mean()) if loaded.size else 0.0
    out["load_s_p50"] = float(np.percentile(loaded, 50)) if loaded.size else 0.0
    out["load_s_p99"] = float(np.percentile(loaded, 99)) if loaded.size else 0.0
    return out


def returning_turn_ttft(requests: pd.DataFrame) -> dict | None:
    """TTFT p50 / mean of sessions' first and returning turns (None without sessions)."""
    if "turn" not in requests or not (requests["turn"] >= 0).any():
        return None
    done = requests.loc[requests["state"] == "finished", ["turn", "ttft_s"]]
    first, later = done[done["turn"] == 0]["ttft_s"], done[done["turn"] >= 1]["ttft_s"]

    def stats(x):
        return {
            "count": int(x.size),
            "ttft_p50_s": float(x.median()) if x.size else None,
            "ttft_mean_s": float(x.mean()) if x.size else None,
        }

    return {"first_turn": stats(first), "returning_turns": stats(later)}
