"""Prefix reuse at a glance: how much of the prompts the engine computed, and how much its cache served.

Why: the engine comparison (vLLM V1, SGLang, TGI on shared system prompts) turns on one figure,
the share of prompt tokens an engine computes itself; it used to live only in ``steps.parquet``.
Two figures, in ``summary.json``'s ``prefix_reuse`` block and in the ``cbsim run`` table:

- ``computed_share``: prefill tokens computed / prompt tokens of the admitted requests. With no
  preemption it is 1 − ``hit_rate``; a recompute preemption adds the tokens computed again (so it
  may pass 1 on a pool too small for its load);
- ``hit_rate``: prompt tokens the prefix cache served at each request's first admission / prompt
  tokens of the admitted requests: vLLM's ``prefix_cache_hits / prefix_cache_queries``
  (``vllm/v1/core/kv_cache_manager.py``, ``PrefixCacheStats``) counted once per request, SGLang's
  ``cached_tokens``, TGI's prefix-cache hits (``backends/v3/src/radix.rs``).

Requests never admitted (rejected, or still waiting at the end) are left out of the denominator:
the engine never looked their prompts up.
"""

from __future__ import annotations

import pandas as pd


def prefix_reuse(requests: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """The ``prefix_reuse`` block of a policy's summary (``hit_tokens`` and ``hit_rate`` null for a
    steps frame written before the ``prefix_hit_tokens`` column existed)."""
    admitted = requests["admitted_s"].notna() if "admitted_s" in requests else pd.Series(True, index=requests.index)
    prompt = int(requests.loc[admitted, "prompt_tokens"].sum()) if len(requests) else 0
    prefill = int(steps["prefill_tokens"].sum()) if len(steps) else 0
    hits = int(steps["prefix_hit_tokens"].sum()) if "prefix_hit_tokens" in steps else None
    return {
        "prompt_tokens": prompt,
        "prefill_tokens": prefill,
        "hit_tokens": hits,
        "computed_share": prefill / prompt if prompt else None,
        "hit_rate": hits / prompt if prompt and hits is not None else None,
    }
