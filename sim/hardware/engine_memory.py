"""How SGLang and TGI size their KV pools, each by its own rule (vLLM's is :mod:`sim.hardware.kv_capacity`).

Why a module of its own: the three engines split a GPU differently, and a comparison that gives
SGLang and TGI vLLM's pool compares vLLM's memory rule three times. Everything is per GPU, in
bytes of the device as it reports itself (:mod:`sim.hardware.gpus`); the per-token KV size is the
model's (:meth:`ModelSpec.kv_capacity_bytes_per_token`), the same cell size all three use for a
plain MHA/GQA model.

**SGLang** (sglang ``python/sglang/srt/server_args.py`` ``ServerArgs._handle_gpu_memory_settings``;
``mem_cache/kv_cache_configurator.py`` L3000-3060 in 0.5.23, reference/schedulers.md §7.1).
``mem_fraction_static`` is (weights + KV pool) / GPU memory. Unset, SGLang derives it from the GPU's
memory in MiB: with ``chunked_prefill_size`` and ``cuda_graph_max_bs`` picked by memory tier
(:func:`sglang_cuda_graph_max_bs`; the chunk is the policy's, :func:`policies.sglang.sglang_chunk_default`),

    reserved_mib = 512 + max(chunk, 2048) × 1.5 + cuda_graph_max_bs × 2 + tp × pp / 8 × 1024
                   (at least 10 GiB on GPUs above 60 GiB)
    mem_fraction_static = round((gpu_mib − reserved_mib) / gpu_mib, 3)

(0.906 on an H200). The pool is what is left of that fraction after the weights load,
``rest = available_after_load − total × (1 − mem_fraction_static)`` = total × fraction − weights,
divided by the cell size: ``max_total_num_tokens``. The CUDA context (~0.5 GiB, before the first
measurement) is not modelled.

**TGI** (text-generation-inference ``server/text_generation_server/models/flash_causal_lm.py``
``FlashCausalLM.warmup`` L1507-1590, reference/schedulers.md §6.1). The warm-up allocates the KV of one
prefill batch of ``max_batch_prefill_tokens`` tokens, runs it, then measures free memory (torch's
caching allocator keeps the warm-up's activations reserved) and sets

    num_blocks = free × CUDA_MEMORY_FRACTION (1.0) × TGI_WIGGLE_ROOM (0.90) // block bytes + warm-up blocks
    max_batch_total_tokens = num_blocks × BLOCK_SIZE

``free`` = memory − weights − the warm-up pass's activation peak
(:func:`sim.hardware.memory_profile.activation_reserve_bytes` at ``max_batch_prefill_tokens``) −
the warm-up blocks. The router keeps block 0 (``BlockAllocator``), so one block is not usable. TGI
refuses to start when ``max_total_tokens`` (cbsim: ``engine.max_model_len``) exceeds the pool
(``backends/v3/src/lib.rs``: "Not enough memory to handle max_total_tokens").
"""

from __future__ import annotations

from sim.errors import CbsimError
from sim.hardware.gpus import GPUSpec
from sim.hardware.memory_profile import activation_reserve_bytes
from sim.hardware.models import ModelSpec

MIB = 1 << 20
GIB = 1 << 30

TGI_WIGGLE_ROOM = 0.90  # TGI_WIGGLE_ROOM, flash_causal_lm.py
TGI_MEMORY_FRACTION = 1.0  # CUDA_MEMORY_FRACTION's default


