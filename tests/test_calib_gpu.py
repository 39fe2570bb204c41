"""GPU checks of the fast paged-attention path and the one-step API (skipped without CUDA).

Run on the device machine by ``calib/gpu_check.sh``. What they establish, beyond the CPU tests:
the compiled kernel agrees with the reference in bf16/fp16 at real head sizes (1e-2), split-KV
is chosen for small batches and stays exact, the kernel's extra memory is tiny next to a
contiguous K/V copy, a full-size Llama-3-8B shard runs a step, and decode steps can be captured
in a CUDA graph (no host synchronisation inside ``execute``).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

from calib.paged import PagedKVCache, build_metadata, cdiv, paged_attention_reference, write_kv  # noqa: E402
from calib.step import BlockAllocator, make_runner, synthetic_batch  # noqa: E402

CUDA = "cuda"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def scattered_batch(shapes, *, num_blocks, block_size, kv_heads, head_dim, dtype, seed=0):
    """A pool with random K/V (every slot written) and a batch of scattered block tables."""
    cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=CUDA, seed=seed)
    alloc = BlockAllocator(num_blocks, shuffle_seed=seed)
    tables = [alloc.allocate(cdiv(q + c, block_size)) for q, c in shapes]
    meta = build_metadata([q for q, _ in shapes], [c for _, c in shapes], tables, block_size, device=CUDA)
    k_cache, v_cache = cache.layer(0)
    return k_cache, v_cache, meta


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kernel_matches_reference_at_llama_head_sizes(dtype):
    from calib.paged_triton import paged_attention_triton

    shapes = [(1000, 500), (37, 0)] + [(1, 64 + 37 * i) for i in range(64)]
    k_cache, v_cache, meta = scattered_batch(shapes, num_blocks=8192, block_size=16, kv_heads=8, head_dim=128, dtype=dtype)
    gen = torch.Generator(device=CUDA).manual_seed(1)
    q = torch.randn(meta.num_tokens, 32, 128, device=CUDA, generator=gen).to(dtype)
    scale = 128 ** -0.5
    out = paged_attention_triton(q, k_cache, v_cache, meta, scale)
    ref = paged_attention_reference(q, k_cache, v_cache, meta, scale)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_split_kv_is_used_for_few_long_decodes_and_stays_exact():
    from calib.paged_triton import choose_segments, paged_attention_triton

    shapes = [(1, 8000), (1, 3000)]
    assert choose_segments(2 * 8, cdiv(8000, 64), torch.device(CUDA)) > 1
    k_cache, v_cache, meta = scattered_batch(shapes, num_blocks=1024, block_size=16, kv_heads=8, head_dim=128,
                                             dtype=torch.bfloat16)
    q = torch.randn(meta.num_tokens, 32, 128, device=CUDA, dtype=torch.bfloat16)
    out = paged_attention_triton(q, k_cache, v_cache, meta, 128 ** -0.5)
    ref = paged_attention_reference(q, k_cache, v_cache, meta, 128 ** -0.5)
    assert rel_err(out, ref) < 1e-2


def test_peak_extra_memory_is_far_below_a_contiguous_kv_copy():
    from calib.paged_triton import paged_attention_triton

    shapes = [(1, 16000)] * 32 + [(512, 4000)]
    kv_heads, head_dim, dtype = 8, 128, torch.bfloat16
    blocks = sum(cdiv(q + c, 16) for q, c in shapes) + 1
    k_cache, v_cache, meta = scattered_batch(shapes, num_blocks=blocks, block_size=16, kv_heads=kv_heads,
                                             head_dim=head_dim, dtype=dtype)
    q = torch.randn(meta.num_tokens, 32, head_dim, device=CUDA, dtype=dtype)
    contiguous_copy = 2 * sum(q + c for q, c in shapes) * kv_heads * head_dim * 2  # K and V, bf16
    out = paged_attention_triton(q, k_cache, v_cache, meta, head_dim ** -0.5)  # warm-up / compile
    del out
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = paged_attention_triton(q, k_cache, v_cache, meta, head_dim ** -0.5)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    print(f"contiguous K/V copy {contiguous_copy / 2**20:.0f} MiB, kernel's extra {extra / 2**20:.2f} MiB")
    assert extra <= out.numel() * out.element_size() * 2 + (4 << 20)
    assert extra < contiguous_copy / 100


def test_full_llama_3_8b_shard_runs_a_mixed_step():
    from sim.hardware.models import get_model

    spec = get_model("llama-3-8b")
    runner = make_runner(spec, num_blocks=2048, block_size=16, device=CUDA)  # bf16, all 32 layers
    assert runner.backend == "triton"
    assert runner.model.weight_bytes() == spec.weight_bytes()
    alloc = BlockAllocator(2048, shuffle_seed=0)
    batch = synthetic_batch([(512, 1024)] + [(1, 900)] * 16, alloc, 16)
    tokens = runner.step(batch)
    assert len(tokens) == 17 and all(0 <= t < spec.vocab_size for t in tokens)
    logits = runner.logits(runner.prepare(batch))
    assert torch.isfinite(logits).all()


def test_two_layer_llama_step_triton_matches_reference_backend():
    runners = {
        b: make_runner("llama-3-8b", num_layers=2, num_blocks=512, block_size=16, device=CUDA, attention=b)
        for b in ("triton", "reference")
    }
    batch = synthetic_batch([(300, 200), (1, 700), (1, 33), (64, 0)], BlockAllocator(512, shuffle_seed=1), 16)
    got = {b: r.logits(r.prepare(batch), all_tokens=True) for b, r in runners.items()}
    assert rel_err(got["triton"], got["reference"]) < 2e-2


def test_decode_step_captures_in_a_cuda_graph():
    runner = make_runner("llama-3-8b", num_layers=2, num_blocks=512, block_size=16, device=CUDA)
    batch = synthetic_batch([(1, 100 + 50 * i) for i in range(8)], BlockAllocator(512, shuffle_seed=2), 16)
    inputs = runner.prepare(batch)
    eager = runner.execute(inputs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        runner.execute(inputs)  # warm-up on the side stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = runner.execute(inputs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_write_kv_on_gpu_touches_only_its_slots():
    cache = PagedKVCache(1, 64, 16, 8, 128, dtype=torch.bfloat16, device=CUDA, init="empty")
    cache.data.fill_(float("nan"))
    meta = build_metadata([5, 1], [3, 40], [[9, 4], [7, 12, 30]], 16, device=CUDA)
    k_cache, v_cache = cache.layer(0)
    k_new = torch.randn(6, 8, 128, device=CUDA, dtype=torch.bfloat16)
    write_kv(k_cache, v_cache, k_new, k_new, meta.slot_mapping)
    rows = k_cache.view(-1, 8, 128)
    written = torch.zeros(rows.shape[0], dtype=torch.bool, device=CUDA)
    written[meta.slot_mapping] = True
    assert torch.equal(rows[meta.slot_mapping], k_new)
    assert torch.isnan(rows[~written]).all()
