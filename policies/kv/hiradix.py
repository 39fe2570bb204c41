"""SGLang's hierarchical cache (HiCache): the radix tree of :mod:`policies.kv.radix` with a host-memory
tier below the GPU pool (``--enable-hierarchical-cache``).

Why: a session that comes back after its history was evicted from the GPU pool recomputes it with
plain RadixAttention; with HiCache the evicted nodes keep a copy in host memory and are loaded
back over PCIe, layer by layer while the forward pass runs.

The rules, from sgl-project/sglang ``python/sglang/srt/mem_cache/hiradix_cache.py`` (commit
263bc85d), ``memory_pool_host.py`` and ``managers/cache_controller.py``:

* **Host pool** (``HostKVCache.__init__``): ``hicache_size`` GB (1e9 bytes) per TP rank when it is
  above 0, else ``hicache_ratio`` × the device pool's tokens (default ratio 2.0); it must be larger
  than the device pool ("The host memory should be larger than the device memory with the current
  protocol"). Counted in tokens here, as SGLang's host allocator counts slots.
* **Write policy** (``hicache_write_policy``, default ``write_through``): every node an insertion
  walks through or creates gets a hit (``_inc_hit_count``, skipped for a chunked request's partial
  insert); a node not yet on the host is written there once its hits reach
  ``write_through_threshold`` = 1 for ``write_through``, 2 for ``write_through_selective``.
  ``write_back`` counts no hits and writes a node only when it is evicted from the GPU, and that
  eviction waits for the writes (``evict`` -> ``writing_check(write_back=True)`` synchronizes), so
  their copy time is on the step. Write-through copies run on their own stream and cost the step
  nothing (cbsim: they complete before the next step; the real node stays locked until acked).
* **Device eviction** (``evict``): LRU over *device leaves* (a node on the GPU whose children are
  all off it); a node with a host copy only drops its GPU copy and stays in the tree (host-only,
  "evicted"); one without is deleted (``_evict_regular``). A node's parent becomes a device leaf
  once all its children are off the GPU.
* **Host eviction** (``evict_host``, when a write finds the host pool full): LRU over leaves of the
  whole tree that are host-only; each is deleted, and its parent may become such a leaf.
* **Match** (``match_prefix``): the walk continues through host-only nodes; the device hit is the
  prefix on the GPU, ``host_hit_length`` the host-only nodes after it.
* **Load back** (``init_load_back`` / ``load_back``, called by ``PrefillAdder.add_one_req`` for a
  request with a host hit): every host-only node up to the last hit is loaded, all or nothing,
  unless fewer than ``load_back_threshold`` = 10 tokens; GPU room is made by evicting (the ancestor
  locked), and if it cannot be made the request computes those tokens. Loaded nodes keep their
  host copy.
* **Overlap** (``cache_controller.py`` ``LayerDoneCounter``; the KV pools' ``get_key_buffer`` call
  ``layer_transfer_counter.wait_until(layer_id)``): the loads of a prefill batch start with it and
  run layer by layer on a load stream; layer ``i``'s attention waits for layer ``i``'s copy. With
  ``L`` layers, compute ``c`` and load ``h`` spread evenly, the batch takes
  ``max(h + c / L, h / L + c)`` (:func:`layerwise_overlap`).

Not modelled: the L3 storage backends (``hicache_storage_backend``: Mooncake, 3FS, NIXL, file),
prefetch, the node locks held while a write-through copy is in flight, and host-memory bandwidth
contention between writes and loads.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from policies.kv.radix import RadixCache, RadixNode

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
LOAD_BACK_THRESHOLD = 10  # tokens: smaller host hits are recomputed (HiRadixCache.load_back_threshold)
DEFAULT_HICACHE_RATIO = 2.0  # server_args.py hicache_ratio


@dataclass(frozen=True, slots=True)
class HostLink:
    """What pricing KV copies between a replica's GPUs and host memory needs (``EngineLimits.kv_host_link``):
    bytes of one token's KV on one TP rank and over all ranks, the bytes per second of the host
    link over all ranks (each rank copies its own shard over its own link), and the layer count."""

    rank_token_bytes: float
    token_bytes: float
    link_bps: float
    layers: int

    def seconds(self, tokens: int) -> float:
        return tokens * self.token_bytes / self.link_bps


# what knob checks build a policy with before a deployment is resolved (sim.scenario.schema): Llama-3-8B's
# 128 KiB a token over a PCIe Gen5 x16 link one way, 32 layers
NOMINAL_HOST_LINK = HostLink(2.0**17, 2.0**17, 64e9, 32)


def layerwise_overlap(compute_s: float, load_s: float, layers: int) -> float:
    """A forward pass of ``compute_s`` whose layer ``i`` waits for the ``i``-th of ``layers`` equal
    copies of ``load_s`` in all (SGLang's ``LayerDoneCounter``): the copies run back to back on
    their own stream, so the pass ends after the last copy plus one layer's compute, or after
    all the compute plus the first copy, whichever is later."""
    if load_s <= 0:
        return compute_s
    n = max(int(layers), 1)
    return max(load_s + compute_s / n, load_s / n + compute_s)


def host_pool_tokens(
    device_tokens: int, page_size: int, ratio: float, size_gb: float, rank_token_bytes: float
) -> int:
    """SGLang's host pool in tokens (``HostKVCache.__init__``), page aligned; ValueError naming the
    knob when it is not larger than the device pool."""
    if size_gb > 0:
        size = int(size_gb * 1e9 // rank_token_bytes)
        what = f"hicache_size {size_gb:g} GB holds {size:,} tokens"
    else:
        size = int(device_tokens * ratio)
        what = f"hicache_ratio {ratio:g} gives {size:,} tokens"
    size -= size % page_size
    if size <= device_tokens:
        raise ValueError(
            f"sglang {what}, not more than the GPU pool's {device_tokens:,} (SGLang requires the "
            f"host pool to be larger); raise it"
        )
    return size


class HiNode(RadixNode):
    __slots__ = ("device", "host", "hits")

    def __init__(self, key, length, parent, uid) -> None:
        super().__init__(key, length, parent, uid)
        self.device = True  # has its KV on the GPU (SGLang: not node.evicted)
        self.host = False  # has a copy in host memory (SGLang: node.backuped)
        self.hits = 0


class HiRadixCache(RadixCache):
    """A :class:`RadixCache` whose evicted nodes may live on in a host pool of ``host_capacity`` tokens.

    ``tree_size`` / ``evictable_size`` count the nodes on the GPU (what the GPU pool holds);
    ``host_size`` the tokens of the nodes with a host copy. Traffic counters, in tokens:
    ``written_tokens`` (GPU to host), ``loaded_tokens`` (host to GPU), ``host_evicted_tokens``.
    ``write_back_tokens`` accumulates the write-back copies an eviction waited for, for the step
    that caused them to take (:meth:`take_write_back`)."""

    def __init__(
        self,
        capacity_tokens: int,
        host_capacity: int,
        page_size: int = 1,
        write_policy: str = "write_through",
        token_bytes: float = 0.0,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(
                f"sglang hicache_write_policy must be one of {list(WRITE_POLICIES)}, got {write_policy!r}"
            )
        super().__init__(capacity_tokens, page_size, "leaf", True)
        self.root = HiNode((), 0, None, 0)
        self.root.lock_ref = 1
        self.host_capacity = host_capacity // page_size * page_size
        self.write_policy = write_policy
        self.threshold = 1 if write_policy == "write_through" else 2
        self.host_size = 0
        self.token_bytes = token_bytes  # of one token over all TP ranks (the report's bytes)
        self._host_heap: list[tuple[int, int, HiNode]] = []
        self._host_compact_at = 4096
        self.written_tokens = 0
        self.loaded_tokens = 0
        self.host_evicted_tokens = 0
        self.write_back_tokens = 0
        self._loading: set[int] | tuple = ()  # ids of the nodes a load-back is bringing to the GPU

    # --- nodes -------------------------------------------------------------------------------------
    def _new_node(self, key, length, parent) -> HiNode:
        self._uid += 1
        return HiNode(key, length, parent, self._uid)

    def _split(self, child: HiNode, t: int, now: int) -> HiNode:
        upper = super()._split(child, t, now)
        upper.device, upper.host, upper.hits = child.device, child.host, child.hits
        return upper

    def _device_leaf(self, node: HiNode) -> bool:
        return node.device and all(not c.device for c in node.children.values())

    def _maybe_leaf(self, node: HiNode) -> None:
        if node is self.root:
            return
        if node.device:
            if node.lock_ref == 0 and self._device_leaf(node):
                heapq.heappush(self._heap, (node.last_access, node.uid, node))
                if len(self._heap) > self._compact_at:
                    self._compact()
        elif not node.children:
            heapq.heappush(self._host_heap, (node.last_access, node.uid, node))
            if len(self._host_heap) > self._host_compact_at:
                live = [e for e in dict.fromkeys(self._host_heap) if self._host_live(e)]
                heapq.heapify(live)
                self._host_heap = live
                self._host_compact_at = max(4096, 2 * len(live))

    def _attached(self, node: HiNode) -> bool:
        return node.parent is not None and node.parent.children.get(self._child_key(node.key)) is node

    def _live(self, entry) -> bool:
        t, _uid, node = entry
        return (
            node.device
            and not node.lock_ref
            and node.last_access == t
            and self._attached(node)
            and self._device_leaf(node)
        )

    def _host_live(self, entry) -> bool:
        t, _uid, node = entry
        return (
            not node.device
            and not node.children
            and node.last_access == t
            and self._attached(node)
            and id(node) not in self._loading
        )

    # --- match and load back ------------------------------------------------------------------------
    def match_tiers(self, seq, limit: int) -> tuple[int, HiNode, int, HiNode]:
        """``(device tokens, last device node, host tokens after them, last host node)`` of the longest
        cached prefix of ``seq`` (at most ``limit`` tokens, whole pages); every node walked is touched."""
        node, matched = self.root, 0
        device_len, device_node = 0, node
        for node, matched in self._walk(seq, limit):
            if node.device:
                device_len, device_node = matched, node
        return device_len, device_node, matched - device_len, node

    def match_prefix(self, seq, limit: int):
        device_len, device_node, _host_len, _host_node = self.match_tiers(seq, limit)
        return device_len, device_node

    def load_back(self, last: HiNode) -> int:
        """Load the host-only nodes from ``last`` up to the GPU (all or nothing): the tokens loaded,
        0 when under ``LOAD_BACK_THRESHOLD`` or when the GPU pool cannot make room."""
        nodes = []
        node = last
        while not node.device:
            nodes.append(node)
            node = node.parent
        total = sum(n.length for n in nodes)
        if total < LOAD_BACK_THRESHOLD:
            return 0
        self.inc_lock(node)  # the ancestor on the GPU is not evicted to make room
        self._loading = {id(n) for n in nodes}  # nor are the nodes to load dropped from the host by
        try:  # the room a write-back eviction makes there
            if self.free < total:
                self.evict(total)
            if self.free < total:
                return 0
        finally:
            self.dec_lock(node)
            self._loading = ()
            for n in nodes:
                self._maybe_leaf(n)  # their host-leaf entries may have been passed over
        for n in nodes:
            n.device = True
            self.tree_size += n.length
            self.evictable_size += n.length
            self._maybe_leaf(n)
        self._maybe_leaf(node)  # no longer a device leaf (its child is back): the entry goes stale
        self.loaded_tokens += total
        return total

    # --- insert ---------------------------------------------------------------------------------------
    def _hit(self, node: HiNode, chunked: bool) -> None:
        if self.write_policy == "write_back" or chunked:
            return
        node.hits += 1
        if not node.host and node.hits >= self.threshold:
            self._write(node)

    def _write(self, node: HiNode) -> bool:
        """Copy a GPU node to host memory, evicting host-only leaves for room (``write_backup``)."""
        n = node.length
        if self.host_capacity - self.host_size < n:
            self.evict_host(n - (self.host_capacity - self.host_size))
        if self.host_capacity - self.host_size < n:
            return False
        node.host = True
        self.host_size += n
        self.written_tokens += n
        return True

    def _inserted(self, new: HiNode, chunked: bool) -> None:
        if self.write_policy != "write_back":
            self._hit(new, chunked)

    def _reached(self, node: HiNode, chunked: bool) -> int:
        if node.device:
            self._hit(node, chunked)
            return 0
        node.device = True  # recomputed while only on the host: its GPU copy is back
        self.tree_size += node.length
        self.evictable_size += node.length
        return node.length

    # --- eviction --------------------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        evicted = 0
        written = []
        while evicted < num_tokens and self._heap:
            entry = heapq.heappop(self._heap)
            if not self._live(entry):
                continue
            node = entry[2]
            parent = node.parent
            if not node.host and self.write_policy == "write_back" and self._write(node):
                written.append(node)
            if node.host:  # keep the host copy, drop the GPU one
                node.device = False
                self.tree_size -= node.length
                self.evictable_size -= node.length
                self.evicted_tokens += node.length
                evicted += node.length
                self._maybe_leaf(node)
            else:
                evicted += self._delete(node)
            self._maybe_leaf(parent)
        if written:
            self.write_back_tokens += sum(n.length for n in written)
        return evicted

    def _delete(self, node: HiNode) -> int:
        """Remove a GPU node without a host copy and whatever hangs below it (only host-only
        nodes can: their host copies go too). Returns the GPU tokens freed."""
        del node.parent.children[self._child_key(node.key)]
        node.parent = None
        freed = 0
        stack = [node]
        while stack:
            x = stack.pop()
            if x.device:
                self.tree_size -= x.length
                self.evictable_size -= x.length
                self.evicted_tokens += x.length
                freed += x.length
            if x.host:
                self.host_size -= x.length
                self.host_evicted_tokens += x.length
            stack.extend(x.children.values())
        return freed

    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` host slots (when there are that many host-only leaves), LRU first."""
        evicted = 0
        while evicted < num_tokens and self._host_heap:
            entry = heapq.heappop(self._host_heap)
            if not self._host_live(entry):
                continue
            node = entry[2]
            parent = node.parent
            del parent.children[self._child_key(node.key)]
            node.parent = None
            self.host_size -= node.length
            self.host_evicted_tokens += node.length
            evicted += node.length
            self._maybe_leaf(parent)
        return evicted

    def report(self, block_size: int) -> dict:
        """The summary's ``kv_tiers`` row of the host tier (as :meth:`policies.kv.tiers.TierStore.report`)."""
        token_bytes = self.token_bytes
        return {
            "host": {
                "hit_tokens": self.loaded_tokens,
                "bytes_written": int(self.written_tokens * token_bytes),
                "bytes_read": int(self.loaded_tokens * token_bytes),
                "blocks_held": self.host_size // block_size,
                "capacity_blocks": self.host_capacity // block_size,
            }
        }

    def take_write_back(self) -> int:
        """The write-back tokens copied since the last call (the step that waited for them)."""
        n, self.write_back_tokens = self.write_back_tokens, 0
        return n

    # --- checks ------------------------------------------------------------------------------------------
    def check_invariants(self, locks_held=None) -> None:
        """The radix checks with two tiers: every node on the GPU, in host memory or both, never
        neither; GPU nodes closed under parents; GPU tokens = ``tree_size``, host tokens =
        ``host_size`` <= the host pool; locks only on GPU nodes."""
        tree = evictable = host = 0
        for node in self.nodes():
            if node is self.root:
                continue
            assert node.length == sum(s[2] for s in node.key) > 0, f"{node}: bad key"
            assert node.length % self.page_size == 0, f"{node}: not whole pages"
            assert self._attached(node), f"{node}: not its parent's child"
            assert node.device or node.host, f"{node}: in no tier"
            if node.device:
                assert node.parent is self.root or node.parent.device, (
                    f"{node}: on the GPU below a host-only node"
                )
                tree += node.length
                if node.lock_ref == 0:
                    evictable += node.length
            else:
                assert node.lock_ref == 0, f"{node}: locked but not on the GPU"
            if node.host:
                host += node.length
            below = sum(c.lock_ref for c in node.children.values())
            assert node.lock_ref >= below, f"{node}: fewer locks than its children"
            if locks_held is not None:
                assert node.lock_ref == locks_held.get(node.uid, 0), f"{node}: lock_ref vs holders"
        assert tree == self.tree_size, f"tree_size {self.tree_size} but GPU nodes hold {tree}"
        assert evictable == self.evictable_size, f"evictable {self.evictable_size} but {evictable}"
        assert host == self.host_size <= self.host_capacity, f"host {self.host_size} vs nodes {host}"
        assert 0 <= self.private and self.free >= 0, f"private {self.private}, free {self.free}"
