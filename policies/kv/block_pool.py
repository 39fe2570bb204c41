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

The queue always has the shape ``unhashed blocks ++ hashed blocks``: it starts with only
unhashed blocks, unhashed blocks only ever enter at the front and hashed ones at the back, pops
take the front, and :meth:`touch` only takes out cached (hashed) blocks. (A *released* block, the
content of a finished request that no lookup can name, counts as hashed for the queue; when the
request's whole table goes back in one piece, :meth:`free_table` places it by position and it
carries no name at all: see :attr:`BlockPool.num_named`.) So it is kept as two
parts, each with O(1) operations and no per-block Python object: the unhashed front as a list used
as a stack (its top is the queue's front), and the hashed back as a list in queue order read from
a head index, so that popping many blocks is one slice. A cache hit taken out of the back leaves
its entry behind as *stale*: ``_stale[b]`` counts them. A block's entries are in the order it
entered, and only its newest can be live, so a pop skips the first ``_stale[b]`` entries of ``b``
it meets; while nothing is stale (no hits: content nobody shares) a pop is a plain slice.
A block is just its index.

Reference counts are written only where someone can read them. A count is read for a cache hit
(a *named* block: one with a content hash or a private tag), for a block held twice or more, and
for a block given back (one holder less). So :attr:`BlockPool.refs` is exact for named blocks and
for blocks with two or more holders; an unnamed block held once, or free, reads 0 or 1 there
(which of the two, no one asks: an unnamed block is never a hit, and one that is given back or
pinned is held). A block therefore leaves the free queue and goes back to it, in the case that
dominates a run (content of its own request's, nothing shared), without a per-block write: the
pool hands out and takes back whole slices. :attr:`BlockPool.ref_cnt` gives the exact counts
(tests and checks: it reads the free queue).
"""

from __future__ import annotations

from collections.abc import Iterable

_COMPACT = 4096  # drop the consumed head of the back queue once it is this long and half the list

NULL_BLOCK = 0


class BlockPool:
    """``num_usable`` allocatable blocks (ids 1..num_usable) plus the reserved null block 0.

    Content hashes are small integers from :class:`policies.prefix_hash.BlockHasher`; with
    ``enable_caching`` off no block is ever hashed. A negative ``block_hash`` is a *private tag*
    (:mod:`policies.kv.paged`: content only its own request can hit): it places the block in the
    free queue as a hash does, but is in no registry, so evicting it is just clearing it.
    Whoever names a block outside this class (:mod:`policies.kv.paged` tags them) counts it in
    :attr:`num_named` and makes its entry in :attr:`refs` exact (1, or what it is when it has
    two holders or more).
    """

    def __init__(self, num_usable: int, enable_caching: bool = False) -> None:
        if num_usable < 1:
            raise ValueError(f"a KV pool needs at least one usable block, got {num_usable}")
        self.num_usable = num_usable
        self.enable_caching = enable_caching
        n = num_usable + 1
        # exact for named blocks and for blocks held twice or more; 0 or 1 otherwise (module doc)
        self.refs = [0] * n
        self.block_hash: list[int | None] = [None] * n
        # hash -> {block id: None}, in registration order (a dict is an ordered set)
        self._cached: dict[int, dict[int, None]] = {}
        # the free queue: unhashed front (a stack: the queue's front is its last item), then the
        # hashed back in queue order: _back[_head:], less the stale entries
        self._front: list[int] = list(range(num_usable, 0, -1))
        self._back: list[int] = []
        self._head = 0
        self._stale = [0] * n  # stale entries of each block in the back queue
        self._num_stale = 0
        self._num_back = 0  # live blocks in the back queue
        # blocks whose block_hash is not None (a content hash or a private tag): while there are
        # none, a block popped from the back has nothing to clear (the pop has no per-block pass).
        # Whoever writes block_hash outside this class counts here.
        self.num_named = 0
        # references beyond a block's first (cache hits on blocks in use, a hand-off's pins):
        # while there are none, every held block has one holder and a request's table is its own
        self.extra_refs = 0

    @property
    def ref_cnt(self) -> list[int]:
        """Every block's exact reference count (O(pool): for tests and checks)."""
        in_q = set(self.free_queue())
        return [c if c >= 2 or h is not None or b == NULL_BLOCK else int(b not in in_q)
                for b, (c, h) in enumerate(zip(self.refs, self.block_hash))]

    # --- the free queue ---------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks in the free queue, evictable cached blocks included (vLLM's ``get_num_free_blocks``)."""
        return len(self._front) + self._num_back

    @property
    def num_used(self) -> int:
        """Blocks held by at least one request."""
        return self.num_usable - len(self._front) - self._num_back

    def _live_back(self) -> list[int]:
        stale = list(self._stale)
        out = []
        for b in self._back[self._head:]:
            if stale[b]:
                stale[b] -= 1
            else:
                out.append(b)
        return out

    def free_queue(self) -> list[int]:
        """The free queue front to back (for tests and debugging; O(free blocks))."""
        return self._front[::-1] + self._live_back()

    # --- allocation ---------------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the front of the free queue, evicting any cached content."""
        front = self._front
        if n <= len(front):  # the common case: never-used or unhashed blocks only
            out = front[len(front) - n:]
            out.reverse()
            del front[len(front) - n:]
            return out  # unnamed and now held once: refs need no write (module doc)
        if n > self.num_free:
            raise ValueError(f"cannot allocate {n} blocks: only {self.num_free} free")
        out = front[::-1]
        front.clear()
        need = n - len(out)
        back, head = self._back, self._head
        if not self._num_stale:
            taken = back[head:head + need]
            head += need
        else:
            taken = []
            stale = self._stale
            while len(taken) < need:
                b = back[head]
                head += 1
                if stale[b]:
                    stale[b] -= 1
                    self._num_stale -= 1
                else:
                    taken.append(b)
        if head >= _COMPACT and 2 * head >= len(back):
            del back[:head]
            head = 0
        self._head = head
        self._num_back -= need
        out += taken
        if self.num_named:
            block_hash = self.block_hash
            cleared = 0
            for b in taken:  # evict: each popped block loses its content (its exact count was 0)
                h = block_hash[b]
                if h is not None:
                    block_hash[b] = None
                    cleared += 1
                    if h > 0:
                        self._unregister(b, h)
            self.num_named -= cleared
        # (no block carries a name: the back holds released blocks only, a Poisson load's case)
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """Take prefix-cache hits into use: ref count + 1, out of the free queue if they were
        free; or take one more reference on blocks in use (a hand-off's pin). An unnamed block
        is never a hit: it is one in use."""
        ref, block_hash = self.refs, self.block_hash
        for b in blocks:
            c = ref[b]
            if block_hash[b] is None:  # in use (a pin): once unless it counts two or more
                if c < 2:
                    c = 1
                self.extra_refs += 1
            elif c == 0:
                self._stale[b] += 1  # its entry in the back queue is left behind
                self._num_stale += 1
                self._num_back -= 1
            else:
                self.extra_refs += 1
            ref[b] = c + 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Release blocks in the given order (a request's blocks tail first, as vLLM passes them)."""
        ref = self.refs
        if not self.enable_caching:
            # no block is hashed or shared: every block held once goes to the front
            blocks = list(ordered_blocks)
            if not self.extra_refs or (blocks and max(map(ref.__getitem__, blocks)) < 2):
                blocks.reverse()
                self._front.extend(blocks)
                return
            ordered_blocks = blocks
        block_hash = self.block_hash
        to_front = []
        back = self._back
        n_back = len(back)
        still_held = 0
        for b in ordered_blocks:
            c = ref[b]
            if c < 2 and block_hash[b] is None:
                c = 1  # unnamed, one holder (module doc)
            c -= 1
            ref[b] = c
            if c == 0:
                if block_hash[b] is None:
                    to_front.append(b)
                else:
                    back.append(b)
            else:
                still_held += 1
        self._num_back += len(back) - n_back
        self.extra_refs -= still_held
        # unhashed blocks go to the front, keeping their given order
        if to_front:
            to_front.reverse()
            self._front.extend(to_front)

    def free_table(self, blocks: list[int], num_hashed: int, num_named: int | None = None) -> None:
        """``free_blocks(reversed(blocks))`` for a block table whose first ``num_hashed`` blocks
        hold content and the rest none (what a request's table is): when the request is each
        block's only holder (nothing shared or pinned) every block reaches 0, the unhashed tail
        goes to the front and the hashed head to the back, tail first, as two list operations.
        The head goes to the back whatever its blocks' names (a released block has none).
        ``num_named``: no block past the first ``num_named`` is named (their counts need no
        write; default ``num_hashed``)."""
        ref = self.refs
        if self.extra_refs and max(map(ref.__getitem__, blocks)) >= 2:
            self.free_blocks(reversed(blocks))
            return
        if num_named is None:
            num_named = num_hashed
        for i in range(num_named):
            ref[blocks[i]] = 0
        if num_hashed < len(blocks):
            self._front.extend(blocks[num_hashed:])  # to_front reversed twice: table order
        if num_hashed:
            self._back.extend(blocks[num_hashed - 1::-1])
            self._num_back += num_hashed

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
        self.num_named += 1
        if self.refs[b] < 2:
            self.refs[b] = 1  # a named block's count is exact: it is in use, once
        copies = self._cached.get(block_hash)
        if copies is None:
            self._cached[block_hash] = {b: None}
        else:
            copies[b] = None

    def _unregister(self, b: int, h: int) -> None:
        """Drop an evicted block from the registry (private tags, negative, are in none)."""
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
        assert len(queue) == self.num_free, "queue length and counter disagree"
        assert all(self.block_hash[b] is None for b in self._front), "a hashed block in the unhashed front"
        # (a block of the back may carry no name: a released one, placed there by free_table)
        assert self.num_named == sum(h is not None for h in self.block_hash), "named blocks miscounted"
        ref_cnt = self.ref_cnt
        assert self.extra_refs == sum(max(c - 1, 0) for c in ref_cnt), "extra references miscounted"
        # named blocks and blocks counted twice or more read their exact count (checked against the
        # queue below); the others read 0 or 1
        assert all(c >= 0 for c in self.refs), "a negative reference count"
        assert self._num_stale == sum(self._stale), "stale counts disagree"
        assert NULL_BLOCK not in queue, "the null block is in the free queue"
        in_q = set(queue)
        assert len(in_q) == len(queue), "a block is in the free queue twice"
        for b in range(1, self.num_usable + 1):
            assert (ref_cnt[b] == 0) == (b in in_q), f"block {b}: ref_cnt {ref_cnt[b]} vs queue"
            h = self.block_hash[b]
            if h is not None and h > 0:
                assert b in self._cached.get(h, ()), f"block {b} hashed but not registered"
        for h, copies in self._cached.items():
            for b in copies:
                assert self.block_hash[b] == h, f"block {b} registered under a stale hash"
