"""A token-granular radix-tree prefix cache with reference counts and LRU leaf eviction.

Why a tree and not vLLM's block hashes: SGLang's RadixAttention (and TGI v3's router, which
copied it) keeps every cached sequence in one radix tree whose edges are token runs. A request
reuses the longest cached prefix of its tokens, at any token (page size 1 by default), not only at
whole 16-token blocks; finished requests leave their prompt *and* output in the tree, so a later
turn of the same conversation, or a retracted request coming back, hits it too.

The rules, from the engines' sources (reference/schedulers.md §6 and §7.6):

* **Match** (``radix_cache.py::match_prefix``): walk from the root while the request's tokens
  agree with an edge; a partial match splits the edge so the matched prefix ends on a node (that
  node is what a request locks). Matches are whole pages (``page_size`` tokens). Every node on the
  path gets a fresh access time.
* **Lock** (``inc_lock_ref`` / ``dec_lock_ref``): a running request holds a reference on every
  node from its last matched node up to the root; a node with references is *protected*, one
  without is *evictable*. ``evictable_size`` and ``protected_size`` are SGLang's counters.
* **Insert** (``insert``, from ``cache_unfinished_req`` / ``cache_finished_req``): a request's
  computed tokens (page-aligned) join the tree. Tokens the tree already holds (another request
  computed them meanwhile) are duplicates: the request's own copies are freed, so physical memory
  holds one copy of each prefix.
* **Evict** (``radix_cache.py::evict`` L552, ``evict_policy.py``): least-recently-used
  evictable *leaves* first; a leaf is removed whole (SGLang), and a parent left childless and
  unlocked becomes a leaf in turn. ``evict_mode="truncate"`` is TGI's variant (``radix.rs::evict``):
  the oldest leaf is cut from its tail by just what is needed.
* **Allocate** (``mem_cache/common.py::evict_from_tree_cache``): tokens outside the tree (a
  request's uncached part) come from the free pool; when fewer are free than asked, the tree is
  evicted first (SGLang evicts the amount asked, TGI the shortfall).

Token identity without token ids: a sequence is a list of *segments* ``(key, first, length)``,
token ``i`` of a segment being ``(key, first + i)`` (``policies.base.Request``: prompt run
``(key, n)`` is segment ``(key, 0, n)``; generated tokens are ``(output_key, 0, n)``). Two
segments agree on ``m`` tokens exactly when their keys and first indices agree, so matching costs
one comparison per segment, not per token.

Memory is counted in tokens: ``capacity`` slots, of which ``tree_size`` are held by tree nodes and
``private`` by requests outside the tree; the rest is free. Access times come from a counter, one
tick per operation, so runs are deterministic (SGLang uses ``time.monotonic()``; the order of
accesses, which is all LRU reads, is the same).
"""

from __future__ import annotations

import heapq
from typing import Any

from policies.base import Request

Segment = tuple[Any, int, int]
EVICT_MODES = ("leaf", "truncate")
_MIN_COMPACT = 4096  # heap entries before the first compaction


def request_tokens(req: Request, n: int | None = None) -> list[Segment]:
    """The first ``n`` tokens (default: all) of a request's prompt plus generated tokens, as segments."""
    total = req.prompt_tokens + req.num_output_tokens
    n = total if n is None else min(n, total)
    out: list[Segment] = []
    left = n
    for key, length in req.prompt_runs:
        if left <= 0:
            break
        if length <= 0:
            continue
        take = min(length, left)
        out.append((key, 0, take))
        left -= take
    if left > 0:
        out.append((req.output_key, 0, left))
    return out


def _slice(segs: list[Segment] | tuple[Segment, ...], start: int, end: int) -> tuple[Segment, ...]:
    """Tokens ``[start, end)`` of a segment list."""
    out = []
    t = 0
    for key, first, length in segs:
        s, e = max(start, t), min(end, t + length)
        if s < e:
            out.append((key, first + s - t, e - s))
        t += length
        if t >= end:
            break
    return tuple(out)




