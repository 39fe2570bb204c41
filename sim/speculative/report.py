"""The run's acceptance figures, for ``summary.json`` and the run table.

Definitions (as vLLM's spec-decode metrics, ``vllm/v1/spec_decode/metrics.py``): the *acceptance
rate* is accepted drafts over drafts verified; the *mean acceptance length* is tokens a request
gains per verification step, ``1 + accepted / verifications`` (the bonus token included, which
is how the EAGLE papers report it); *tokens per step* is what a request actually emitted
per verification step (its tokens after the first, over its verifications), which stops cut
below the mean acceptance length when a burst runs past a request's last token.
"""

from __future__ import annotations

import pandas as pd


def speculative_report(cfg, requests: pd.DataFrame, steps: pd.DataFrame) -> dict | None:
    """The ``speculative`` section of a summary; None when the entry does not speculate."""
    if cfg is None:
        return None
    verifications = int(requests["spec_steps"].sum()) if "spec_steps" in requests else 0
    proposed = int(requests["spec_proposed"].sum()) if "spec_proposed" in requests else 0
    accepted = int(requests["spec_accepted"].sum()) if "spec_accepted" in requests else 0
    after_first = int((requests["generated"] - 1).clip(lower=0).sum()) if len(requests) else 0
    return {
        "method": cfg.method,
        "num_speculative_tokens": cfg.num_speculative_tokens,
        "verifications": verifications,
        "draft_tokens": proposed,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_acceptance_length": 1 + accepted / verifications if verifications else None,
        "tokens_per_step": after_first / verifications if verifications else None,
    }
