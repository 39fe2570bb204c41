"""vLLM V0's default scheduler (vllm 0.6.6.post1, ``_schedule_default``; reference/schedulers.md §2).

Why model it: V0 is the scheduler most published serving numbers were measured with, and its
*prefill-first* rule is the behaviour chunked prefill was invented to fix. A step is either all
prefills (whole prompts, FCFS, as many as the token budget, ``max_num_seqs`` and the KV
watermark allow) or all decodes, never both: while any waiting request can be admitted, every
running request stalls. Requests swapped out to CPU memory have priority over new prompts: no
prompt is admitted while any request is swapped out.

Preemption frees memory for decodes: the running request at the *back* of ``running`` (the most
recently admitted) gives up its blocks, either by ``recompute`` (drop the KV; the request goes
to the front of the waiting queue and later prefills prompt + generated tokens again) or by
``swap`` (copy its blocks to the CPU pool; it resumes, in FIFO order, in a decode step without
preemptions, once its blocks fit above the watermark).

Where we differ from vLLM, on purpose:

* ``preemption`` is a knob. vLLM V0 picks recompute for single-sequence requests (everything
  here) and swap only for beam search / n > 1; ``swap`` models V0 with that rule flipped.
* vLLM raises ``RuntimeError("Aborted due to the lack of CPU swap space")`` when a swap victim
  does not fit the CPU pool; we recompute that victim instead and count it in
  :attr:`VllmV0Policy.num_swap_fallbacks`.
* vLLM refuses ``max_num_batched_tokens < max_num_seqs``; we cap the batch at
  ``min(max_num_seqs, max_num_batched_tokens)`` so decode steps stay within the token budget.
* A swapped request whose blocks fit the GPU pool only by eating into the watermark would wait
  forever in vLLM once nothing else runs; we swap it in when the GPU pool is otherwise empty.
* Not modelled: ``delay_factor`` (default 0.0, i.e. no delay, which is what we do), the
  ``priority`` scheduling policy (FCFS only), prefix caching (off by default in V0), chunked
  prefill (off by default in V0 below 32k context; use ``sarathi`` or ``vllm-v1`` for chunking).

Rejections (vLLM's ``FINISHED_IGNORED``): a waiting request longer than the prompt limit
``min(max_model_len, max_num_batched_tokens)``, or one whose blocks cannot fit even an empty
pool above the watermark, is rejected when it reaches the head of the queue. This also applies
to a recompute victim, whose "prompt" is prompt + generated tokens, exactly as in V0; since
both tests depend only on the request's length, such a victim is rejected at once, in the step
that preempted it, rather than one step later at the head of the queue (so a lone request that
outgrows the pool never leaves an empty step behind). A swapped request whose blocks can never
fit back is rejected when its turn to swap in comes.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from policies.base import EngineLimits, Knob, Request, Status, StepPlan
from policies.v0_blocks import AllocStatus
from policies.whole_prompt import WATERMARK, WholePromptPolicy

PREEMPTION_MODES = ("recompute", "swap")


class _Budget:
    """vLLM's ``SchedulingBudget``: tokens and sequences in this step."""

    def __init__(self, max_tokens: int, max_seqs: int, seqs: int) -> None:
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.tokens = 0
        self.seqs = seqs

    def can_schedule(self, tokens: int, seqs: int) -> bool:
        return self.tokens + tokens <= self.max_tokens and self.seqs + seqs <= self.max_seqs