def sglang_cuda_graph_max_bs(gpu_mib: float, tp: int) -> int:
    """``cuda_graph_max_bs`` as SGLang picks it by GPU memory (``_handle_gpu_memory_settings``)."""
    if gpu_mib < 20 * 1024:
        return 8
    if gpu_mib < 35 * 1024:
        return 24 if tp < 4 else 80
    if gpu_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def sglang_mem_fraction_static(gpu: GPUSpec, tp: int, chunked_prefill_size: int | None,
                               max_prefill_tokens: int = 16384) -> float:
    """SGLang's default ``mem_fraction_static`` on this GPU (module doc); with chunking off
    (``chunked_prefill_size`` None or <= 0) it reserves for ``max_prefill_tokens`` instead."""
    gpu_mib = gpu.memory_bytes / MIB
    chunk = chunked_prefill_size if chunked_prefill_size and chunked_prefill_size > 0 else max_prefill_tokens
    reserved = 512 + max(chunk, 2048) * 1.5 + sglang_cuda_graph_max_bs(gpu_mib, tp) * 2 + tp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def sglang_pool_tokens(model: ModelSpec, gpu: GPUSpec, tp: int, ep: int, chunked_prefill_size: int | None,
                       mem_fraction_static: float | None = None, max_model_len: int | None = None,
                       max_prefill_tokens: int = 16384) -> int:
    """SGLang's ``max_total_num_tokens`` on one GPU (module doc). Raises when nothing is left for
    the KV cache, as SGLang does ("Not enough memory"). Its running cap follows from it:
    :func:`policies.sglang.sglang_running_cap`."""
    frac = mem_fraction_static if mem_fraction_static is not None else sglang_mem_fraction_static(
        gpu, tp, chunked_prefill_size, max_prefill_tokens)
    weights = model.weight_bytes(tp, ep)
    rest = gpu.memory_bytes * frac - weights
    cell = model.kv_capacity_bytes_per_token(tp, max_model_len)
    tokens = int(rest // cell) if rest > 0 else 0
    if tokens < 1:
        raise CbsimError(
            f"SGLang's KV pool of {model.name!r} on {gpu.name} with tensor_parallel={tp} is empty: "
            f"mem_fraction_static {frac} × {gpu.memory_bytes / GIB:.2f} GiB leaves nothing after "
            f"{weights / GIB:.2f} GiB of weights; raise hardware.tensor_parallel, choose a GPU with more "
            f"memory, or set the sglang policy's mem_fraction_static")
    return tokens


def tgi_pool_tokens(model: ModelSpec, gpu: GPUSpec, tp: int, ep: int, max_batch_prefill_tokens: int,
                    block_size: int, max_model_len: int | None = None,
                    memory_fraction: float = TGI_MEMORY_FRACTION) -> int:
    """TGI's ``max_batch_total_tokens`` less the router's reserved block 0 (module doc). Raises
    when the warm-up leaves no room, or when one ``max_model_len`` request cannot fit, as TGI does."""
    per_block = model.kv_capacity_bytes_per_token(tp, max_model_len) * block_size
    warm_blocks = -(-max_batch_prefill_tokens // block_size)
    peak = activation_reserve_bytes(model, max_batch_prefill_tokens, 1, tp, ep)
    free = gpu.memory_bytes - model.weight_bytes(tp, ep) - peak - warm_blocks * per_block
    blocks = int(free * memory_fraction * TGI_WIGGLE_ROOM // per_block) + warm_blocks if free > 0 else 0
    tokens = (blocks - 1) * block_size
    if tokens < 1:
        raise CbsimError(
            f"TGI's warm-up of {model.name!r} on {gpu.name} with tensor_parallel={tp} leaves no KV cache: "
            f"{gpu.memory_bytes / GIB:.2f} GiB less {model.weight_bytes(tp, ep) / GIB:.2f} GiB of weights and "
            f"{peak / GIB:.2f} GiB of warm-up activations; raise hardware.tensor_parallel or choose a GPU "
            f"with more memory")
    if max_model_len is not None and tokens < max_model_len:
        raise CbsimError(
            f"TGI's KV pool of {model.name!r} on {gpu.name} holds {tokens:,} tokens, fewer than "
            f"engine.max_model_len ({max_model_len:,}; TGI's max_total_tokens), so TGI would not start: "
            f"set engine.max_model_len to at most {tokens:,}, raise hardware.tensor_parallel, or set the "
            f"tgi policy's max_batch_total_tokens")
    return tokens
