"""The paged KV cache and the reference paged attention, on the CPU.

Ground truth is dense causal attention over each request's whole sequence, computed in float64
by torch's own SDPA; the paged path must agree for mixed batches whose physical blocks are
scattered (shuffled) over the pool, and writes through the slot mapping must touch nothing but
their own slots.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from calib.paged import (
    PagedKVCache,
    build_metadata,
    cdiv,
    paged_attention_reference,
    write_kv,
)
from calib.step import BlockAllocator

# (query_len, context_len) per request: fresh prefills, prefill chunks on top of earlier
# context, and decodes, in one batch.
MIXED = [(7, 0), (1, 9), (3, 5), (1, 30), (20, 2), (1, 1), (5, 16)]


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """[S, H, D] causal attention over a whole sequence, float64, GQA by repeating KV heads."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.double().transpose(0, 1) for t in (q, k, v))
    k64 = k64.repeat_interleave(group, dim=0)
    v64 = v64.repeat_interleave(group, dim=0)
    return F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, scale=scale).transpose(0, 1)


def scattered_tables(shapes, block_size: int, allocator: BlockAllocator) -> list[list[int]]:
    return [allocator.allocate(cdiv(q + c, block_size)) for q, c in shapes]


def fill_and_query(shapes, *, block_size, num_heads, kv_heads, head_dim, num_blocks=128, seed=0, dtype=torch.float32):
    """Random whole sequences per request, their K/V written into a shuffled paged pool.

    Returns (pool K, pool V, step metadata, packed queries of the new tokens, dense outputs of
    the new tokens, scale).
    """
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, init="normal", seed=seed)
    k_cache, v_cache = cache.layer(0)
    tables = scattered_tables(shapes, block_size, BlockAllocator(num_blocks, shuffle_seed=seed))
    scale = 1.0 / math.sqrt(head_dim)
    qs, dense = [], []
    for (q_len, ctx), table in zip(shapes, tables):
        seq = q_len + ctx
        q = torch.randn(seq, num_heads, head_dim, generator=gen).to(dtype)
        k = torch.randn(seq, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(seq, kv_heads, head_dim, generator=gen).to(dtype)
        whole = build_metadata([seq], [0], [table], block_size)  # the slots of every position
        write_kv(k_cache, v_cache, k, v, whole.slot_mapping)
        qs.append(q[ctx:])
        dense.append(dense_causal(q, k, v, scale)[ctx:])
    meta = build_metadata([q for q, _ in shapes], [c for _, c in shapes], tables, block_size)
    return k_cache, v_cache, meta, torch.cat(qs), torch.cat(dense), scale


def poison_unowned_slots(k_cache, v_cache, meta, shapes, block_size, kv_heads, head_dim) -> None:
    """NaN into every slot of the pools that no request of the batch owns (other blocks, the unused
    tail of each last block): an attention that reads any of them outputs NaN."""
    owned = torch.zeros(k_cache.shape[0] * block_size, dtype=torch.bool)
    for b, (q_len, ctx) in enumerate(shapes):
        for pos in range(q_len + ctx):
            owned[int(meta.block_tables[b, pos // block_size]) * block_size + pos % block_size] = True
    for pool in (k_cache, v_cache):
        pool.view(-1, kv_heads, head_dim)[~owned] = float("nan")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize(
    "block_size,num_heads,kv_heads,head_dim",
    [(4, 4, 2, 16), (16, 4, 4, 32), (3, 6, 2, 8), (8, 8, 1, 16)],
)
def test_reference_equals_dense_causal_on_shuffled_blocks(block_size, num_heads, kv_heads, head_dim):
    k_cache, v_cache, meta, q, dense, scale = fill_and_query(
        MIXED, block_size=block_size, num_heads=num_heads, kv_heads=kv_heads, head_dim=head_dim
    )
    # the blocks really are scattered: no request's table is a run of consecutive ids
    tables = meta.block_tables.tolist()
    assert any(t[1] != t[0] + 1 for t in tables if len([b for b in t if b]) > 1)
    out = paged_attention_reference(q, k_cache, v_cache, meta, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_err(out, dense) < 1e-5


def test_attention_never_reads_outside_the_requests_slots():
    """Poison every slot that no request of the batch owns (other blocks, the unused tail of each
    last block): a read of any of them would turn the output into NaN."""
    shapes = [(5, 3), (1, 10), (2, 0)]
    block_size, kv_heads, head_dim = 4, 2, 16
    k_cache, v_cache, meta, q, dense, scale = fill_and_query(
        shapes, block_size=block_size, num_heads=4, kv_heads=kv_heads, head_dim=head_dim
    )
    poison_unowned_slots(k_cache, v_cache, meta, shapes, block_size, kv_heads, head_dim)
    out = paged_attention_reference(q, k_cache, v_cache, meta, scale)
    assert torch.isfinite(out).all()
    assert rel_err(out, dense) < 1e-5


def test_slot_mapping_and_positions_golden():
    # request A: 3 tokens in context, 3 new, blocks [7, 2]; request B: 2 new, block [5]
    meta = build_metadata([3, 2], [3, 0], [[7, 2], [5]], block_size=4)
    assert meta.positions.tolist() == [3, 4, 5, 0, 1]
    assert meta.slot_mapping.tolist() == [7 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 5 * 4 + 0, 5 * 4 + 1]
    assert meta.query_start_loc.tolist() == [0, 3, 5]
    assert meta.seq_lens.tolist() == [6, 2]
    assert meta.block_tables.tolist() == [[7, 2], [5, 0]]  # padded with the null block
    assert (meta.num_seqs, meta.num_tokens, meta.max_query_len, meta.max_seq_len) == (2, 5, 3, 6)


def test_writes_touch_only_their_own_slots():
    """Poisoned pool: NaN everywhere, each request's context stamped with its own sentinel; a
    mixed step's write must change exactly its slots, in the right layer, and nothing else."""
    block_size, kv_heads, head_dim, num_blocks = 4, 2, 8, 40
    cache = PagedKVCache(2, num_blocks, block_size, kv_heads, head_dim, init="empty")
    cache.data.fill_(float("nan"))
    shapes = [(3, 5), (1, 7), (6, 0), (1, 12)]
    tables = scattered_tables(shapes, block_size, BlockAllocator(num_blocks, shuffle_seed=3))
    for layer in range(2):
        k_cache, v_cache = cache.layer(layer)
        for b, ((_, ctx), table) in enumerate(zip(shapes, tables)):
            if ctx:
                slots = build_metadata([ctx], [0], [table], block_size).slot_mapping
                k_cache.view(-1, kv_heads, head_dim)[slots] = 100.0 + b
                v_cache.view(-1, kv_heads, head_dim)[slots] = -100.0 - b
    before = cache.data.clone()

    meta = build_metadata([q for q, _ in shapes], [c for _, c in shapes], tables, block_size)
    k_new = torch.randn(meta.num_tokens, kv_heads, head_dim)
    v_new = torch.randn(meta.num_tokens, kv_heads, head_dim)
    k_cache, v_cache = cache.layer(1)
    write_kv(k_cache, v_cache, k_new, v_new, meta.slot_mapping)

    rows = cache.data.view(2, 2, num_blocks * block_size, kv_heads, head_dim)
    old = before.view_as(rows)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[meta.slot_mapping] = True
    # exactly the mapped rows of layer 1 hold the new values ...
    assert torch.equal(rows[1, 0][meta.slot_mapping], k_new)
    assert torch.equal(rows[1, 1][meta.slot_mapping], v_new)
    # ... and every other row of the pool (layer 0 entirely) is bit-for-bit what it was
    same = lambda a, b: torch.equal(torch.nan_to_num(a, nan=7e7), torch.nan_to_num(b, nan=7e7))  # noqa: E731
    assert same(rows[0], old[0])
    assert same(rows[1][:, ~written], old[1][:, ~written])
    # the new tokens landed right after each request's context, inside its own blocks
    for b, ((q_len, ctx), table) in enumerate(zip(shapes, tables)):
        own = {table[p // block_size] for p in range(ctx, ctx + q_len)}
        assert own <= set(table)
        if ctx:
            ctx_slots = build_metadata([ctx], [0], [table], block_size).slot_mapping
            assert (rows[1, 0][ctx_slots] == 100.0 + b).all()


def test_metadata_rejects_short_or_out_of_pool_tables():
    with pytest.raises(ValueError, match="need 3 blocks"):
        build_metadata([4], [5], [[1, 2]], block_size=4)
    with pytest.raises(ValueError, match="outside the pool"):
        build_metadata([1, 1], [0, 0], [[1], [99]], block_size=4, num_blocks=10)
    with pytest.raises(ValueError, match="num_new_tokens must be >= 1"):
        build_metadata([0], [3], [[1]], block_size=4)


def test_block_allocator_scatters_unique_blocks_and_keeps_the_null_block():
    alloc = BlockAllocator(50, shuffle_seed=5)
    got = alloc.allocate(20) + alloc.allocate(29)
    assert sorted(got) == list(range(1, 50))  # every block but the null block, once
    assert got != sorted(got)
    assert alloc.num_free == 0
    with pytest.raises(RuntimeError, match="exhausted"):
        alloc.allocate(1)
    alloc.free(got[:5])
    assert alloc.num_free == 5
    with pytest.raises(ValueError, match="double free"):
        alloc.free(got[:1])
    assert BlockAllocator(50, shuffle_seed=5).allocate(20) == got[:20]  # seeded: reproducible
    assert BlockAllocator(4).allocate(3) == [1, 2, 3]


def test_cache_layout_and_bytes_per_block_match_the_simulators_kv_cost():
    from sim.hardware.models import get_model

    spec = get_model("llama-3-8b")
    per_block = PagedKVCache.bytes_per_block(spec.num_layers, 16, spec.num_kv_heads, spec.head_dim, torch.bfloat16)
    assert per_block == 16 * spec.kv_bytes_per_token() == 2 * 32 * 16 * 8 * 128 * 2

    cache = PagedKVCache(3, 10, 4, 2, 8, init="zeros")
    k, v = cache.layer(2)
    assert k.shape == v.shape == (10, 4, 2, 8) and k.is_contiguous() and v.is_contiguous()
    k.fill_(1.0)
    assert cache.data[2, 0].sum() == k.numel() and cache.data[2, 1].sum() == 0  # views, not copies
    with pytest.raises(ValueError, match="init must be"):
        PagedKVCache(1, 2, 4, 1, 8, init="ones")


def test_random_mixed_batches_property():
    """Many random mixed compositions (GQA 2, block size 5): the reference stays exact."""
    rng = random.Random(11)
    for trial in range(6):
        shapes = [(rng.choice([1, 1, 1, rng.randint(2, 12)]), rng.randint(0, 25)) for _ in range(rng.randint(1, 6))]
        k_cache, v_cache, meta, q, dense, scale = fill_and_query(
            shapes, block_size=5, num_heads=4, kv_heads=2, head_dim=8, seed=trial
        )
        assert rel_err(paged_attention_reference(q, k_cache, v_cache, meta, scale), dense) < 1e-5, shapes
