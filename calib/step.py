"""One engine step: a forward pass of a mixed batch over the paged KV cache, greedy sampling.

This is the single place where calib turns a batch composition into real device work; the
profiler (which times steps of chosen shapes) and calib's real engine (which runs the steps a
policy plans) both call it, so what is timed is exactly what is run.

A batch is a list of :class:`SeqInput`: per request, how many new tokens it computes this step
(a prefill chunk or one decode token), how many tokens of it are already in the KV cache (its
context), the physical blocks holding it (its block table) and, optionally, the new token ids.
:meth:`StepRunner.prepare` builds the step's device inputs (packed ids, positions, slot
mapping, block tables); :meth:`StepRunner.execute` runs the forward pass (every layer writes
the new K/V through the slot mapping, then attends through the block tables) and returns each
request's greedy next token, computing logits only at each request's last new token, as engines
do. Requests still mid-prefill get a token too; the caller ignores it (vLLM discards it).
``execute`` never synchronises with the host, so it can be timed with device events and a
prepared step can be captured in a CUDA graph and replayed (decode steps, as engines run them).

For synthetic batches (the profiler), :class:`BlockAllocator` hands out physical blocks from the
pool (block 0 is kept back as the null block that pads block tables, as in vLLM V1) and
:func:`synthetic_batch` builds a batch of given ``(num_new_tokens, context_len)`` shapes in
one call. Whatever is in the cache serves as the context's K/V: its values do not change a
step's time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from calib.attention import paged_attention, resolve_backend
from calib.model import LlamaModel, build_model
from calib.paged import AttentionMetadata, PagedKVCache, build_metadata, cdiv, write_kv


@dataclass(frozen=True)
class SeqInput:
    """One request's part of a step."""

    num_new_tokens: int  # tokens computed this step (prefill chunk, or 1 for a decode)
    context_len: int  # tokens already in the KV cache before this step
    block_table: Sequence[int]  # physical blocks covering context_len + num_new_tokens
    token_ids: Sequence[int] | None = None  # the new tokens; None: synthetic ids


@dataclass(frozen=True)
class StepInputs:
    """A prepared step: device tensors ready for :meth:`StepRunner.execute`."""

    input_ids: torch.Tensor  # [T] int64, packed new tokens of every request
    meta: AttentionMetadata
    last_token_index: torch.Tensor  # [B] int64: each request's last new token in the packed batch

    @property
    def num_tokens(self) -> int:
        return self.meta.num_tokens

    @property
    def num_seqs(self) -> int:
        return self.meta.num_seqs


class BlockAllocator:
    """A free list of a pool's physical block ids.

    Block 0 is the null block (never handed out) unless ``reserve_null_block=False``.
    ``shuffle_seed`` shuffles the free list, so that a request's blocks are scattered over the
    pool as they are in a long-running engine (and as the correctness tests want them).
    """

    def __init__(self, num_blocks: int, *, reserve_null_block: bool = True, shuffle_seed: int | None = None) -> None:
        first = 1 if reserve_null_block else 0
        if num_blocks <= first:
            raise ValueError(f"a pool of {num_blocks} blocks has no allocatable block")
        self.num_blocks = num_blocks
        self._free = list(range(first, num_blocks))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(self._free)
        self._free.reverse()  # pop() from the end hands out blocks in list order
        self._in_use: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(
                f"KV pool exhausted: {count} blocks asked, {len(self._free)} free of {self.num_blocks}; "
                "release earlier batches or allocate a larger cache"
            )
        blocks = [self._free.pop() for _ in range(count)]
        self._in_use.update(blocks)
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            if block not in self._in_use:
                raise ValueError(f"block {block} is not allocated (double free?)")
            self._in_use.remove(block)
            self._free.append(block)


def synthetic_batch(
    shapes: Sequence[tuple[int, int]], allocator: BlockAllocator, block_size: int
) -> list[SeqInput]:
    """A batch of requests with the given ``(num_new_tokens, context_len)`` shapes, each with
    fresh blocks from ``allocator`` covering its context and new tokens, and synthetic ids.
    Give the blocks back with :func:`release`."""
    return [
        SeqInput(new, ctx, allocator.allocate(cdiv(new + ctx, block_size)))
        for new, ctx in shapes
    ]


