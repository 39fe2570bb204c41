"""Sarathi-Serve's stall-free batching (microsoft/sarathi-serve ``SarathiScheduler``; reference/schedulers.md §3).

Why model it: Sarathi is the scheduler that showed prefill-first engines (vLLM V0) stall every
running decode whenever a prompt is admitted. Its fix: every step has a fixed token budget,
``chunk_size`` (512 by default), shared by the whole batch. Decodes go first, one token each,
oldest arrival first, so they are never paused; ongoing prefills get chunks of what is left,
then new requests are admitted FCFS with a chunk of the rest, several prefills per step if room
remains. Memory is vLLM V0's paged layout with a watermark: the *whole* prompt's blocks are
allocated when a request is admitted, even though it is prefilled chunk by chunk.

When a decode finds no free block (Sarathi checks ``free > 0``, not whether this decode needs a
new block), the newest-arrived running request not yet scheduled this step is preempted by
recompute: its blocks are freed and it goes to the front of the waiting queue, to prefill
prompt + generated tokens again. If no other request is left, the decode preempts itself.

Where we differ from Sarathi, on purpose: a waiting request whose blocks cannot fit even an
empty pool above the watermark is rejected (Sarathi's ``can_allocate`` has no NEVER answer and
would wait forever); requests longer than ``max_model_len`` are rejected as Sarathi does. Not
modelled: dynamic chunk sizes (off by default) and pipeline-parallel batches in flight.
``max_num_seqs`` comes from the engine limits (Sarathi's own default is 128).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from policies.base import EngineLimits, Knob, Request, Status, StepPlan
from policies.v0_blocks import AllocStatus
from policies.whole_prompt import WATERMARK, WholePromptPolicy


class SarathiPolicy(WholePromptPolicy):
    name = "sarathi"
    summary = (
        "Sarathi-Serve stall-free batching: decodes first, prefill chunks fill a fixed chunk_size "
        "token budget, whole-prompt KV allocation at admission, newest-arrival recompute preemption"
    )
    KNOBS = {
        "chunk_size": Knob(
            512, "token budget of a whole step: decodes (1 token each) plus prefill chunks", int
        ),
        "watermark": WATERMARK,
    }

    def __init__(self, limits: EngineLimits, **knobs: Any) -> None:
        super().__init__(limits, **knobs)
        self.chunk_size = int(self.knobs["chunk_size"])
        if self.chunk_size < 1:
            raise ValueError(f"sarathi chunk_size must be >= 1; got {self.chunk_size}")
        self._make_blocks(limits, num_cpu_blocks=0)

    # --- driven by the engine -------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        queue = deque(sorted(self.running, key=lambda r: (r.arrival_s, r.seq)))  # FCFS
        new_running: list[Request] = []
        prefills: list[Request] = []
        batched = 0

        # Pass 1: decodes, one token each, preempting the newest arrivals when no block is free.
        while queue:
            req = queue.popleft()
            if not self._prompt_done(req):
                prefills.append(req)
                continue
            while self.blocks.free_gpu_blocks == 0:
                victim = queue.pop() if queue else req
                self._preempt(victim, plan)
                if victim is req:
                    break
            else:
                self.blocks.append_slots(req)
                self._run(req, 1, plan)
                batched += 1
                new_running.append(req)

        # Pass 2: ongoing prefills (their blocks are already allocated) take chunks of what is left.
        for req in prefills:
            new_running.append(req)
            chunk = min(self._prompt_left(req), self.chunk_size - batched)
            if chunk > 0:
                self._run(req, chunk, plan)
                batched += chunk

        # Pass 3: new requests, FCFS, each with its whole prompt's blocks and a chunk of the rest.
        while self.waiting:
            req = self.waiting[0]
            if req.num_tokens > self.limits.max_model_len:
                self._reject(
                    req,
                    plan,
                    f"{req.num_tokens} tokens (prompt + generated) exceed max_model_len "
                    f"{self.limits.max_model_len}",
                )
                continue
            status = self.blocks.can_allocate(req)
            if status is AllocStatus.NEVER:
                self._reject(req, plan, self._never_fits(req))
                continue
            if status is AllocStatus.LATER or len(new_running) >= self.limits.max_num_seqs:
                break
            chunk = min(req.num_tokens, self.chunk_size - batched)
            if chunk <= 0:
                break
            self.waiting.popleft()
            self.blocks.allocate(req)
            req.policy_state = req.num_tokens  # the prompt to prefill: prompt + outputs so far
            req.status = Status.RUNNING
            plan.admitted.append(req)
            self._run(req, chunk, plan)
            batched += chunk
            new_running.append(req)

        self.running = new_running
        return plan

    # --- helpers -------------------------------------------------------------------------
    @staticmethod
    def _prompt_left(req: Request) -> int:
        return req.policy_state - req.num_computed_tokens

    def _prompt_done(self, req: Request) -> bool:
        return self._prompt_left(req) <= 0

    @staticmethod
    def _run(req: Request, n: int, plan: StepPlan) -> None:
        plan.add(req, n, req.num_computed_tokens)
        req.num_computed_tokens += n

    def _preempt(self, victim: Request, plan: StepPlan) -> None:
        self.blocks.free(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.policy_state = None
        victim.status = Status.PREEMPTED
        plan.preempted.append(victim)
        self.waiting.appendleft(victim)

    def _reject(self, req: Request, plan: StepPlan, reason: str) -> None:
        self.waiting.popleft()
        req.status = Status.REJECTED
        req.reject_reason = reason
        plan.rejected.append(req)

    # --- what the engine and metrics read -------------------------------------------------
    @property
    def token_budget(self) -> int:
        return self.chunk_size

    def drain(self) -> list[Request]:
        held = [*self.running, *self.waiting]
        for req in held:
            self.blocks.free(req)
            req.policy_state = None
        self.running, self.waiting = [], deque()
        return held
