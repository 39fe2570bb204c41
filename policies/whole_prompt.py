"""What the two whole-prompt paged policies (vllm-v0 and sarathi) share: FCFS queues, vLLM V0's
block manager (:mod:`policies.v0_blocks`) with its watermark knob, the KV figures the engine
records, why a request can never fit, and how a finished request gives its blocks back.
"""

from __future__ import annotations

from policies.base import EngineLimits, Knob, Request, Status, StepPlan
from policies.fcfs import FcfsPolicy
from policies.v0_blocks import V0BlockManager

WATERMARK = Knob(
    0.01,
    "fraction of the GPU KV blocks that admission leaves free for running requests to grow into",
    float,
)


class WholePromptPolicy(FcfsPolicy):
    """Subclasses put :data:`WATERMARK` in their ``KNOBS`` and call :meth:`_make_blocks`."""

    blocks: V0BlockManager

    def _make_blocks(self, limits: EngineLimits, num_cpu_blocks: int) -> None:
        self.blocks = V0BlockManager(limits.block_size, limits.num_gpu_blocks, num_cpu_blocks,
                                     float(self.knobs["watermark"]))

    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        done = {req.id for req in finished}
        for req in finished:
            self.blocks.free(req)
            req.status = Status.FINISHED
            req.policy_state = None
        self.running = [req for req in self.running if req.id not in done]

    def _never_fits(self, req: Request) -> str:
        """The reason to reject a request whose blocks cannot fit even an empty pool above the watermark."""
        b = self.blocks
        return (
            f"{req.num_tokens} tokens need {b.blocks_for(req.num_tokens)} KV blocks of {b.block_size}; "
            f"the GPU pool has {b.num_gpu_blocks} with {b.watermark_blocks} kept free (watermark)"
        )

    # --- what the engine and metrics read -------------------------------------------------
    def kv_blocks_used(self) -> int:
        return self.blocks.used_gpu_blocks

    def kv_tokens_reserved_and_used(self) -> tuple[int, int]:
        stored = sum(req.num_computed_tokens for req in self.running)
        return self.blocks.used_gpu_blocks * self.blocks.block_size, stored

    def cpu_blocks_used(self) -> int:
        return self.blocks.used_cpu_blocks
