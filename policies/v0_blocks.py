"""Block accounting of the whole-prompt paged schedulers: vLLM V0 and Sarathi-Serve.

Both engines give a request the blocks for its whole prompt (prompt + outputs after a recompute)
when it is admitted, add one block when a decode outgrows the last one, and keep a *watermark*
of free blocks that admission may not eat into, so running requests have room to grow before
anyone must be preempted (vLLM 0.6.6 ``core/block_manager.py``; Sarathi's
``BaseBlockSpaceManager``; reference/schedulers.md §2.3 and §3).

Neither engine shares blocks by default (V0 has prefix caching off; Sarathi has none), so a
block's identity never matters: a per-request *count* on the GPU pool and on the CPU swap pool
is the whole state. The free counters are kept separately from the per-request counts, so
:meth:`V0BlockManager.check` can prove that no block was created or lost.
"""

from __future__ import annotations

import enum

from policies.base import Request


class AllocStatus(enum.Enum):
    """Answer to "can this request's blocks be placed?" (vLLM's ``AllocStatus``)."""

    OK = "ok"  # now
    LATER = "later"  # once other requests free blocks
    NEVER = "never"  # not even into an empty pool: the request must be rejected


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class V0BlockManager:
    """A GPU pool of ``num_gpu_blocks`` and a CPU swap pool of ``num_cpu_blocks``, counted per request.

    A request's table always covers ``cdiv(tokens, block_size)`` blocks for the tokens it asked
    room for: :meth:`allocate` and :meth:`append_slots` size it to ``req.num_tokens`` (prompt plus
    the outputs so far, including the newest output whose KV the coming decode step writes).
    """

    def __init__(
        self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int = 0, watermark: float = 0.01
    ) -> None:
        if block_size < 1 or num_gpu_blocks < 1 or num_cpu_blocks < 0:
            raise ValueError(
                f"block pool needs block_size >= 1, num_gpu_blocks >= 1 and num_cpu_blocks >= 0; "
                f"got {block_size}, {num_gpu_blocks}, {num_cpu_blocks}"
            )
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark is a fraction of the GPU pool in [0, 1); got {watermark}")
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.watermark_blocks = int(watermark * num_gpu_blocks)  # as vLLM V0 and Sarathi round it
        self.free_gpu_blocks = num_gpu_blocks
        self.free_cpu_blocks = num_cpu_blocks
        self._gpu: dict[str, int] = {}  # request id -> blocks it holds on the GPU
        self._cpu: dict[str, int] = {}  # request id -> blocks it holds in the swap pool

    # --- what a request holds -----------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def gpu_blocks_of(self, req: Request) -> int:
        return self._gpu.get(req.id, 0)

    def cpu_blocks_of(self, req: Request) -> int:
        return self._cpu.get(req.id, 0)

    @property
    def used_gpu_blocks(self) -> int:
        return sum(self._gpu.values())

    @property
    def used_cpu_blocks(self) -> int:
        return sum(self._cpu.values())

    # --- admission ----------------------------------------------------------------------
    def can_allocate(self, req: Request) -> AllocStatus:
        """Room for the whole of ``req.num_tokens`` while leaving the watermark free."""
        required = self.blocks_for(req.num_tokens)
        if self.num_gpu_blocks - required < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.free_gpu_blocks - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, req: Request) -> None:
        if req.id in self._gpu or req.id in self._cpu:
            raise RuntimeError(f"{req.id} already holds blocks")
        n = self.blocks_for(req.num_tokens)
        self._take_gpu(n)
        self._gpu[req.id] = n

    # --- growth -------------------------------------------------------------------------
    def new_blocks_needed(self, req: Request) -> int:
        return max(0, self.blocks_for(req.num_tokens) - self._gpu.get(req.id, 0))

    def can_append_slots(self, req: Request) -> bool:
        """Room for the next decode token (no watermark: running requests may use it)."""
        return self.new_blocks_needed(req) <= self.free_gpu_blocks

    def append_slots(self, req: Request) -> int:
        """Grow the table to cover ``req.num_tokens``; returns the number of new blocks."""
        if req.id not in self._gpu:
            raise RuntimeError(f"{req.id} holds no GPU blocks to append to")
        n = self.new_blocks_needed(req)
        self._take_gpu(n)
        self._gpu[req.id] += n
        return n

    # --- swapping -----------------------------------------------------------------------
    def can_swap_out(self, req: Request) -> bool:
        return self._gpu.get(req.id, 0) <= self.free_cpu_blocks

    def swap_out(self, req: Request) -> int:
        """Move all of ``req``'s GPU blocks to the swap pool; returns how many moved."""
        n = self._gpu.pop(req.id)
        if n > self.free_cpu_blocks:
            self._gpu[req.id] = n
            raise RuntimeError(f"swap pool has {self.free_cpu_blocks} free blocks, {req.id} needs {n}")
        self.free_gpu_blocks += n
        self.free_cpu_blocks -= n
        self._cpu[req.id] = n
        return n

    def can_swap_in(self, req: Request) -> AllocStatus:
        """Room on the GPU for the swapped blocks plus the next decode token, above the watermark."""
        required = max(self._cpu.get(req.id, 0), self.blocks_for(req.num_tokens))
        if required > self.num_gpu_blocks:
            return AllocStatus.NEVER
        if self.free_gpu_blocks - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def swap_in(self, req: Request) -> int:
        """Move ``req``'s blocks back to the GPU; returns how many moved (call append_slots next)."""
        n = self._cpu[req.id]
        self._take_gpu(n)
        del self._cpu[req.id]
        self.free_cpu_blocks += n
        self._gpu[req.id] = n
        return n

    # --- release ------------------------------------------------------------------------
    def free(self, req: Request) -> None:
        """Return every block ``req`` holds, on either pool (a no-op if it holds none)."""
        self.free_gpu_blocks += self._gpu.pop(req.id, 0)
        self.free_cpu_blocks += self._cpu.pop(req.id, 0)

    def check(self) -> None:
        """Raise if a block was created or lost: free + held == total on each pool."""
        for pool, free, held, total in (
            ("GPU", self.free_gpu_blocks, self._gpu, self.num_gpu_blocks),
            ("CPU", self.free_cpu_blocks, self._cpu, self.num_cpu_blocks),
        ):
            used = sum(held.values())
            if free < 0 or any(n < 0 for n in held.values()) or free + used != total:
                raise AssertionError(f"{pool} pool: free {free} + held {used} != total {total}")

    def _take_gpu(self, n: int) -> None:
        if n > self.free_gpu_blocks:
            raise RuntimeError(f"GPU pool has {self.free_gpu_blocks} free blocks, {n} requested")
        self.free_gpu_blocks -= n
