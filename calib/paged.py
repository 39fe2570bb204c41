"""A paged KV cache as serving engines hold it, and paged attention over it.

Engines do not keep one contiguous K/V tensor per request: they keep, per layer, a pool of
fixed-size *blocks* ``[num_blocks, block_size, num_kv_heads, head_dim]`` for K and for V, and
give each request a *block table* (its logical block ``i`` lives in physical block
``table[i]``). New K/V are written through a *slot mapping* (``slot = block * block_size +
offset``), and attention reads K/V back through the block table (Kwon et al., "Efficient Memory
Management for Large Language Model Serving with PagedAttention", SOSP 2023).

A step is a *mixed* batch: prefill chunks (with the context computed in earlier steps) and
decodes, packed into one token dimension. ``query_start_loc`` (cumulative new-token counts, the
``cu_seqlens`` of varlen attention) says which packed tokens belong to which request; request
``b``'s new token ``i`` sits at absolute position ``context_lens[b] + i`` and attends to every
position up to and including its own (causal within the new tokens, full over the context).

This module holds the cache, the per-step metadata, the slot-mapping write and the *reference*
attention (plain torch, gathers each request's blocks: clear, not fast). The fast GPU path that
reads K/V through the block table inside a Triton kernel is :mod:`calib.paged_triton`;
:func:`calib.attention.paged_attention` chooses between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

BACKENDS = ("reference", "triton", "auto")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PagedKVCache:
    """Per-layer K and V block pools, held in one allocation so blocks can be copied in bulk.

    ``data`` has shape ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``;
    :meth:`layer` returns that layer's contiguous K and V block tensors (views). Block 0 is a
    valid block like any other; allocators here keep it as the *null block* (padding entries
    of block tables point at it), as vLLM V1 does.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        init: str = "normal",
        seed: int = 0,
    ) -> None:
        if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) < 1:
            raise ValueError(
                f"PagedKVCache needs positive sizes, got num_layers={num_layers} num_blocks={num_blocks} "
                f"block_size={block_size} num_kv_heads={num_kv_heads} head_dim={head_dim}"
            )
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        self.data = torch.empty(shape, dtype=dtype, device=device)
        if init == "normal":
            # Random content, never zeros: zeros can make kernels look faster than real data.
            gen = torch.Generator(device=self.data.device).manual_seed(seed)
            for layer in range(num_layers):
                self.data[layer].normal_(0.0, 1.0, generator=gen)
        elif init == "zeros":
            self.data.zero_()
        elif init != "empty":
            raise ValueError(f"PagedKVCache init must be 'normal', 'zeros' or 'empty', got {init!r}")

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K blocks, V blocks) of one layer, each ``[num_blocks, block_size, kv_heads, head_dim]``."""
        return self.data[index, 0], self.data[index, 1]

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Device bytes one block costs across all layers, K and V (what bounds the pool size)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


@dataclass(frozen=True)
class AttentionMetadata:
    """Everything attention needs about one step's batch, built once and shared by all layers.

    Device tensors: ``query_start_loc`` [B+1] int32 (cumulative new tokens), ``seq_lens`` [B]
    int32 (context + new tokens: the K/V length after this step's write), ``block_tables``
    [B, max_blocks] int32 (padded with the null block 0), ``slot_mapping`` [T] int64 and
    ``positions`` [T] int64. Host copies of the per-request lengths ride along so that
    launches can be sized without reading the device.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(q + c for q, c in zip(self.query_lens, self.context_lens))

    def to(self, device: str | torch.device) -> AttentionMetadata:
        """The same metadata with its tensors on ``device``."""
        moved = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return AttentionMetadata(**moved)


def build_metadata(
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: str | torch.device = "cpu",
    num_blocks: int | None = None,
) -> AttentionMetadata:
    """Build a step's metadata from per-request new-token counts, context lengths and block tables.

    Each block table must cover the request's context plus its new tokens; ``num_blocks``, when
    given, bounds the block ids (the pool size). Slot mapping: new token ``i`` of request ``b``
    goes to absolute position ``p = context_lens[b] + i``, i.e. slot
    ``block_tables[b][p // block_size] * block_size + p % block_size``.
    """
    n = len(query_lens)
    if n == 0 or len(context_lens) != n or len(block_tables) != n:
        raise ValueError(
            f"a step needs at least one request and one context length and block table per request; "
            f"got {n} query lengths, {len(context_lens)} context lengths, {len(block_tables)} block tables"
        )
    for b, (q, c, table) in enumerate(zip(query_lens, context_lens, block_tables)):
        if q < 1 or c < 0:
            raise ValueError(f"request {b}: num_new_tokens must be >= 1 and context_len >= 0, got {q} and {c}")
        need = cdiv(q + c, block_size)
        if len(table) < need:
            raise ValueError(
                f"request {b}: block table has {len(table)} blocks but context {c} + new tokens {q} "
                f"need {need} blocks of {block_size}"
            )

    needs = [cdiv(q + c, block_size) for q, c in zip(query_lens, context_lens)]
    table_rows = np.zeros((n, max(needs)), dtype=np.int32)  # numpy fills rows from lists fastest
    for b, (table, need) in enumerate(zip(block_tables, needs)):
        table_rows[b, :need] = table[:need]
    tables = torch.from_numpy(table_rows)
    if num_blocks is not None and (int(tables.min()) < 0 or int(tables.max()) >= num_blocks):
        bad = next(b for b in range(n) if not (0 <= int(tables[b].min()) and int(tables[b].max()) < num_blocks))
        raise ValueError(f"request {bad}: block table {tables[bad].tolist()} has ids outside the pool [0, {num_blocks})")

    q_lens = torch.as_tensor(list(query_lens), dtype=torch.int64)
    c_lens = torch.as_tensor(list(context_lens), dtype=torch.int64)
    starts = torch.zeros(n + 1, dtype=torch.int64)
    starts[1:] = torch.cumsum(q_lens, 0)
    total = int(starts[-1])
    seq_of_token = torch.repeat_interleave(torch.arange(n), q_lens)
    positions = c_lens[seq_of_token] + (torch.arange(total) - starts[seq_of_token])
    blocks = tables[seq_of_token, positions // block_size].to(torch.int64)
    slots = blocks * block_size + positions % block_size

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, non_blocking=True)

    return AttentionMetadata(
        query_start_loc=put(starts.to(torch.int32)),
        seq_lens=put((q_lens + c_lens).to(torch.int32)),
        block_tables=put(tables),
        slot_mapping=put(slots),
        positions=put(positions),
        query_lens=tuple(int(q) for q in query_lens),
        context_lens=tuple(int(c) for c in context_lens),
        block_size=block_size,
    )


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V ``[T, kv_heads, head_dim]`` into their slots of one layer's block pools.

    Touches exactly the rows named by ``slot_mapping`` (block * block_size + offset), nothing else.
    """
    kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Reference paged attention: gather each request's blocks, attend in fp32, one request at a time.

    ``q`` is ``[T, num_heads, head_dim]`` (packed new tokens); query head ``h`` reads KV head
    ``h // (num_heads // num_kv_heads)`` (grouped-query attention). Returns ``[T, num_heads,
    head_dim]`` in ``q``'s dtype. Materialises a contiguous K/V copy per request: this is the
    slow, obviously-correct path the fast kernel is checked against.
    """
    num_heads = q.shape[1]
    _, block_size, kv_heads, head_dim = k_cache.shape
    group = num_heads // kv_heads
    out = torch.empty_like(q)
    start = 0
    for b, (q_len, ctx) in enumerate(zip(meta.query_lens, meta.context_lens)):
        seq_len = ctx + q_len
        blocks = meta.block_tables[b, : cdiv(seq_len, block_size)].long()
        k = k_cache[blocks].reshape(-1, kv_heads, head_dim)[:seq_len].float()
        v = v_cache[blocks].reshape(-1, kv_heads, head_dim)[:seq_len].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        qb = q[start : start + q_len].float()
        scores = torch.einsum("qhd,khd->hqk", qb, k) * scale
        q_pos = ctx + torch.arange(q_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start : start + q_len] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
        start += q_len
    return out
