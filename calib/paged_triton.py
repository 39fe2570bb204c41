"""Fast paged attention: one Triton kernel that reads K/V through the block table.

Why Triton and not FlexAttention: a calibration sweep runs hundreds of batch shapes. A Triton
kernel compiles once per (dtype, head size, tile) configuration and takes every batch shape as
run-time arguments, so the sweep times the kernel, not recompilation; it handles a mixed batch
(prefill chunks and decodes, packed) in one launch, as engines' varlen kernels do; and no
contiguous K/V copy is ever made: each program gathers its request's K/V rows straight from the
block pool through the block table.

Work split (the same shape as engines' unified paged-attention kernels):

* program axis 0 walks *query tiles*: each request's new tokens are cut into tiles of
  ``BLOCK_Q`` tokens; a tile holds those tokens for all ``GROUP`` query heads that share one KV
  head (grouped-query attention), i.e. ``BLOCK_M = BLOCK_Q * GROUP`` rows, so K/V is read once
  for the whole group and even a one-token decode gives the matrix unit 16+ rows. The grid is
  sized from shapes alone (``T // BLOCK_Q + B`` tiles, an upper bound; spare programs exit), and
  each program finds its request by binary search over ``query_start_loc // BLOCK_Q + b``,
  which is non-decreasing and gives request ``b`` at least ``ceil(q_len_b / BLOCK_Q)`` tiles.
* program axis 1 is the KV head.
* program axis 2 splits the KV range into ``NUM_SEGMENTS`` parts (split-KV, for batches with
  too few tiles to fill the GPU, e.g. a few long decodes); partial results carry their running
  max and sum and are merged in :func:`_merge_segments`.

Inside a program: online softmax (Milakov & Gimelshein 2018; Dao et al., FlashAttention 2022)
over KV tiles of ``BLOCK_N`` positions, each position's physical row found through the block
table, causal mask ``kv_pos <= context_len + token``, exp2 with the scale folded in.

Without a GPU, the kernel runs on CPU tensors through Triton's interpreter (numpy) when
``TRITON_INTERPRET=1`` is set before Triton is first imported: that is how the tests check it
(Triton 3.9's interpreter; 3.6's fails under numpy >= 2.4 on loops with run-time bounds).
:mod:`calib.kernel_report` compiles it for sm_90 without a GPU and reads registers, spills and
instructions.
"""

from __future__ import annotations

import math

import torch

from calib.paged import AttentionMetadata

try:  # Triton is optional: the reference path needs none, and CPU-only installs may lack it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

MAX_SEGMENTS = 16


def available() -> bool:
    return triton is not None


def interpreted() -> bool:
    """Whether the kernel runs in Triton's interpreter (CPU tensors) rather than compiled (GPU)."""
    return triton is not None and not isinstance(_paged_attention_kernel, triton.runtime.JITFunction)


