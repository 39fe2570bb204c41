"""A contiguous max-length KV allocator, as serving systems had before paging.

Each admitted request reserves room for ``prompt + max_tokens`` tokens up front (rounded up to
whole blocks so it is comparable with the paged pool) and holds it until it is released. Because
most requests stop long before ``max_tokens``, most of that room is never written: the
fragmentation waste the PagedAttention paper measured at 60-80 % of KV memory (Kwon et al.,
SOSP'23). ``tokens_reserved_and_used`` lets the metrics measure that waste here.
"""

from __future__ import annotations

from policies.base import Request


class ContiguousAllocator:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks = num_blocks
        self._held: dict[str, tuple[Request, int]] = {}

    def blocks_for(self, req: Request) -> int:
        """Blocks a max-length reservation takes: prompt + max_tokens, rounded up."""
        return -(-(req.prompt_tokens + req.max_tokens) // self.block_size)

    def can_ever_fit(self, req: Request) -> bool:
        return self.blocks_for(req) <= self.num_blocks

    def can_reserve(self, req: Request) -> bool:
        return self.blocks_for(req) <= self.free_blocks

    def reserve(self, req: Request) -> None:
        n = self.blocks_for(req)
        assert n <= self.free_blocks and req.id not in self._held
        self.free_blocks -= n
        self._held[req.id] = (req, n)

    def release(self, req: Request) -> None:
        _, n = self._held.pop(req.id)
        self.free_blocks += n

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def tokens_reserved_and_used(self) -> tuple[int, int]:
        reserved = sum(n for _, n in self._held.values()) * self.block_size
        used = sum(r.num_computed_tokens for r, _ in self._held.values())
        return reserved, used
