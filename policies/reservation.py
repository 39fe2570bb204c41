"""What the two reservation-based policies (static and orca) share: a FCFS waiting queue that
admits requests while a contiguous max-length reservation fits, rejecting the ones that never can.
"""

from __future__ import annotations

from policies.base import EngineLimits, Request, Status, StepPlan
from policies.fcfs import FcfsPolicy
from policies.kv.contiguous import ContiguousAllocator


class ReservationPolicy(FcfsPolicy):
    uses_token_budget = False

    def __init__(self, limits: EngineLimits, **knobs) -> None:
        super().__init__(limits, **knobs)
        self.kv = ContiguousAllocator(limits.num_gpu_blocks, limits.block_size)

    def _reject_unfit(self, plan: StepPlan) -> None:
        """Drop requests at the head of the queue that could never be admitted, with a reason."""
        while self.waiting:
            req = self.waiting[0]
            if req.prompt_tokens + 1 > self.limits.max_model_len:
                reason = f"prompt of {req.prompt_tokens} tokens exceeds max_model_len {self.limits.max_model_len}"
            elif not self.kv.can_ever_fit(req):
                reason = (
                    f"reservation of {self.kv.blocks_for(req)} blocks exceeds the whole KV pool "
                    f"of {self.kv.num_blocks} blocks"
                )
            else:
                return
            self.waiting.popleft()
            req.status = Status.REJECTED
            req.reject_reason = reason
            plan.rejected.append(req)

    def _admit(self, plan: StepPlan, slots: int) -> None:
        """FCFS admission while a slot is free and the max-length reservation fits; the new
        request's whole prompt runs in this step."""
        self._reject_unfit(plan)
        while self.waiting and len(self.running) < slots and self.kv.can_reserve(self.waiting[0]):
            req = self.waiting.popleft()
            self.kv.reserve(req)
            req.status = Status.RUNNING
            self.running.append(req)
            plan.admitted.append(req)
            plan.add(req, req.num_tokens - req.num_computed_tokens, req.num_computed_tokens)
            req.num_computed_tokens = req.num_tokens
            self._reject_unfit(plan)

    def kv_blocks_used(self) -> int:
        return self.kv.used_blocks

    def kv_tokens_reserved_and_used(self) -> tuple[int, int]:
        return self.kv.tokens_reserved_and_used()

    def drain(self) -> list[Request]:
        return [*self.running, *self.waiting]