def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    seg_m_ptr,
    seg_l_ptr,
    seg_acc_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    scale_log2e,
    num_seqs,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_k_blk,
    stride_k_off,
    stride_k_head,
    stride_v_blk,
    stride_v_off,
    stride_v_head,
    stride_bt,
    num_q_heads,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    # Which request owns this tile: the last b with query_start_loc[b] // BLOCK_Q + b <= tile.
    lo = tile * 0
    hi = tile * 0 + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        right = first_tile <= tile
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(right, hi, mid)
    seq = lo - 1

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_tile = tile - (q_start // BLOCK_Q + seq)
    if q_tile * BLOCK_Q < q_len:
        seq_len = tl.load(seq_lens_ptr + seq)
        context_len = seq_len - q_len

        rows = tl.arange(0, BLOCK_M)
        token = q_tile * BLOCK_Q + rows // GROUP  # new-token index within the request
        head = kv_head * GROUP + rows % GROUP
        row_ok = (rows < BLOCK_Q * GROUP) & (token < q_len)
        dims = tl.arange(0, HEAD_DIM_P)
        dim_ok = dims < HEAD_DIM
        q_rows = (q_start + token).to(tl.int64)
        q = tl.load(
            q_ptr + q_rows[:, None] * stride_q_tok + head[:, None] * stride_q_head + dims[None, :],
            mask=row_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )
        q_pos = context_len + token

        # Causal: nothing past this tile's last token; split that range among the segments.
        kv_end = tl.minimum(seq_len, context_len + (q_tile + 1) * BLOCK_Q)
        num_kv_tiles = tl.cdiv(kv_end, BLOCK_N)
        tiles_per_segment = tl.cdiv(num_kv_tiles, NUM_SEGMENTS)
        first_kv_tile = segment * tiles_per_segment
        last_kv_tile = tl.minimum(first_kv_tile + tiles_per_segment, num_kv_tiles)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_P], tl.float32)
        cols = tl.arange(0, BLOCK_N)
        for kv_tile in range(first_kv_tile, last_kv_tile):
            kv_pos = kv_tile * BLOCK_N + cols
            kv_ok = kv_pos < kv_end
            block = tl.load(block_tables_ptr + seq * stride_bt + kv_pos // BLOCK_SIZE, mask=kv_ok, other=0)
            block = block.to(tl.int64)
            offset = kv_pos % BLOCK_SIZE
            kv_mask = kv_ok[:, None] & dim_ok[None, :]
            k = tl.load(
                k_cache_ptr
                + block[:, None] * stride_k_blk
                + offset[:, None] * stride_k_off
                + kv_head * stride_k_head
                + dims[None, :],
                mask=kv_mask,
                other=0.0,
            )
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e
            allowed = row_ok[:, None] & kv_ok[None, :] & (kv_pos[None, :] <= q_pos[:, None])
            scores = tl.where(allowed, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
            p = tl.exp2(scores - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                v_cache_ptr
                + block[:, None] * stride_v_blk
                + offset[:, None] * stride_v_off
                + kv_head * stride_v_head
                + dims[None, :],
                mask=kv_mask,
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        store_mask = row_ok[:, None] & dim_ok[None, :]
        if NUM_SEGMENTS == 1:
            l_safe = tl.where(l_i > 0.0, l_i, 1.0)
            result = acc / l_safe[:, None]
            tl.store(
                out_ptr + q_rows[:, None] * stride_o_tok + head[:, None] * stride_o_head + dims[None, :],
                result.to(out_ptr.dtype.element_ty),
                mask=store_mask,
            )
        else:
            # Partials laid out [T, num_q_heads, NUM_SEGMENTS] (+ HEAD_DIM_P for acc).
            part = (q_rows * num_q_heads + head) * NUM_SEGMENTS + segment
            tl.store(seg_m_ptr + part, m_i, mask=row_ok)
            tl.store(seg_l_ptr + part, l_i, mask=row_ok)
            tl.store(seg_acc_ptr + part[:, None] * HEAD_DIM_P + dims[None, :], acc, mask=store_mask)


if triton is not None:
    # With TRITON_INTERPRET=1 set before triton is imported, this is Triton's interpreter and
    # runs on CPU tensors (how the tests check the kernel without a GPU).
    _paged_attention_kernel = triton.jit(_paged_attention_kernel)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def choose_tiles(max_query_len: int, group: int, head_dim: int, itemsize: int = 2) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_Q, BLOCK_N) for a batch.

    Small query tiles when every request is short (decodes), larger ones when some request
    brings a prefill chunk. BLOCK_M is at least 16 (the matrix unit's smallest tile) and at
    least one token's worth of grouped heads. Sizes were checked by compiling for sm_90 and
    reading the resource usage: the 16-bit configurations use no local memory (no register
    spills) and load K/V with 16-byte asynchronous copies; fp32 inputs (exact IEEE dots, used
    for tests) need small tiles to avoid spilling; head_dim > 128 gets half-size tiles.
    """
    decode = max_query_len * group <= 16
    if itemsize > 2:
        block_m, block_n = (16 if decode else 32), 16
    elif head_dim > 128:
        block_m, block_n = (16 if decode else 64), 32
    else:
        block_m, block_n = (16 if decode else 128), 64
    block_m = max(block_m, _next_pow2(group))
    return block_m, block_m // group, block_n


def kernel_config(
    *, max_query_len: int, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
    itemsize: int, num_segments: int,
) -> dict:
    """The kernel's compile-time parameters and launch options for one batch shape (shared by
    the launcher and :mod:`calib.kernel_report`, so what is inspected is what runs)."""
    group = num_heads // num_kv_heads
    block_m, block_q, block_n = choose_tiles(max_query_len, group, head_dim, itemsize)
    return dict(
        BLOCK_SIZE=block_size,
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_DIM_P=max(16, _next_pow2(head_dim)),
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        NUM_SEGMENTS=num_segments,
        DOT_PRECISION="ieee" if itemsize > 2 else "tf32",  # fp32 stays exact; 16-bit ignores it
        num_warps=8 if block_m >= 128 else 4,
        num_stages=2,
    )


def choose_segments(num_programs: int, max_kv_tiles: int, device: torch.device) -> int:
    """Split-KV when the batch has too few (tile, head) programs to fill the GPU."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if num_programs >= sms:
        return 1
    return max(1, min(MAX_SEGMENTS, cdiv_int(2 * sms, num_programs), max_kv_tiles))


def cdiv_int(a: int, b: int) -> int:
    return -(-a // b)


def _merge_segments(
    seg_max: torch.Tensor, seg_sum: torch.Tensor, acc: torch.Tensor, head_dim: int
) -> torch.Tensor:
    """Combine split-KV partials: each segment's sum and accumulator rescaled to the common max
    (maxima are in the kernel's log2 domain, hence exp2)."""
    m_max = seg_max.amax(dim=-1, keepdim=True)
    weight = torch.exp2(seg_max - m_max)  # segments that saw nothing have max -inf -> weight 0
    denom = (seg_sum * weight).sum(dim=-1)
    merged = (acc * weight[..., None]).sum(dim=-2) / denom[..., None]
    return merged[..., :head_dim]


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    num_segments: int | None = None,
) -> torch.Tensor:
    """Paged attention for a mixed batch, K/V read through the block table inside the kernel.

    Same contract as :func:`calib.paged.paged_attention_reference`. Extra memory is the output
    (plus, when split-KV is used, fp32 partials of size ``T * num_heads * segments * head_dim``),
    never a copy of the context. ``num_segments`` overrides the split-KV choice (tests).
    No host-device synchronisation: launches are sized from shapes and host-side lengths.
    """
    if triton is None:
        raise RuntimeError("the Triton paged-attention path needs the 'triton' package; use backend='reference'")
    if (q.device.type == "cuda") == interpreted():
        raise RuntimeError(
            f"the Triton kernel is {'interpreted' if interpreted() else 'compiled'} in this process but the "
            f"tensors are on {q.device}: set TRITON_INTERPRET=1 before triton is imported to run it on CPU "
            "tensors, and leave it unset for CUDA tensors"
        )
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads do not group evenly over {kv_heads} KV heads")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("q and the K/V caches need a contiguous last (head_dim) dimension")
    num_seqs = meta.num_seqs
    _, block_q, block_n = choose_tiles(meta.max_query_len, num_heads // kv_heads, head_dim, q.element_size())
    num_tiles = num_tokens // block_q + num_seqs
    if num_segments is None:
        num_segments = choose_segments(num_tiles * kv_heads, cdiv_int(meta.max_seq_len, block_n), q.device)
    config = kernel_config(
        max_query_len=meta.max_query_len, num_heads=num_heads, num_kv_heads=kv_heads, head_dim=head_dim,
        block_size=block_size, itemsize=q.element_size(), num_segments=num_segments,
    )
    out = torch.empty_like(q)
    if num_segments > 1:
        seg_m = torch.empty((num_tokens, num_heads, num_segments), dtype=torch.float32, device=q.device)
        seg_l = torch.empty_like(seg_m)
        seg_acc = torch.empty(
            (num_tokens, num_heads, num_segments, config["HEAD_DIM_P"]), dtype=torch.float32, device=q.device
        )
    else:
        seg_m = seg_l = seg_acc = out  # unused by the kernel when NUM_SEGMENTS == 1
    _paged_attention_kernel[(num_tiles, kv_heads, num_segments)](
        q,
        k_cache,
        v_cache,
        out,
        seg_m,
        seg_l,
        seg_acc,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        scale * math.log2(math.e),
        num_seqs,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        meta.block_tables.stride(0),
        num_heads,
        **config,
    )
    if num_segments > 1:
        out.copy_(_merge_segments(seg_m, seg_l, seg_acc, head_dim).to(out.dtype))
    return out
