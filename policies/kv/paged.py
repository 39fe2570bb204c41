"""Per-request paged KV bookkeeping on top of a :class:`BlockPool`, as vLLM 0.32's ``KVCacheManager``.

A request holds a list of block ids (its block table); block ``i`` stores tokens
``[i * block_size, (i + 1) * block_size)``. The scheduler asks three questions of this object,
and the answers below are vLLM's (``v1/core/kv_cache_manager.py``,
``single_type_kv_cache_manager.py``), because they decide who runs and who is preempted:

* :meth:`PagedKVManager.get_computed_blocks`: the prefix-cache hit of a request that holds no
  blocks yet: the longest run of cached full blocks from the start, capped at
  ``num_tokens - 1`` tokens rounded down to whole blocks (the last token is always computed
  again, so a request whose prompt is one full hit recomputes its whole last block).
* :meth:`PagedKVManager.allocate_slots`: can the request get slots for ``num_new`` more tokens?
  Admission (waiting or preempted requests while others run) keeps ``watermark_blocks`` free.
  With ``full_sequence_must_fit`` the whole current sequence (prompt plus earlier outputs) must
  fit the free queue too, not just the first chunk. Cache hits that sit in the free queue
  (reference count 0) count as blocks to allocate, since taking them shrinks the free queue.
  On success the full blocks are registered in the prefix cache at once (at *schedule* time,
  so a request admitted later in the same step can already hit them).
* :meth:`PagedKVManager.free`: give every block back, tail first.

Prefix caching at the cost of what can hit. vLLM hashes and registers every full block of every
request. A block whose content no other request holds (``Request.shareable_tokens``: the request's
*own* blocks, from the first one that contains a token of its own) can only ever be hit by that
same request, when it is recomputed after a preemption. Such blocks are not hashed or indexed
while the request holds them; ``num_cached_blocks`` still counts them as registered, exactly when
vLLM registers them. When the request frees them, each gets a *private tag* in the pool
(``BlockPool.block_hash``: a negative number naming the request and the block's index, or
``RELEASED_TAG`` once the request has finished and no lookup can name it again), which is
all the free queue reads (a registered block goes to its back, where eviction finds it in LRU
order). A finished request's table that goes back in one piece (no block of it held twice:
``BlockPool.extra_refs`` is 0) needs no tags at all: ``BlockPool.free_table`` puts its registered
head at the back by position, and nothing ever reads a released block's name. A preempted request keeps, per block index, the blocks that held that content in the
order they were registered (vLLM's registry order for that hash). A lookup of an own block takes
the first of them whose tag is still in place (not evicted since). Every decision (hits, the free
queue's order, evictions) is the one full hashing gives; what is saved is the hashing, the
registry and, in decode stretches, the per-block registration calls.
"""

from __future__ import annotations

import sys
from itertools import accumulate

from policies.base import Request, Status
from policies.kv.block_pool import BlockPool
from policies.kv.tiers import TierStore
from policies.prefix_hash import BlockHasher, RequestBlockHashes

_ADMITTING = (Status.WAITING, Status.PREEMPTED)


_ALL = sys.maxsize  # shareable blocks of a request that claims nothing
RELEASED_TAG = -1  # the private tag of a finished request's own blocks (free, evictable, named by no one)


class _ReqKV:
    __slots__ = ("blocks", "num_cached_blocks", "hashes", "shared", "own", "tag")

    def __init__(self, shared: int = _ALL) -> None:
        self.blocks: list[int] = []
        self.num_cached_blocks = 0  # leading blocks already registered in the prefix cache
        self.hashes: RequestBlockHashes | None = None  # kept across preemptions, like vLLM's
        self.shared = shared  # leading blocks another request may hold; the rest are its own
        # own blocks freed by a preemption: block index -> blocks in registration order
        self.own: dict[int, list[int]] | None = None
        self.tag = 0  # the private tag of block i is tag - i (0: none given yet)


