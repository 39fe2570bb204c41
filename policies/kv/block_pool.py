"""The GPU block pool of vLLM V1 (0.32): free queue, reference counts and the prefix-cache registry.

Why the order of one queue matters: with prefix caching on, a freed block keeps its content hash
and stays findable until the pool hands it out again. Which cached block is overwritten next is
therefore decided by where blocks enter the free queue and where they leave it, and a simulator
that gets this order wrong hits or misses the prefix cache at different steps than vLLM does.
vLLM's rules (``v1/core/block_pool.py``, ``kv_cache_utils.py::FreeKVCacheBlockQueue``):

* Block 0 is the *null block*: taken out of the queue at start-up and never handed out, so a
  pool of ``num_usable + 1`` blocks has ``num_usable`` usable ones. The queue starts as
  ``[1, 2, ..., num_usable]``.
* :meth:`BlockPool.get_new_blocks` pops from the **front**. A popped block that still carries a
  hash is evicted: its hash is dropped from the registry.
* :meth:`BlockPool.free_blocks` decrements reference counts in the order given (callers pass a
  request's blocks tail first). A block reaching 0 goes to the **back** of the queue if it is
  hashed (least recently used leaves first) and to the **front** if it is not (an unhashed block
  holds nothing worth keeping, so it is reused first).
* :meth:`BlockPool.touch` takes a cached block back into use: reference count + 1, and out of the
  queue if it was there.
* Identical blocks are not de-duplicated: two blocks computed with the same content are both
  registered under one hash; a lookup returns the first one registered that is still cached, and
  evicting a block removes only that block.

The queue is a doubly linked list over two integer arrays (O(1) pop, append, prepend and removal
from the middle), and a block is just its index: no per-block Python objects.
"""

from __future__ import annotations

from collections.abc import Iterable

NULL_BLOCK = 0
_NONE = -1


class BlockPool:
    """``num_usable`` allocatable blocks (ids 1..num_usable) plus the reserved null block 0.

    Content hashes are small integers from :class:`policies.prefix_hash.BlockHasher`; with
    ``enable_caching`` off no block is ever hashed.
    """

    def __init__(self, num_usable: int, enable_caching: bool = False) -> None:
        if num_usable < 1:
            raise ValueError(f"a KV pool needs at least one usable block, got {num_usable}")
        self.num_usable = num_usable
        self.enable_caching = enable_caching
        n = num_usable + 1
        self.ref_cnt = [0] * n
        self.block_hash: list[int | None] = [None] * n
        # hash -> {block id: None}, in registration order (a dict is an ordered set)
        self._cached: dict[int, dict[int, None]] = {}
        # free queue: doubly linked list; the head and tail sentinels are indices n and n+1
        self._head, self._tail = n, n + 1
        self._prev = [_NONE] * (n + 2)
        self._next = [_NONE] * (n + 2)
        self._in_queue = [False] * n
        self._num_free = 0
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        for b in range(1, n):
            self._append(b)

    # --- the free queue ---------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks in the free queue, evictable cached blocks included (vLLM's ``get_num_free_blocks``)."""
        return self._num_free

    @property
    def num_used(self) -> int:
        """Blocks held by at least one request."""
        return self.num_usable - self._num_free

    def _link(self, b: int, before: int) -> None:
        prev = self._prev[before]
        self._next[prev] = b
        self._prev[b] = prev
        self._next[b] = before
        self._prev[before] = b
        self._in_queue[b] = True
        self._num_free += 1

    def _append(self, b: int) -> None:
        self._link(b, self._tail)

    def _prepend(self, b: int) -> None:
        self._link(b, self._next[self._head])

    def _unlink(self, b: int) -> None:
        prev, nxt = self._prev[b], self._next[b]
        self._next[prev] = nxt
        self._prev[nxt] = prev
        self._prev[b] = self._next[b] = _NONE
        self._in_queue[b] = False
        self._num_free -= 1

    def free_queue(self) -> list[int]:
        """The free queue front to back (for tests and debugging; O(free blocks))."""
        out, b = [], self._next[self._head]
        while b != self._tail:
            out.append(b)
            b = self._next[b]
        return out

    # --- allocation ---------------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the front of the free queue, evicting any cached content."""
        if n > self._num_free:
            raise ValueError(f"cannot allocate {n} blocks: only {self._num_free} free")
        out = []
        for _ in range(n):
            b = self._next[self._head]
            self._unlink(b)
            if self.block_hash[b] is not None:
                self._evict(b)
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take prefix-cache hits into use: ref count + 1, out of the free queue if they were free."""
        for b in blocks:
            if self.ref_cnt[b] == 0:
                self._unlink(b)
            self.ref_cnt[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Release blocks in the given order (a request's blocks tail first, as vLLM passes them)."""
        to_front = []
        for b in ordered_blocks:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self.block_hash[b] is None:
                    to_front.append(b)
                else:
                    self._append(b)
        # unhashed blocks go to the front, keeping their given order
        for b in reversed(to_front):
            self._prepend(b)

    # --- the prefix-cache registry ------------------------------------------------------------
    def get_cached_block(self, block_hash: int) -> int | None:
        """The first registered block still holding this content, or None."""
        copies = self._cached.get(block_hash)
        if copies is None:
            return None
        return next(iter(copies))

    def cache_block(self, b: int, block_hash: int) -> None:
        """Register a block that has just been filled (allocated, full, not yet hashed)."""
        if self.block_hash[b] is not None:
            raise ValueError(f"block {b} is already cached")
        self.block_hash[b] = block_hash
        copies = self._cached.get(block_hash)
        if copies is None:
            self._cached[block_hash] = {b: None}
        else:
            copies[b] = None

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        self.block_hash[b] = None
        copies = self._cached[h]
        del copies[b]
        if not copies:
            del self._cached[h]

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a registered hash (in use or evictable)."""
        return sum(len(c) for c in self._cached.values())

    def check_invariants(self) -> None:
        """Raise AssertionError if the queue, ref counts and registry disagree (tests use this)."""
        queue = self.free_queue()
        assert len(queue) == self._num_free, "queue length and counter disagree"
        assert NULL_BLOCK not in queue, "the null block is in the free queue"
        in_q = set(queue)
        assert len(in_q) == len(queue), "a block is in the free queue twice"
        for b in range(1, self.num_usable + 1):
            assert (self.ref_cnt[b] == 0) == (b in in_q), f"block {b}: ref_cnt {self.ref_cnt[b]} vs queue"
            h = self.block_hash[b]
            if h is not None:
                assert b in self._cached.get(h, ()), f"block {b} hashed but not registered"
        for h, copies in self._cached.items():
            for b in copies:
                assert self.block_hash[b] == h, f"block {b} registered under a stale hash"