def release(batch: Sequence[SeqInput], allocator: BlockAllocator) -> None:
    for seq in batch:
        allocator.free(seq.block_table)


def synthetic_token_ids(seq_index: int, context_len: int, count: int, vocab_size: int) -> torch.Tensor:
    """Deterministic stand-in token ids (a multiplicative hash of the position), never all zeros."""
    pos = torch.arange(context_len, context_len + count, dtype=torch.int64)
    return (pos * 2654435761 + seq_index * 40503 + 12345) % vocab_size


class StepRunner:
    """Runs steps of one model shard over one paged KV cache."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, *, attention: str = "auto") -> None:
        s = model.shape
        expected = (s.num_layers, s.num_kv_heads, s.head_dim, model.dtype, model.device)
        found = (cache.num_layers, cache.num_kv_heads, cache.head_dim, cache.dtype, cache.device)
        if expected != found:
            raise ValueError(
                "KV cache does not fit the model: (layers, kv heads, head dim, dtype, device) "
                f"model {expected}, cache {found}"
            )
        self.model = model
        self.cache = cache
        self.backend = resolve_backend(attention, cache.device)

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    def prepare(self, batch: Sequence[SeqInput]) -> StepInputs:
        """Build the step's device inputs (host work: what an engine's input preparation does)."""
        ids = []
        for b, seq in enumerate(batch):
            if seq.token_ids is None:
                ids.append(synthetic_token_ids(b, seq.context_len, seq.num_new_tokens, self.model.shape.vocab_size))
            else:
                if len(seq.token_ids) != seq.num_new_tokens:
                    raise ValueError(
                        f"request {b}: {len(seq.token_ids)} token ids given for {seq.num_new_tokens} new tokens"
                    )
                ids.append(torch.as_tensor(list(seq.token_ids), dtype=torch.int64))
        meta = build_metadata(
            [seq.num_new_tokens for seq in batch],
            [seq.context_len for seq in batch],
            [seq.block_table for seq in batch],
            self.block_size,
            device=self.cache.device,
            num_blocks=self.cache.num_blocks,
        )
        device = self.cache.device
        last = torch.cumsum(torch.as_tensor([seq.num_new_tokens for seq in batch], dtype=torch.int64), 0) - 1
        return StepInputs(
            input_ids=torch.cat(ids).to(device, non_blocking=True),
            meta=meta,
            last_token_index=last.to(device, non_blocking=True),
        )

    def _attend(self, meta: AttentionMetadata):
        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_cache, v_cache = self.cache.layer(layer)
            write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
            return paged_attention(q, k_cache, v_cache, meta, self.model.scale, self.backend)

        return attend

    @torch.inference_mode()
    def logits(self, inputs: StepInputs, *, all_tokens: bool = False) -> torch.Tensor:
        """Run the step; fp32 logits at each request's last new token ``[B, vocab]``, or at every
        new token ``[T, vocab]`` with ``all_tokens`` (tests)."""
        hidden = self.model(inputs.input_ids, inputs.meta.positions, self._attend(inputs.meta))
        if not all_tokens:
            hidden = hidden.index_select(0, inputs.last_token_index)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Run the step and return each request's greedy next token ``[B]`` (int64, on the
        device; no host synchronisation, so a caller can time it with device events)."""
        return self.logits(inputs).argmax(dim=-1)

    def step(self, batch: Sequence[SeqInput]) -> list[int]:
        """prepare + execute, next tokens as Python ints (one per request, in batch order)."""
        return self.execute(self.prepare(batch)).tolist()


def make_runner(
    spec: Any,
    *,
    num_blocks: int,
    block_size: int = 16,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    tp: int = 1,
    num_layers: int | None = None,
    attention: str = "auto",
    seed: int = 0,
    cache_init: str = "normal",
) -> StepRunner:
    """A model shard of ``spec`` and a KV cache of ``num_blocks`` blocks (block 0 included, the
    null block) on ``device``, ready to run steps. See :func:`calib.model.build_model`."""
    model = build_model(spec, tp=tp, dtype=dtype, num_layers=num_layers, device=device, seed=seed)
    s = model.shape
    cache = PagedKVCache(
        s.num_layers, num_blocks, block_size, s.num_kv_heads, s.head_dim,
        dtype=model.dtype, device=device, init=cache_init, seed=seed + 1,
    )
    return StepRunner(model, cache, attention=attention)
