"""How many KV-cache blocks a GPU holds under TensorRT-LLM, computed the way TensorRT-LLM computes it.

Why not vLLM's rule (:mod:`sim.hardware.kv_capacity`): vLLM budgets a fraction of the *total*
memory (``gpu_memory_utilization``) and subtracts weights and activations from it; TensorRT-LLM's
PyTorch backend (``tensorrt_llm/_torch/pyexecutor/_util.py``, ``KvCacheCreator._cal_max_memory``
/ ``cal_max_tokens``) loads the weights, runs a profiling forward over ``max_num_tokens`` dummy
context tokens, and gives the KV cache a fraction of what is *left*:

    available_kv_mem = (total_gpu_memory − peak_memory) × free_gpu_memory_fraction
    max_tokens       = available_kv_mem // kv_bytes_per_token

``peak_memory`` is everything in use at the peak of that pass: weights, the pass's activations,
the CUDA context and libraries. ``free_gpu_memory_fraction`` defaults to 0.9
(``KvCacheConfig``, ``tensorrt_llm/llmapi/llm_args.py``). The blocks are ``tokens_per_block``
tokens (32 by default). Sizes per GPU; with tensor parallelism each GPU holds its shard.

We do not profile: the pass's activations and the libraries' memory are the estimate of
:mod:`sim.hardware.memory_profile` (the forward at ``max_num_tokens`` tokens, the sampler over the
dummy requests, ``ceil(max_num_tokens / max_seq_len)`` of them), or ``hardware.activation_reserve_gib``
when pinned, plus the CUDA context (:data:`CUDA_CONTEXT_BYTES`), which vLLM leaves in its
``1 − gpu_memory_utilization`` headroom but TensorRT-LLM's measurement of free memory sees.
``hardware.gpu_memory_utilization`` (vLLM's) is not read. ``engine.num_gpu_blocks`` pins the pool
(in ``engine.block_size`` blocks, converted to ``tokens_per_block`` blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import CbsimError
from sim.hardware.gpus import GPUSpec
from sim.hardware.kv_capacity import (
    GIB,
    MAX_KV_BLOCKS,
    _bytes,
    expert_parallel,
    moe_tensor_parallel,
    reserve_bytes,
)
from sim.hardware.models import ModelSpec

# The CUDA context with cuBLAS/NCCL handles (~0.5 GiB on an H100; sim/hardware/memory_profile.py)
CUDA_CONTEXT_BYTES = GIB // 2
DEFAULT_FRACTION = 0.9
DEFAULT_TOKENS_PER_BLOCK = 32


@dataclass(frozen=True)
class TrtllmKV:
    """The pool of one GPU and how it was sized (stated in the run's summary meta)."""

    tokens_per_block: int
    num_blocks: int
    note: str


def trtllm_kv(model: ModelSpec, gpu: GPUSpec, hardware_cfg, tp: int, *, max_num_tokens: int,
              max_seq_len: int, fraction: float = DEFAULT_FRACTION,
              tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK) -> TrtllmKV:
    """TensorRT-LLM's KV pool on one GPU (module docstring); :class:`CbsimError` when no block fits."""
    dummies = -(-max_num_tokens // max_seq_len)
    reserve = reserve_bytes(model, hardware_cfg, tp, max_num_tokens, dummies) + CUDA_CONTEXT_BYTES
    weights = model.weight_bytes(tp, expert_parallel(hardware_cfg), moe_tensor_parallel(hardware_cfg))
    free = gpu.memory_bytes - weights - reserve
    per_token = model.kv_capacity_bytes_per_token(tp, max_seq_len)
    tokens = int(free * fraction // per_token) if free > 0 else 0
    blocks = tokens // tokens_per_block
    if blocks < 1:
        raise CbsimError(
            f"model {model.name!r} does not fit on {gpu.name} with tensor_parallel={tp} under TensorRT-LLM: "
            f"{_bytes(gpu.memory_bytes)} − {_bytes(weights)} weights − {_bytes(reserve)} profiling peak leaves "
            f"{_bytes(max(free, 0))}, × free_gpu_memory_fraction {fraction}, not one block of {tokens_per_block} "
            f"tokens. Raise hardware.tensor_parallel, choose a GPU with more memory or a smaller model."
        )
    note = (f"TensorRT-LLM: ({_bytes(gpu.memory_bytes)} − {_bytes(weights)} weights − {_bytes(reserve)} profiling "
            f"peak at max_num_tokens {max_num_tokens}) × free_gpu_memory_fraction {fraction} = {tokens:,} tokens "
            f"= {blocks:,} blocks of {tokens_per_block}")
    return TrtllmKV(tokens_per_block, blocks, note)


def trtllm_pool(scn, model: ModelSpec, gpu: GPUSpec, knobs: dict) -> TrtllmKV:
    """The pool for one replica of a scenario whose batch limits are filled in; pinned by
    ``engine.num_gpu_blocks`` when set. A pool smaller than one ``max_model_len`` request, or
    larger than cbsim simulates, is an error (as :func:`sim.hardware.kv_capacity.resolve_kv`)."""
    e = scn.engine
    tpb = int(knobs.get("tokens_per_block", DEFAULT_TOKENS_PER_BLOCK))
    fraction = float(knobs.get("free_gpu_memory_fraction", DEFAULT_FRACTION))
    if e.num_gpu_blocks is not None:
        tokens = e.num_gpu_blocks * e.block_size
        pool = TrtllmKV(tpb, tokens // tpb, f"pinned: engine.num_gpu_blocks {e.num_gpu_blocks} × engine.block_size "
                                            f"{e.block_size} = {tokens:,} tokens = {tokens // tpb:,} blocks of {tpb}")
        if pool.num_blocks < 1:
            raise CbsimError(f"engine.num_gpu_blocks {e.num_gpu_blocks} × block_size {e.block_size} holds no trtllm "
                             f"block of tokens_per_block {tpb}: pin more blocks or lower tokens_per_block")
    else:
        pool = trtllm_kv(model, gpu, scn.hardware, scn.hardware.tensor_parallel,
                         max_num_tokens=e.max_num_batched_tokens, max_seq_len=e.max_model_len,
                         fraction=fraction, tokens_per_block=tpb)
        if pool.num_blocks * tpb < e.max_model_len:
            raise CbsimError(
                f"the TensorRT-LLM KV cache of {model.name!r} on {gpu.name} holds {pool.num_blocks * tpb} tokens, "
                f"fewer than engine.max_model_len ({e.max_model_len}): lower engine.max_model_len, raise "
                f"hardware.tensor_parallel, or pin engine.num_gpu_blocks")
    if pool.num_blocks * scn.replicas.count > MAX_KV_BLOCKS:
        raise CbsimError(f"the trtllm KV cache would have {pool.num_blocks:,} blocks per replica × "
                         f"{scn.replicas.count} replica(s), more than the {MAX_KV_BLOCKS:,} blocks cbsim simulates; "
                         f"raise tokens_per_block or pin engine.num_gpu_blocks")
    return pool