class VllmV0Policy(WholePromptPolicy):
    name = "vllm-v0"
    summary = (
        "vLLM V0 default (0.6.6): prefill-first steps of whole prompts, paged KV with a watermark, "
        "recompute or swap preemption of the newest running request. FCFS only; delay_factor is "
        "not modelled (V0's default 0.0 means no delay)"
    )
    KNOBS = {
        "preemption": Knob(
            "recompute",
            "how a preempted request gives up its KV: 'recompute' (drop it, prefill prompt + outputs "
            "again; what V0 does for single-sequence requests) or 'swap' (copy its blocks to the CPU "
            "pool of engine.swap_space_gib and back, paying PCIe time)",
            str,
        ),
        "watermark": WATERMARK,
    }

    def __init__(self, limits: EngineLimits, **knobs: Any) -> None:
        super().__init__(limits, **knobs)
        self.preemption = str(self.knobs["preemption"])
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(
                f"vllm-v0 preemption must be one of {list(PREEMPTION_MODES)}; got {self.preemption!r}"
            )
        self._make_blocks(limits, limits.num_cpu_blocks)
        self.prompt_limit = min(limits.max_model_len, limits.max_num_batched_tokens)
        self.max_seqs = min(limits.max_num_seqs, limits.max_num_batched_tokens)
        # self.running (FcfsPolicy) stays in admission order: the back is the first preemption victim
        self.swapped: deque[Request] = deque()  # swap-out order: resumed first in, first out
        self.num_swap_fallbacks = 0  # swap victims recomputed because the CPU pool was full

    # --- driven by the engine -------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = _Budget(self.limits.max_num_batched_tokens, self.max_seqs, seqs=len(self.running))
        if not self.swapped:
            self._schedule_prefills(plan, budget)
        if not plan.scheduled:  # "don't schedule decodes if prefills are scheduled"
            preempted = self._schedule_decodes(plan, budget)
            if not preempted:
                self._schedule_swap_ins(plan, budget)
        return plan

    # --- one step ------------------------------------------------------------------------
    def _schedule_prefills(self, plan: StepPlan, budget: _Budget) -> None:
        """Whole prompts from the head of the waiting queue, FCFS, until one does not fit."""
        while self.waiting:
            req = self.waiting[0]
            n = req.num_tokens - req.num_computed_tokens
            reason = self._inadmissible(req)
            if reason:
                self._reject(req, plan, reason)
                continue
            if self.blocks.can_allocate(req) is AllocStatus.LATER:
                break
            if budget.tokens >= budget.max_tokens or not budget.can_schedule(n, 1):
                break
            self.waiting.popleft()
            self.blocks.allocate(req)
            req.status = Status.RUNNING
            plan.admitted.append(req)
            self._run(req, n, plan, budget)
            budget.seqs += 1
            self.running.append(req)

    def _schedule_decodes(self, plan: StepPlan, budget: _Budget) -> bool:
        """One token for every running request, front first, preempting from the back for room.

        Returns whether anything was preempted (then no request is swapped in this step).
        """
        queue = deque(self.running)
        kept: list[Request] = []
        preempted = False
        while queue:
            req = queue.popleft()
            while not self.blocks.can_append_slots(req):
                victim = queue.pop() if queue else req
                self._preempt(victim, plan)
                preempted = True
                if victim is req:
                    break
            else:
                self.blocks.append_slots(req)
                self._run(req, req.num_tokens - req.num_computed_tokens, plan, budget)
                kept.append(req)
        self.running = kept
        return preempted

    def _schedule_swap_ins(self, plan: StepPlan, budget: _Budget) -> None:
        """Swapped requests, oldest swap first, rejoin the decode step while their blocks fit."""
        while self.swapped:
            req = self.swapped[0]
            status = self.blocks.can_swap_in(req)
            if status is AllocStatus.NEVER:
                self._reject(req, plan, self._never_fits(req))
                continue
            if status is AllocStatus.LATER and self.blocks.used_gpu_blocks > 0:
                break  # (with an empty GPU pool we ignore the watermark rather than wait forever)
            n = req.num_tokens - req.num_computed_tokens
            if n == 0 or not budget.can_schedule(n, 1):
                break
            self.swapped.popleft()
            plan.swap_in_blocks += self.blocks.swap_in(req)
            plan.swapped_in.append(req)
            self.blocks.append_slots(req)
            req.status = Status.RUNNING
            self._run(req, n, plan, budget)
            budget.seqs += 1
            self.running.append(req)

    def _run(self, req: Request, n: int, plan: StepPlan, budget: _Budget) -> None:
        plan.add(req, n, req.num_computed_tokens)
        req.num_computed_tokens += n
        budget.tokens += n

    def _preempt(self, victim: Request, plan: StepPlan) -> None:
        plan.preempted.append(victim)
        victim.num_preemptions += 1
        if self.preemption == "swap":
            if self.blocks.can_swap_out(victim):
                plan.swap_out_blocks += self.blocks.swap_out(victim)
                plan.swapped_out.append(victim)
                victim.num_swaps += 1
                victim.status = Status.SWAPPED
                self.swapped.append(victim)
                return
            self.num_swap_fallbacks += 1
        self.blocks.free(victim)
        victim.num_computed_tokens = 0
        victim.status = Status.PREEMPTED
        self.waiting.appendleft(victim)  # same order as V0's waiting.extendleft(preempted)
        reason = self._inadmissible(victim)
        if reason:  # V0 would reject it at the head of the queue; no need to wait for that
            self._reject(victim, plan, reason)

    def _reject(self, req: Request, plan: StepPlan, reason: str) -> None:
        queue = self.swapped if req.status is Status.SWAPPED else self.waiting
        assert queue[0] is req, "only the head of a queue is rejected"
        queue.popleft()
        self.blocks.free(req)
        req.status = Status.REJECTED
        req.reject_reason = reason
        plan.rejected.append(req)

    def _inadmissible(self, req: Request) -> str | None:
        """Why a waiting request can never be (re)admitted, or None. Depends only on its length."""
        if req.num_tokens > self.prompt_limit:
            return (
                f"{req.num_tokens} tokens (prompt + generated) exceed the prompt limit of "
                f"{self.prompt_limit} = min(max_model_len, max_num_batched_tokens)"
            )
        if self.blocks.can_allocate(req) is AllocStatus.NEVER:
            return self._never_fits(req)
        return None

    # --- what the engine and metrics read -------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.swapped)

    @property
    def max_slots(self) -> int:
        return self.max_seqs

    @property
    def token_budget(self) -> int:
        return self.limits.max_num_batched_tokens

    def drain(self) -> list[Request]:
        held = [*self.running, *self.swapped, *self.waiting]
        for req in held:
            self.blocks.free(req)
        self.running, self.swapped, self.waiting = [], deque(), deque()
        return held
