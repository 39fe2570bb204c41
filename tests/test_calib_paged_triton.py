"""The Triton paged-attention kernel against the reference, on whatever device there is.

Without CUDA the kernel runs through Triton's interpreter: ``TRITON_INTERPRET=1`` must be set
before Triton is first imported, so this module sets it at collection time (unless Triton is
already loaded, in which case the tests skip and say why). With CUDA the same cases run the
compiled kernel. Without the ``triton`` package the module skips.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from test_calib_paged import MIXED, fill_and_query, poison_unowned_slots, rel_err  # noqa: E402

from calib.paged import paged_attention_reference  # noqa: E402
from calib.paged_triton import choose_tiles, paged_attention_triton  # noqa: E402
from calib.step import BlockAllocator, SeqInput, make_runner  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(
    not ON_GPU and not INTERPRETED,
    reason="no CUDA, and triton was imported before TRITON_INTERPRET=1 could be set",
)

DECODES = [(1, 9), (1, 40), (1, 1), (1, 17)]


def run_both(shapes, *, block_size, num_heads, kv_heads, head_dim, dtype=torch.float32, num_segments=None, seed=0):
    k_cache, v_cache, meta, q, dense, scale = fill_and_query(
        shapes, block_size=block_size, num_heads=num_heads, kv_heads=kv_heads, head_dim=head_dim, seed=seed,
        dtype=dtype, num_blocks=160,
    )
    k_cache, v_cache, q = k_cache.to(DEVICE), v_cache.to(DEVICE), q.to(DEVICE)
    meta = meta.to(DEVICE)
    out = paged_attention_triton(q, k_cache, v_cache, meta, scale, num_segments=num_segments)
    ref = paged_attention_reference(q, k_cache, v_cache, meta, scale)
    return out, ref, dense


@pytest.mark.parametrize(
    "shapes,block_size,num_heads,kv_heads,head_dim",
    [
        (MIXED, 4, 4, 2, 16),  # mixed batch: large query tiles
        (DECODES, 16, 8, 2, 32),  # decodes only: small query tiles
        (MIXED, 3, 6, 2, 16),  # 3 heads per KV head (non-power-of-two group), odd block size
        (MIXED, 8, 4, 4, 24),  # head_dim not a power of two (padded in the kernel)
    ],
)
def test_kernel_equals_reference_and_dense(shapes, block_size, num_heads, kv_heads, head_dim):
    out, ref, dense = run_both(shapes, block_size=block_size, num_heads=num_heads, kv_heads=kv_heads, head_dim=head_dim)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-5
    assert rel_err(out.cpu(), dense) < 1e-5


@pytest.mark.parametrize("num_segments", [1, 3])
def test_kernel_never_reads_outside_the_requests_slots(num_segments):
    """Every slot no request owns (other blocks, the unused tail of last blocks) holds NaN."""
    shapes, block_size, kv_heads, head_dim = [(5, 3), (1, 10), (2, 0), (1, 70)], 4, 2, 16
    k_cache, v_cache, meta, q, dense, scale = fill_and_query(
        shapes, block_size=block_size, num_heads=4, kv_heads=kv_heads, head_dim=head_dim
    )
    poison_unowned_slots(k_cache, v_cache, meta, shapes, block_size, kv_heads, head_dim)
    out = paged_attention_triton(
        q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), meta.to(DEVICE), scale, num_segments=num_segments
    )
    assert torch.isfinite(out).all()
    assert rel_err(out.cpu(), dense) < 1e-5


@pytest.mark.parametrize("num_segments", [2, 3, 5])
def test_split_kv_segments_merge_exactly(num_segments):
    long = [(1, 300), (2, 150), (1, 5), (3, 70)]  # several KV tiles per request, some segments empty
    out, ref, _ = run_both(long, block_size=16, num_heads=4, kv_heads=2, head_dim=16, num_segments=num_segments)
    assert rel_err(out, ref) < 1e-5


def test_tiles_are_sized_for_the_batch():
    assert choose_tiles(1, 4, 128) == (16, 4, 64)  # decodes: 16 rows = 4 tokens x 4 grouped heads
    assert choose_tiles(1, 8, 128) == (16, 2, 64)
    assert choose_tiles(512, 4, 128) == (128, 32, 64)
    assert choose_tiles(1, 7, 128)[1] == 2  # 7 heads per KV head (Qwen2.5-7B): 2 tokens, 2 rows idle
    assert choose_tiles(512, 4, 128, itemsize=4) == (32, 8, 16)  # fp32: small tiles, no spills
    assert choose_tiles(512, 4, 256) == (64, 16, 32)


def test_model_steps_with_the_kernel_equal_the_reference_backend():
    runners = {b: make_runner("tiny", num_blocks=32, block_size=4, attention=b, device=DEVICE) for b in ("triton", "reference")}
    alloc = BlockAllocator(32, shuffle_seed=4)
    tables = [alloc.allocate(3), alloc.allocate(2)]
    steps = [
        [SeqInput(6, 0, tables[0], [1, 2, 3, 4, 5, 6]), SeqInput(3, 0, tables[1], [9, 8, 7])],
        [SeqInput(4, 6, tables[0], [10, 11, 12, 13]), SeqInput(1, 3, tables[1], [77])],
    ]
    for batch in steps:
        got = {b: r.logits(r.prepare(batch), all_tokens=True) for b, r in runners.items()}
        assert rel_err(got["triton"], got["reference"]) < 1e-5


def test_kernel_compiles_for_hopper_on_the_matrix_units_without_spills(tmp_path):
    """Compile for sm_90 with Triton's bundled toolchain (no GPU needed) and read the machine
    code: no local memory (register spills), matrix instructions, asynchronous K/V copies.
    Runs in a fresh process because this one may hold Triton's interpreter."""
    import json
    import subprocess

    script = (
        "import json; from calib.kernel_report import compile_report; "
        "print(json.dumps([compile_report('bf16', max_query_len=q) for q in (1, 512)]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, cwd=repo
    )
    assert done.returncode == 0, done.stderr[-3000:]
    decode, prefill = json.loads(done.stdout.strip().splitlines()[-1])
    for report in (decode, prefill):
        assert report["stack_bytes"] == 0, report
        assert report["sass"]["LDL"] == report["sass"]["STL"] == 0, report
        assert report["sass"]["LDGSTS"] > 0, report
    assert decode["config"]["BLOCK_M"] == 16 and decode["sass"]["HMMA"] > 0
    assert prefill["config"]["BLOCK_M"] == 128 and prefill["sass"]["HGMMA"] > 0  # Hopper's warpgroup MMA