class PagedKVManager:
    """Block tables for every request of one policy, on one pool of ``num_usable_blocks``.

    ``watermark`` is a fraction of the pool *including* the null block, as in vLLM 0.32:
    ``watermark_blocks = int(watermark * (num_usable_blocks + 1))``.
    """

    def __init__(
        self,
        num_usable_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_caching: bool = False,
        watermark: float = 0.0,
    ) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_usable_blocks, enable_caching)
        self.watermark_blocks = int(watermark * (num_usable_blocks + 1))
        self.hasher = BlockHasher(block_size) if enable_caching else None
        self._reqs: dict[Request, _ReqKV] = {}
        self._held_blocks = 0  # sum of block-table lengths (a shared block counts once per holder)
        self._tags = 0  # requests given private tags so far
        # request states with leading blocks another request may hold (shared > 0): while there
        # are none, every block still to fill is its request's own (nothing to check per request)
        self.num_sharing = 0
        self.tiers: TierStore | None = None  # KV offloading below the GPU (policies.kv.tiers)

    # --- what the policy reads -------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    @property
    def held_token_slots(self) -> int:
        """Token slots in the block tables of all requests (a shared block counts per holder)."""
        return self._held_blocks * self.block_size

    def blocks_of(self, req: Request) -> list[int]:
        st = self._reqs.get(req)
        return list(st.blocks) if st else []

    def request_states(self) -> dict[Request, _ReqKV]:
        """Every request's block table and cache progress (read-only for callers)."""
        return self._reqs

    def _state(self, req: Request) -> _ReqKV:
        st = self._reqs.get(req)
        if st is None:
            st = self._reqs[req] = self._new_state(req)
        return st

    def _new_state(self, req: Request) -> _ReqKV:
        own = req.shareable_tokens
        st = _ReqKV(_ALL if own is None else own // self.block_size)
        if st.shared:
            self.num_sharing += 1
        return st

    def _hashes(self, req: Request, st: _ReqKV) -> RequestBlockHashes:
        if st.hashes is None:
            st.hashes = self.hasher.new_request(req.prompt_runs, req.prompt_tokens, req.output_key)
        return st.hashes

    # --- prefix cache -----------------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Cached blocks for a request that holds none, and the number of tokens they cover."""
        if not self.enable_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return [], 0
        st = self._state(req)
        hits: list[int] = []
        shared = min(st.shared, max_blocks)
        if shared:
            rh = self._hashes(req, st)
            hasher, pool = self.hasher, self.pool
            for i in range(shared):  # hashes are computed only as far as the hit reaches
                b = pool.get_cached_block(hasher.hash_at(rh, i))
                if b is None:
                    return hits, len(hits) * self.block_size
                hits.append(b)
        own = st.own
        if own and max_blocks > shared:  # its own blocks, as a preemption left them
            bh, tag = self.pool.block_hash, st.tag
            for i in range(shared, max_blocks):
                t = tag - i
                b = next((c for c in own.get(i, ()) if bh[c] == t), None)
                if b is None:
                    break
                hits.append(b)
        return hits, len(hits) * self.block_size

    def tier_hits(self, req: Request, start: int) -> tuple[list[int], list[int]]:
        """Blocks ``start``, ``start + 1``, ... of a request that holds none, found in the lower
        tiers (after its ``start`` GPU hits): their hashes and tiers, as far as they run (cut to
        the tier store's chunks), capped as :meth:`get_computed_blocks` caps GPU hits."""
        st = self._state(req)
        top = min(st.shared, (req.num_tokens - 1) // self.block_size)
        if self.tiers is None or top <= start:
            return [], []
        rh, hash_at, hashes = self._hashes(req, st), self.hasher.hash_at, []

        def walk():  # hashes computed only as far as the hit reaches
            for i in range(start, top):
                h = hash_at(rh, i)
                hashes.append(h)
                yield h

        tiers = self.tiers.lookup(walk())
        del hashes[len(tiers):]
        self.tiers.touch(hashes)
        return hashes, tiers

    # --- allocation -------------------------------------------------------------------------
    def _blocks_to_allocate(self, st: _ReqKV, num_tokens: int, new_computed_blocks: list[int]) -> int:
        required = -(-num_tokens // self.block_size)
        new = max(required - len(new_computed_blocks) - len(st.blocks), 0)
        if new_computed_blocks:
            ref = self.pool.refs  # hits are named blocks: their counts are exact
            new += sum(1 for b in new_computed_blocks if ref[b] == 0)
        return new

    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[int] | None = None,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Slots for ``num_new_tokens`` more tokens (after ``num_new_computed_tokens`` cache hits).

        ``num_lookahead_tokens``: slots beyond those, never hashed (speculative decoding: the
        draft model writes its proposals' KV there; vLLM ``kv_cache_manager.py`` allocate_slots,
        ``num_tokens_need_slot = min(num_computed_tokens + num_new_tokens + num_lookahead_tokens,
        max_model_len)``). Returns the newly allocated block ids (possibly empty), or None when
        they do not fit; then nothing has changed.
        """
        st = self._reqs.get(req)
        if (
            st is not None
            and st.blocks
            and not new_computed_blocks
            and not full_sequence_must_fit
            and (self.watermark_blocks == 0 or not has_scheduled_reqs or req.status not in _ADMITTING)
        ):
            # fast path, a running request: only its own growth can need blocks
            end = req.num_computed_tokens + num_new_computed_tokens + num_new_tokens
            if (
                end + num_lookahead_tokens <= len(st.blocks) * self.block_size
                or self.max_model_len <= len(st.blocks) * self.block_size
            ):
                if self.enable_caching:
                    n_tok = req.num_tokens
                    if end < n_tok:
                        n_tok = end
                    if n_tok // self.block_size > st.num_cached_blocks:
                        self._cache_blocks(req, st, n_tok)
                return []
        if st is None:
            st = self._reqs[req] = self._new_state(req)
        hits = new_computed_blocks or []
        local_computed = req.num_computed_tokens + num_new_computed_tokens
        wm = self.watermark_blocks if (has_scheduled_reqs and req.status in _ADMITTING) else 0
        free = self.pool.num_free
        if full_sequence_must_fit:
            whole = min(req.num_tokens, self.max_model_len)
            if self._blocks_to_allocate(st, whole, hits) + wm > free:
                return None
        tokens_need_slot = min(local_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if self._blocks_to_allocate(st, tokens_need_slot, hits) + wm > free:
            return None

        if not st.blocks:  # a new or resumed request: its hits are already registered
            st.num_cached_blocks = len(hits)
        if hits:
            self.pool.touch(hits)
            st.blocks.extend(hits)
            self._held_blocks += len(hits)
        n_new = -(-tokens_need_slot // self.block_size) - len(st.blocks)
        new_blocks = self.pool.get_new_blocks(n_new) if n_new > 0 else []
        if new_blocks:
            st.blocks.extend(new_blocks)
            self._held_blocks += n_new
        if self.enable_caching:
            self._cache_blocks(req, st, min(local_computed + num_new_tokens, req.num_tokens))
        return new_blocks

    def _cache_blocks(self, req: Request, st: _ReqKV, num_tokens: int) -> None:
        num_full = num_tokens // self.block_size
        if num_full <= st.num_cached_blocks:
            return
        top = min(num_full, st.shared)  # the request's own blocks are registered by count only
        if top > st.num_cached_blocks:
            hashes = self.hasher.extend(self._hashes(req, st), top)
            blocks, pool = st.blocks, self.pool
            for i in range(st.num_cached_blocks, top):
                pool.cache_block(blocks[i], hashes[i])
            if self.tiers is not None:  # write-through to the CPU tier
                for i in range(st.num_cached_blocks, top):
                    self.tiers.store(hashes[i])
        if self.tiers is not None and num_full > max(top, st.num_cached_blocks):
            self.tiers.store_own(num_full - max(top, st.num_cached_blocks))  # its own content: stored, never hit
        st.num_cached_blocks = num_full

    # --- freeing ----------------------------------------------------------------------------
    def free(self, req: Request, _keep_own: bool = True) -> None:
        """Give back every block the request holds, tail first (preemption or finish)."""
        st = self._reqs.get(req)
        if st is None or not st.blocks:
            return
        if st.num_cached_blocks > st.shared:
            self._tag_own(st, _keep_own)
        if self.enable_caching:
            # blocks [0, num_cached) hold content (hashed or tagged), the rest none; own blocks
            # carry a name only if the request was ever tagged or they were just tagged released
            pool, n_cached = self.pool, st.num_cached_blocks
            named = n_cached if st.tag or pool.extra_refs else min(st.shared, n_cached)
            pool.free_table(st.blocks, n_cached, named)
        else:
            self.pool.free_blocks(reversed(st.blocks))
        self._held_blocks -= len(st.blocks)
        st.blocks = []
        st.num_cached_blocks = 0

    def _tag_own(self, st: _ReqKV, keep: bool) -> None:
        """Give the request's registered own blocks their private tags before they are freed
        (a tagged block goes to the back of the free queue, as a hashed one does); when it may
        come back (``keep``), remember them per index in vLLM's registry order for that hash."""
        pool = self.pool
        bh, blocks = pool.block_hash, st.blocks
        lo, hi = st.shared, st.num_cached_blocks
        if not keep:
            # released: no lookup will ever name this request again, so its blocks need only be
            # "hashed" for the free queue (not None) and in no registry (not positive); with no
            # block held twice free_table places the whole table by position and reads no name
            if pool.extra_refs:
                named, refs = 0, pool.refs
                for b in blocks[lo:hi]:
                    if bh[b] is None:
                        named += 1
                        if refs[b] < 2:
                            refs[b] = 1  # named: its count is exact (block_pool's module doc)
                    bh[b] = RELEASED_TAG
                pool.num_named += named
            return
        if not st.tag:
            self._tags += 1
            st.tag = -(self._tags << 32)  # at most -2**32: never RELEASED_TAG
        tag, own = st.tag, st.own
        if own is None:
            own = st.own = {}
        for i in range(lo, hi):
            b, t = blocks[i], tag - i
            if bh[b] == t:
                continue  # a hit on an earlier copy: still registered, in its old place
            copies = own.get(i)
            # evicted copies left vLLM's registry; this block joins it last
            own[i] = [c for c in copies if bh[c] == t] + [b] if copies else [b]
            bh[b] = t  # a block of its own it computed: it had no name, and one holder
            pool.num_named += 1
            pool.refs[b] = 1

    # --- pure-decode stretches (Policy.decode_stretch) ----------------------------------------
    # In a pure-decode step every request of the batch asks allocate_slots for one more slot: a
    # request at context c writes token position c, which takes a new block exactly when c is a
    # multiple of block_size at or past the end of its block table, and (with prefix caching)
    # fills and registers a block when c + 1 is a multiple of block_size. No block is freed in a
    # stretch, so the new blocks leave the front of the free queue in (step, batch) order.

    def decode_blocks_needed(self, batch: list[Request], k: int) -> int:
        """New blocks ``k`` pure-decode steps of ``batch`` allocate."""
        B = self.block_size
        reqs = self._reqs
        total = 0
        for r in batch:
            need = -(-(r.num_computed_tokens + k) // B) - len(reqs[r].blocks)
            if need > 0:
                total += need
        return total

    def decode_stretch_limit(self, batch: list[Request], k: int) -> int:
        """The most steps (at most ``k``) whose new blocks the free queue holds: none of them
        can fail to allocate, so none preempts."""
        free = self.pool.num_free
        # each request needs at most ceil(k / B) <= k // B + 1 new blocks in k steps
        if len(batch) * (k // self.block_size + 1) <= free or self.decode_blocks_needed(batch, k) <= free:
            return k
        lo, hi = 0, k  # decode_blocks_needed grows with k: bisect for the last k that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_blocks_needed(batch, mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def advance_decode_stretch(self, batch: list[Request], k: int, stored0: int,
                               edged: list[Request] | None = None) -> tuple[list[int], list[int], list[int]]:
        """``Policy.advance_decodes`` for a policy whose KV is this manager (vLLM V1, TRT-LLM):
        the block work of ``k`` pure-decode steps, then each request's counters up by ``k``.
        Returns per step the blocks used, the token slots held, and the stored tokens counted
        from ``stored0`` (the policy's own count before the stretch; each step adds one a request)."""
        used0, held0 = self.num_used_blocks, self.held_token_slots
        if edged is None and not (self.enable_caching and self.num_sharing):
            # every block still to fill is its request's own: the block work and the counters in
            # one pass over the batch
            allocated = self._advance_own(batch, None, k, self.enable_caching, advance=True)
        else:
            allocated = self.advance_decodes(batch, k, edged)
            for r in batch:
                r.num_computed_tokens += k
                r.num_output_tokens += k
        b, B = len(batch), self.block_size
        totals = list(accumulate(allocated))  # blocks allocated by the end of each step
        used = [used0 + t for t in totals]
        reserved = [held0 + t * B for t in totals]
        # stored0 + b * j, j = 1..k
        stored = list(range(stored0 + b, stored0 + b * k + 1, b)) if b else [stored0] * k
        return used, reserved, stored

    def advance_decodes(self, batch: list[Request], k: int, edged: list[Request] | None = None) -> list[int]:
        """Do the block work of ``k`` pure-decode steps (the caller then advances the requests'
        counters by ``k``): every step at which a request would allocate a block or register a
        full one calls :meth:`allocate_slots` for it exactly as that step would, with the
        request's counters set to that step's values, in (step, batch) order. Returns the blocks
        allocated in each step. ``edged``: the requests of the batch, in batch order, that reach
        a block edge within the ``k`` steps (known to the caller); the others have no block work."""
        if edged is not None:
            batch = edged
        B = self.block_size
        reqs = self._reqs
        caching = self.enable_caching
        sts = [reqs[r] for r in batch]
        if not caching or not self.num_sharing or all(st.num_cached_blocks >= st.shared for st in sts):
            return self._advance_own(batch, sts, k, caching)
        events: list[tuple[int, int]] = []
        for i, r in enumerate(batch):
            st = sts[i]
            c = r.num_computed_tokens
            # block m (m >= len(blocks)) is first written at position m * B: step m * B - c + 1
            for m in range(len(st.blocks), -(-(c + k) // B)):
                events.append((m * B - c + 1, i))
            if caching and (c + k) // B > st.num_cached_blocks:
                # the next block to register fills at step (num_cached + 1) * B - c (at once if
                # it is already full), and then every B steps as the context crosses a boundary
                j = max(1, (st.num_cached_blocks + 1) * B - c)
                events.append((j, i))
                j += B - (c + j) % B
                while j <= k:
                    events.append((j, i))
                    j += B
        allocated = [0] * k
        if not events:
            return allocated
        if len(events) > 1:
            events = sorted(set(events))
        for j, i in events:
            r = batch[i]
            c, o = r.num_computed_tokens, r.num_output_tokens
            r.num_computed_tokens, r.num_output_tokens = c + j - 1, o + j - 1
            new = self.allocate_slots(r, 1)
            r.num_computed_tokens, r.num_output_tokens = c, o
            if new is None:  # decode_stretch_limit rules this out
                raise AssertionError(f"{r.id}: no block for a decode inside a checked stretch")
            allocated[j - 1] += len(new)
        return allocated

    def _advance_own(self, batch: list[Request], sts: list[_ReqKV] | None, k: int, caching: bool,
                     advance: bool = False) -> list[int]:
        """:meth:`advance_decodes` when every block still to fill is its request's own (or
        nothing is cached): registering one is a count, which ends at the last step's context
        (written through to the CPU tier as step by step: own blocks only), and what remains are
        allocations, each of one block with nothing freed in between, so popping them all at once
        hands out (and evicts) the same blocks in the same order. Events are sorted as
        ``step * len(batch) + index``: (step, batch) order. ``sts``: the requests' states (None:
        looked up); ``advance``: move each request's counters ``k`` on in the same pass."""
        B = self.block_size
        tiers = self.tiers if caching else None
        reqs = self._reqs
        n = len(batch)
        keys = []
        for i, r in enumerate(batch):
            st = reqs[r] if sts is None else sts[i]
            c = r.num_computed_tokens
            end = c + k
            if advance:
                r.num_computed_tokens = end
                r.num_output_tokens += k
            if caching:
                full = end // B
                if full > st.num_cached_blocks:
                    if tiers is not None:
                        tiers.store_own(full - st.num_cached_blocks)
                    st.num_cached_blocks = full
            # block m (m >= len(blocks)) is first written at position m * B: step m * B - c + 1
            m = len(st.blocks)
            need = -(-end // B)
            while m < need:
                keys.append((m * B - c + 1) * n + i)
                m += 1
        allocated = [0] * k
        if not keys:
            return allocated
        keys.sort()
        new = self.pool.get_new_blocks(len(keys))
        for key, block in zip(keys, new):
            j, i = divmod(key, n)
            (reqs[batch[i]] if sts is None else sts[i]).blocks.append(block)
            allocated[j - 1] += 1
        self._held_blocks += len(new)
        return allocated

    def advance_own_entries(self, buckets: list[list], k: int, num_ranks: int, batch: list[Request],
                            stored0: int) -> tuple[list[int], list[int], list[int]]:
        """:meth:`advance_decode_stretch` when every block still to fill is its request's own and
        there are no KV tiers, for the entries ``(rank, request, state)`` of an edge calendar's
        ``buckets``: those of ``batch`` that may reach a block edge within the ``k`` steps (ranks
        below ``num_ranks``, ordered as the batch is; entries in any order). Their block work as
        :meth:`_advance_own` does it (new blocks popped at once and handed out in (step, rank)
        order, registration by count), then every request of ``batch`` ``k`` on."""
        B = self.block_size
        caching = self.enable_caching
        used0, held0 = self.pool.num_used, self._held_blocks * B
        keys = []  # (step * num_ranks + rank, state): (step, batch) order
        for bucket in buckets:
            for rank, r, st in bucket:
                c = r.num_computed_tokens
                end = c + k
                if caching and end // B > st.num_cached_blocks:
                    st.num_cached_blocks = end // B
                # block m (m >= len(blocks)) is first written at position m * B: step m * B - c + 1
                m = len(st.blocks)
                while m * B < end:
                    keys.append(((m * B - c + 1) * num_ranks + rank, st))
                    m += 1
        for r in batch:
            r.num_computed_tokens += k
            r.num_output_tokens += k
        b = len(batch)
        stored = list(range(stored0 + b, stored0 + b * k + 1, b)) if b else [stored0] * k
        if not keys:
            return [used0] * k, [held0] * k, stored
        if len(keys) > 1:
            keys.sort()
        new = self.pool.get_new_blocks(len(keys))
        self._held_blocks += len(new)
        # per step the blocks used and the token slots held at its end: runs of equal values
        # between the steps that allocate
        used: list[int] = []
        held: list[int] = []
        u, h, j0 = used0, held0, 1  # the values so far; the first step not yet listed
        for (key, st), block in zip(keys, new):
            st.blocks.append(block)
            j = key // num_ranks  # the step (1-based) that writes the block's first token
            if j > j0:
                used += [u] * (j - j0)
                held += [h] * (j - j0)
                j0 = j
            u += 1
            h += B
        used += [u] * (k + 1 - j0)
        held += [h] * (k + 1 - j0)
        return used, held, stored

    def append_decode_blocks(self, states: list[_ReqKV], contexts: list[int]) -> None:
        """``allocate_slots(r, 1)`` for decodes at the end of their block tables (context a
        multiple of the block size, one past the table) whose remaining blocks are all their own
        and with no KV tiers, in the order given: each gets the next block of the free queue (one
        pop for all: the same blocks in the same order) and, with caching, registers by count the
        block its token fills."""
        new = self.pool.get_new_blocks(len(states))
        B = self.block_size
        caching = self.enable_caching
        for st, b, c in zip(states, new, contexts):
            st.blocks.append(b)
            if caching and (c + 1) // B > st.num_cached_blocks:
                st.num_cached_blocks = (c + 1) // B
        self._held_blocks += len(new)

    def release(self, req: Request) -> None:
        """Free the request's blocks and forget it (finished or rejected: it will not come back)."""
        self.free(req, _keep_own=False)
        st = self._reqs.pop(req, None)
        if st is not None and st.shared:
            self.num_sharing -= 1


class PagedDecodeStretch:
    """The fast-forward hooks (``Policy.decode_stretch_limit``, ``Policy.advance_decodes``) of a
    policy whose KV is one :class:`PagedKVManager` in ``self.kv`` and that counts its stored tokens
    in ``self._stored_tokens`` (vLLM V1, TRT-LLM). Listed before ``Policy`` among the bases, so
    these override its defaults."""

    kv: PagedKVManager
    _stored_tokens: int

    def decode_stretch_limit(self, batch: list[Request], k: int) -> int:
        return self.kv.decode_stretch_limit(batch, k)

    def advance_decodes(self, batch: list[Request], k: int,
                        edged: list[Request] | None = None) -> tuple[list[int], list[int], list[int]]:
        stored0 = self._stored_tokens
        self._stored_tokens = stored0 + len(batch) * k
        return self.kv.advance_decode_stretch(batch, k, stored0, edged)
