"""Recomputed tokens: KV a step computes again because a recompute preemption threw it away.

Why it is tracked: a request preempted by *recompute* (vLLM V1's only mode, V0's default) loses its
KV blocks and must prefill its prompt and generated tokens again before it decodes. Those tokens
cost step time like any other, but they are not useful work: counting their FLOPs in MFU would
make a thrashing engine look busy. The engine asks :class:`RecomputeTracker` how many of each
step's tokens are recomputed; their FLOPs are taken out of the step's ``flops`` (so MFU counts
useful tokens only, as it already leaves out static batching's padding), and the step table's
``recomputed_tokens`` column and the summary's ``recomputed_tokens`` count them.

How: when a request is preempted by recompute, it had computed ``c_pre`` tokens: ``prompt +
generated − 1`` once it has emitted a token (everything but the last emitted token is in its
KV), or, preempted mid-prefill, the tokens its prefill chunks had reached (remembered from the
chunks this tracker saw). Afterwards, any of its positions below ``c_pre`` that a step computes
again (tokens ``[context, context + n)`` of its chunk, after any prefix-cache hit) is recomputed.
Swap preemption keeps the KV (copied to the CPU and back), so it recomputes nothing. Only prefill
chunks can recompute (a re-prefill ends past ``c_pre``), so pure-decode steps are never visited.
"""

from __future__ import annotations

from policies.base import StepPlan


class RecomputeTracker:
    """Per replica: which requests owe recomputation, and how far their prefill chunks got."""

    __slots__ = ("owed", "partial")

    def __init__(self) -> None:
        self.owed: dict[str, int] = {}  # request id -> tokens it had computed when preempted
        self.partial: dict[str, int] = {}  # request id -> tokens its unfinished prefill reached

    def observe(self, plan: StepPlan) -> tuple[int, float]:
        """``(recomputed tokens, their attention query-key pairs)`` in this step (called after
        ``schedule()``, before tokens are emitted)."""
        if plan.preempted:
            swapped = {r.id for r in plan.swapped_out} if plan.swapped_out else ()
            for req in plan.preempted:
                if req.id in swapped:
                    continue
                done = req.prompt_tokens + req.num_output_tokens - 1 if req.num_output_tokens else 0
                done = max(done, self.partial.pop(req.id, 0))
                if done > 0:
                    self.owed[req.id] = max(done, self.owed.get(req.id, 0))
        nn = plan.num_new_tokens
        nd = plan.num_decodes
        if nd:  # the plan's leading num_decodes are decodes: the rest is looked at below
            if nd == len(nn):
                return 0, 0.0
        elif not nn or max(nn) == 1 and min(plan.context) > 0:
            return 0, 0.0  # decodes only: nothing to recompute, no prefill to follow
        tokens, pairs = 0, 0.0
        owed, partial, ctx, sched = self.owed, self.partial, plan.context, plan.scheduled
        # the plan's leading num_decodes are decodes (one token on a non-empty context)
        for i in [i for i in range(nd, len(nn)) if nn[i] != 1 or ctx[i] == 0]:
            req, n, c = sched[i], nn[i], ctx[i]
            rid = req.id
            end = c + n
            if req.num_output_tokens == 0:  # a first prefill, or a re-prefill before any output
                if end < req.prompt_tokens:
                    partial[rid] = end
                else:
                    partial.pop(rid, None)
            cp = owed.get(rid)
            if cp is None:
                continue
            r = min(end, cp) - c
            if r > 0:
                tokens += r
                pairs += r * (c + (r + 1) / 2)
            if end >= cp:
                del owed[rid]
        return tokens, pairs