def _shared(key: tuple[Segment, ...], seq: list[Segment], si: int, so: int, limit: int) -> int:
    """Tokens a node's key shares with ``seq`` from segment ``si``, offset ``so`` (at most ``limit``)."""
    n = ki = ko = 0
    while n < limit and ki < len(key) and si < len(seq):
        kk, kf, kl = key[ki]
        sk, sf, sl = seq[si]
        if kk != sk or kf + ko != sf + so:
            break
        m = min(kl - ko, sl - so, limit - n)
        n += m
        ko += m
        so += m
        if ko == kl:
            ki, ko = ki + 1, 0
        if so == sl:
            si, so = si + 1, 0
    return n


def _advance(seq: list[Segment], si: int, so: int, n: int) -> tuple[int, int]:
    while n > 0:
        left = seq[si][2] - so
        if n < left:
            return si, so + n
        n -= left
        si, so = si + 1, 0
    return si, so


class RadixNode:
    __slots__ = ("key", "length", "children", "parent", "lock_ref", "last_access", "uid")

    def __init__(self, key: tuple[Segment, ...], length: int, parent: RadixNode | None, uid: int) -> None:
        self.key = key
        self.length = length
        self.children: dict[Any, RadixNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0
        self.uid = uid

    def __repr__(self) -> str:
        return f"RadixNode(len={self.length}, lock={self.lock_ref}, t={self.last_access})"


class RadixCache:
    """The KV token pool of one engine with its radix prefix tree.

    ``enabled=False`` is SGLang's ``ChunkCache`` (``--disable-radix-cache``): nothing is matched or
    kept, every token a request holds is private and freed when it ends.
    """

    def __init__(self, capacity_tokens: int, page_size: int = 1, evict_mode: str = "leaf",
                 enabled: bool = True) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if evict_mode not in EVICT_MODES:
            raise ValueError(f"evict_mode must be one of {list(EVICT_MODES)}, got {evict_mode!r}")
        self.page_size = page_size
        self.capacity = capacity_tokens // page_size * page_size  # whole pages (0: none fits)
        self.evict_mode = evict_mode
        self.enabled = enabled
        self._uid = 0
        self.root = RadixNode((), 0, None, 0)
        self.root.lock_ref = 1  # the root is never evicted
        self.tree_size = 0
        self.evictable_size = 0
        self.private = 0
        self._clock = 0
        self._heap: list[tuple[int, int, RadixNode]] = []  # evictable leaves, lazily invalidated
        self._compact_at = _MIN_COMPACT  # rebuild the heap from its live entries past this length
        # statistics
        self.evicted_tokens = 0
        self.inserted_tokens = 0
        self.duplicate_tokens = 0  # computed twice and freed at insertion

    # --- memory ------------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return self.capacity - self.tree_size - self.private

    @property
    def protected_size(self) -> int:
        return self.tree_size - self.evictable_size

    @property
    def available_and_evictable(self) -> int:
        return self.free + self.evictable_size

    def ceil_page(self, n: int) -> int:
        p = self.page_size
        return -(-n // p) * p

    def floor_page(self, n: int) -> int:
        return n // self.page_size * self.page_size

    def alloc(self, n: int) -> bool:
        """Take ``n`` private token slots, evicting first if fewer are free. False (and nothing
        taken) when even eviction leaves too few."""
        if n <= 0:
            return True
        if self.free < n and self.enabled:
            self.evict(n if self.evict_mode == "leaf" else n - self.free)
        if self.free < n:
            return False
        self.private += n
        return True

    def free_private(self, n: int) -> None:
        assert 0 <= n <= self.private, (n, self.private)
        self.private -= n

    # --- tree ----------------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _child_key(self, segs, start: int = 0) -> tuple[Segment, ...]:
        """Children are found by their first page (SGLang's ``get_child_key``)."""
        return _slice(segs, start, start + self.page_size)

    def _new_node(self, key, length, parent) -> RadixNode:
        self._uid += 1
        return RadixNode(key, length, parent, self._uid)

    def _maybe_leaf(self, node: RadixNode) -> None:
        if node is not self.root and node.lock_ref == 0 and not node.children:
            heapq.heappush(self._heap, (node.last_access, node.uid, node))
            if len(self._heap) > self._compact_at:
                self._compact()

    def _live(self, entry: tuple[int, int, RadixNode]) -> bool:
        """Whether eviction would take this heap entry (the test :meth:`evict` applies)."""
        t, _uid, node = entry
        return not (node.parent is None or node.lock_ref or node.children or node.last_access != t
                    or node.parent.children.get(self._child_key(node.key)) is not node)

    def _compact(self) -> None:
        """Drop the entries eviction would skip. Every touch pushes an entry and only eviction pops
        them, so without this the heap grows with every request while the cache has room. A node
        whose entry is dropped because it is locked or has children is pushed again the moment it
        becomes an evictable leaf (``dec_lock``, ``evict``), so the pops are the same."""
        live = list({(t, uid): (t, uid, node) for t, uid, node in self._heap if self._live((t, uid, node))}.values())
        heapq.heapify(live)
        self._heap = live
        self._compact_at = max(_MIN_COMPACT, 2 * len(live))

    def _touch(self, node: RadixNode, now: int) -> None:
        node.last_access = now
        self._maybe_leaf(node)

    def _split(self, child: RadixNode, t: int, now: int) -> RadixNode:
        """Cut ``child`` after ``t`` tokens; the new upper part is returned (it keeps the locks)."""
        parent = child.parent
        upper = self._new_node(_slice(child.key, 0, t), t, parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = now
        parent.children[self._child_key(upper.key)] = upper  # the same first page as child's
        child.key = _slice(child.key, t, child.length)
        child.length -= t
        child.parent = upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def match_prefix(self, seq: list[Segment], limit: int) -> tuple[int, RadixNode]:
        """Longest cached prefix of ``seq`` (at most ``limit`` tokens, whole pages) and its last node."""
        last = (self.root, 0)
        if self.enabled:
            for last in self._walk(seq, limit):  # noqa: B007 (the walk's last node is the match)
                pass
        return last[1], last[0]

    def _walk(self, seq: list[Segment], limit: int):
        """Each node of the longest cached prefix of ``seq`` (at most ``limit`` tokens, whole pages)
        with the tokens matched through it, splitting the last one at the match's end and touching
        every node walked: the one walk that plain and hierarchical matches share."""
        node = self.root
        now = self._tick()
        limit = self.floor_page(limit)
        matched, si, so = 0, 0, 0
        while matched + self.page_size <= limit and si < len(seq):
            child = node.children.get(self._child_key(seq, matched))
            if child is None:
                return
            n = self.floor_page(_shared(child.key, seq, si, so, limit - matched))
            if n == 0:
                return
            if n < child.length:
                child = self._split(child, n, now)
            self._touch(child, now)
            node = child
            matched += n
            yield node, matched
            si, so = _advance(seq, si, so, n)

    def inc_lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= node.length
            node.lock_ref += 1
            node = node.parent

    def dec_lock(self, node: RadixNode) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "dec_lock on an unlocked node"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += node.length
                self._maybe_leaf(node)
            node = node.parent

    def insert(self, seq: list[Segment], length: int, owned_from: int, chunked: bool = False) -> int:
        """Put the first ``length`` tokens of ``seq`` (floored to whole pages) into the tree.

        The caller holds tokens ``[owned_from, length)`` privately (``owned_from`` <= what the
        tree already has of ``seq``, its locked prefix): they leave its private slots, either
        into the tree or, where the tree already has them, back to the free pool. Returns how many
        tokens the tree already had (SGLang's ``new_prefix_len``)."""
        length = self.floor_page(length)
        if not self.enabled or length <= 0:
            return 0
        now = self._tick()
        node, done, si, so = self.root, 0, 0, 0
        revived = 0
        while done < length:
            child = node.children.get(self._child_key(seq, done))
            if child is None:
                new = self._new_node(_slice(seq, done, length), length - done, node)
                new.last_access = now
                node.children[self._child_key(new.key)] = new
                self.tree_size += new.length
                self.evictable_size += new.length
                self.inserted_tokens += new.length
                self._inserted(new, chunked)
                self._maybe_leaf(new)
                self._maybe_leaf(node)
                break
            n = self.floor_page(_shared(child.key, seq, si, so, length - done))
            if n < child.length:
                child = self._split(child, n, now)
            revived += self._reached(child, chunked)
            self._touch(child, now)
            self._maybe_leaf(node)
            node = child
            done += n
            si, so = _advance(seq, si, so, n)
        already = done
        assert already >= owned_from, (already, owned_from)
        self.private -= length - owned_from
        self.duplicate_tokens += already - owned_from - revived
        assert self.private >= 0
        return already - revived

    def _inserted(self, new: RadixNode, chunked: bool) -> None:
        """A node :meth:`insert` adds (a tier below the GPU may copy it: HiCache)."""

    def _reached(self, node: RadixNode, chunked: bool) -> int:
        """An existing node :meth:`insert` walks through; the tokens it brings back to the GPU (a
        node kept only in a tier below it, recomputed: HiCache), 0 here."""
        return 0

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` (when the tree has that many evictable), LRU leaves first."""
        evicted = 0
        while evicted < num_tokens and self._heap:  # (a compaction may replace the list)
            entry = heapq.heappop(self._heap)
            if not self._live(entry):
                continue  # a stale entry: the node was locked, grew children, was touched or removed
            t, _uid, node = entry
            need = num_tokens - evicted
            if self.evict_mode == "truncate" and need < node.length:
                cut = self.ceil_page(need)
                if cut < node.length:
                    node.key = _slice(node.key, 0, node.length - cut)
                    node.length -= cut
                    self._drop(cut)
                    evicted += cut
                    heapq.heappush(self._heap, (node.last_access, node.uid, node))
                    break
            parent = node.parent
            del parent.children[self._child_key(node.key)]
            node.parent = None
            self._drop(node.length)
            evicted += node.length
            self._maybe_leaf(parent)
        return evicted

    def _drop(self, n: int) -> None:
        self.tree_size -= n
        self.evictable_size -= n
        self.evicted_tokens += n

    # --- checks (tests) ---------------------------------------------------------------------------
    def nodes(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def check_invariants(self, locks_held: dict[int, int] | None = None) -> None:
        """Raise AssertionError if sizes, locks and the tree disagree. ``locks_held``: node uid ->
        how many requests lock a path through it (optional)."""
        tree = evictable = 0
        for node in self.nodes():
            if node is self.root:
                continue
            assert node.length == sum(s[2] for s in node.key) > 0, f"{node}: bad key"
            assert node.length % self.page_size == 0, f"{node}: not whole pages"
            assert node.parent.children.get(self._child_key(node.key)) is node, f"{node}: not its parent's child"
            below = sum(c.lock_ref for c in node.children.values())
            assert node.lock_ref >= below, f"{node}: fewer locks than its children"
            tree += node.length
            if node.lock_ref == 0:
                evictable += node.length
            if locks_held is not None:
                assert node.lock_ref == locks_held.get(node.uid, 0), f"{node}: lock_ref vs holders"
        assert tree == self.tree_size, f"tree_size {self.tree_size} but nodes hold {tree}"
        assert evictable == self.evictable_size, f"evictable {self.evictable_size} but {evictable}"
        assert 0 <= self.private and self.free >= 0, f"private {self.private}, free {self.free}"


class HeldSlotsView:
    """What each request holds, in engine KV blocks: the per-request view a block manager gives
    (``gpu_blocks_of``, ``cpu_blocks_of``, ``check``), for tests that audit every policy alike."""

    def __init__(self, policy) -> None:
        self._policy = policy

    def gpu_blocks_of(self, req: Request) -> int:
        slots = self._policy.slots_held(req)
        return -(-slots // self._policy.limits.block_size)

    def cpu_blocks_of(self, req: Request) -> int:
        return 0

    def check(self) -> None:
        self._policy.check_invariants()
