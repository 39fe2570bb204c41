"""KV tiers below the GPU: CPU memory (vLLM's ``--kv-offloading-size``) and further tiers (disk),
each an LRU of block hashes, as vLLM's KV offloading keeps them.

Why: a prefix evicted from the GPU prefix cache is recomputed unless a lower tier still holds its
KV; chat and agent sessions resend their whole history after seconds to minutes of thinking, and
whether that history is loaded over PCIe or recomputed decides the returning turn's TTFT.

What each backend writes, when, and how a hit is loaded (the engines' rules):

* ``native`` (vLLM's ``OffloadingConnector``, what ``--kv-offloading-backend native`` configures:
  ``vllm/config/vllm.py`` sets ``kv_connector = "OffloadingConnector"`` with
  ``cpu_bytes_to_use = kv_offloading_size * (1 << 30)``; ``kv_offloading_size`` is the total over
  the TP ranks, ``vllm/config/cache.py`` ``CacheConfig.kv_offloading_size``). **Write-through**:
  after every forward pass the worker stores the blocks that became full
  (``offloading_connector.py`` ``wait_for_save`` -> ``prepare_store_kv``), asynchronously, so the
  store costs the step nothing; the CPU store is an LRU (``vllm/v1/kv_offload/lru_manager.py``);
  a lookup touches the request's blocks. **Loads are asynchronous**: the scheduler's
  ``get_num_new_matched_tokens`` returns ``(num_hit_tokens, True)`` ("loaded asynchronously,
  between scheduler steps", ``offloading/scheduler.py``): the request waits for the remote KV,
  and is scheduled at the first step after its load finished. The delay is a whole number of
  scheduler steps (BLIS's observation on real vLLM runs); here: the request's compute starts one
  step later, and the step during which it loads lasts at least the load (the copy runs on its
  own stream beside that step's compute).
* ``lmcache`` (``LMCacheConnectorV1``). Write-through as well (``save_kv_layer`` / ``wait_for_save``
  store each computed chunk), in chunks of ``LMCACHE_CHUNK_SIZE`` = 256 tokens by default (a hit
  is whole chunks: :attr:`TierStore.chunk_blocks`). Loads are **synchronous** unless LMCache's
  ``async_loading`` is on: ``get_num_new_matched_tokens`` returns ``load_async = False`` and the
  worker retrieves the KV in ``start_load_kv`` / ``wait_for_layer_load`` before the layers that
  read it, so the load's time is on that step's critical path (added to the step).

A tier that overflows demotes its least recently used block to the next tier (written there,
``write_bps``) or, from the last, drops it. Every hash is in at most one lower tier
(:meth:`TierStore.check_invariants`). Transfer time is ``bytes / bandwidth`` per tier: the CPU
tier's is the GPU's PCIe bandwidth in one direction (``sim/hardware/gpus.py``), a further tier's
its own ``read_gbps`` / ``write_gbps``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

BACKENDS = ("native", "lmcache")
LMCACHE_CHUNK_TOKENS = 256  # LMCache's default LMCACHE_CHUNK_SIZE


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One tier below the GPU: ``capacity_blocks`` KV blocks, read (to the GPU) and write
    bandwidths in bytes per second."""

    name: str
    capacity_blocks: int
    read_bps: float
    write_bps: float


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """What a policy needs to build its :class:`TierStore` (``EngineLimits.kv_offload``)."""

    backend: str
    tiers: tuple[TierSpec, ...]
    block_bytes: int  # bytes of one KV block over all TP ranks

    def store(self, block_size: int) -> TierStore:
        chunk = max(1, LMCACHE_CHUNK_TOKENS // block_size) if self.backend == "lmcache" else 1
        return TierStore(
            self.tiers, self.block_bytes, chunk_blocks=chunk, async_load=self.backend == "native"
        )


class TierStore:
    """The lower tiers of one replica: an LRU of block hashes per tier and the traffic counters."""

    def __init__(
        self, tiers: Iterable[TierSpec], block_bytes: int, chunk_blocks: int = 1, async_load: bool = True
    ) -> None:
        self.tiers = tuple(tiers)
        if not self.tiers:
            raise ValueError("a tier store needs at least one tier")
        for t in self.tiers:
            if t.capacity_blocks < 1 or not t.read_bps > 0 or not t.write_bps > 0:
                raise ValueError(f"tier {t.name!r}: capacity and bandwidths must be positive")
        self.block_bytes = block_bytes
        self.chunk_blocks = chunk_blocks
        self.async_load = async_load
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in self.tiers]
        self._where: dict[int, int] = {}
        n = len(self.tiers)
        self.hit_blocks = [0] * n  # blocks loaded from each tier
        self.written_blocks = [0] * n  # blocks written into each tier (stores and demotions)
        self.read_blocks = [0] * n  # blocks read out of each tier (loads)
        self.dropped_blocks = 0  # blocks that fell off the last tier
        self._anon = 0  # keys of own blocks: -1, -2, ... (content hashes are positive)

    # --- contents ------------------------------------------------------------------------------
    def tier_of(self, h: int) -> int | None:
        return self._where.get(h)

    def num_blocks(self, tier: int) -> int:
        return len(self._lru[tier])

    def store(self, h: int) -> None:
        """The GPU computed block ``h`` (write-through): keep it in the first tier, unless a tier
        holds it already (vLLM's ``prepare_store`` skips blocks already offloaded)."""
        if h in self._where:
            return
        self._insert(0, h)

    def store_own(self, n: int) -> None:
        """``n`` blocks of content no other request holds (``Request.shareable_tokens``): written
        through and taking room like any block, but never hit, so each is a fresh anonymous key."""
        for _ in range(n):
            self._anon -= 1
            self._insert(0, self._anon)

    def _insert(self, t: int, h: int) -> None:
        lru = self._lru[t]
        lru[h] = None
        self._where[h] = t
        self.written_blocks[t] += 1
        cap = self.tiers[t].capacity_blocks
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            del self._where[old]
            if t + 1 < len(self.tiers):
                self._insert(t + 1, old)
            else:
                self.dropped_blocks += 1

    # --- hits ------------------------------------------------------------------------------------
    def lookup(self, hashes: Iterable[int]) -> list[int]:
        """The tier of each leading block found (stops at the first miss), cut to whole chunks."""
        where = self._where
        found: list[int] = []
        for h in hashes:
            t = where.get(h)
            if t is None:
                break
            found.append(t)
        if self.chunk_blocks > 1:
            del found[len(found) - len(found) % self.chunk_blocks :]
        return found

    def touch(self, hashes: Iterable[int]) -> None:
        """Most recently used, in order (a lookup's hits: vLLM's ``manager.touch``)."""
        where, lrus = self._where, self._lru
        for h in hashes:
            t = where.get(h)
            if t is not None:
                lrus[t].move_to_end(h)

    def load(self, hashes: list[int], tiers: list[int]) -> float:
        """Load these blocks to the GPU (each stays in its tier, most recently used): the
        seconds the copies take, tier by tier."""
        seconds = 0.0
        bb = self.block_bytes
        for h, t in zip(hashes, tiers):
            lru = self._lru[t]
            if h in lru:  # (the request's own stores may have pushed it down since the lookup:
                lru.move_to_end(h)  # its copy was issued first, as vLLM pins blocks being loaded)
            self.hit_blocks[t] += 1
            self.read_blocks[t] += 1
            seconds += bb / self.tiers[t].read_bps
        return seconds

    def check_invariants(self) -> None:
        """Every hash in exactly one tier, no tier over capacity, counters consistent."""
        seen = 0
        for t, lru in enumerate(self._lru):
            assert len(lru) <= self.tiers[t].capacity_blocks, f"tier {self.tiers[t].name} over capacity"
            for h in lru:
                assert self._where.get(h) == t, (
                    f"block {h} listed in tier {t} but placed in {self._where.get(h)}"
                )
            seen += len(lru)
        assert seen == len(self._where), "a hash is in two tiers or in none it is placed in"
        # every block written into tier t is still there, demoted to t + 1, or (last) dropped
        for t in range(len(self.tiers)):
            out = self.written_blocks[t + 1] if t + 1 < len(self.tiers) else self.dropped_blocks
            assert self.written_blocks[t] == len(self._lru[t]) + out, f"tier {t}: blocks not conserved"

    def report(self, block_size: int) -> dict:
        """Per tier: hit tokens, bytes written and read, blocks held (the summary's ``kv_tiers``)."""
        bb = self.block_bytes
        return {
            t.name: {
                "hit_tokens": self.hit_blocks[i] * block_size,
                "bytes_written": self.written_blocks[i] * bb,
                "bytes_read": self.read_blocks[i] * bb,
                "blocks_held": len(self._lru[i]),
                "capacity_blocks": t.capacity_blocks,
            }
            for i, t in enumerate(self.tiers)
        }
