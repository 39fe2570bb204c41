"""How many KV-cache blocks a GPU holds, computed the way vLLM computes it.

vLLM (``Worker.determine_available_memory`` then ``get_kv_cache_config``) takes the GPU's total
memory times ``gpu_memory_utilization``, subtracts what the model needs outside the KV cache
(its weights, plus the peak activation and non-torch memory measured by a profiling forward pass
over ``max_num_batched_tokens`` tokens), and divides the rest by the bytes of one block:

    num_gpu_blocks = (memory × gpu_memory_utilization − weights − activation reserve)
                     // (block_size × 2 × kv_heads_per_rank × head_dim × kv_dtype_bytes × layers)

(MLA models, DeepSeek/Kimi: ``block_size × (kv_lora_rank + qk_rope_head_dim) × kv_dtype_bytes ×
layers``, one latent per token on every rank: vLLM's ``MLAAttentionSpec``.)
``memory`` is what the device reports (:mod:`sim.hardware.gpus`), ``kv_dtype_bytes`` follows
``engine.kv_cache_dtype``, sliding-window layers are charged at most their window of a
``max_model_len`` request (:meth:`ModelSpec.kv_capacity_bytes_per_token`), and with expert
parallelism each GPU holds ``num_experts / ep`` experts (without it, with data-parallel
attention, each expert's width is split over tensor × data parallel GPUs).

Everything is per GPU: with tensor parallelism each GPU holds its shard of the weights and of
the KV heads, and every GPU holds the same number of blocks (one block = block_size tokens).

We do not profile, so the activation reserve is estimated from the shapes the profiling pass
runs (:mod:`sim.hardware.memory_profile`: forward pass at ``max_num_batched_tokens``, sampler at
``max_num_seqs``, non-torch memory), or pinned with ``hardware.activation_reserve_gib``. The CPU swap pool is
``swap_space_gib`` GiB of host memory per GPU divided by the same block size, as vLLM's
``swap_space`` does.

vLLM V1 keeps block 0 as its *null block*, so a pool of N blocks has N − 1 usable ones;
:func:`resolve_kv` returns usable counts, the unit of ``EngineLimits.num_gpu_blocks`` and of the
scenario key ``engine.num_gpu_blocks``.
"""

from __future__ import annotations

from sim.errors import CbsimError
from sim.hardware.gpus import GPUSpec
from sim.hardware.memory_profile import activation_reserve_bytes
from sim.hardware.models import ModelSpec

GIB = 1 << 30
# Most KV blocks cbsim simulates (over all replicas): vllm-v1's pool keeps a few integers per
# block, so beyond this a run would exhaust memory before it started.
MAX_KV_BLOCKS = 1 << 24


def block_bytes(model: ModelSpec, block_size: int, tp: int = 1, max_model_len: int | None = None) -> float:
    """Bytes of one KV block on one GPU (sliding-window layers charged as
    :meth:`ModelSpec.kv_capacity_bytes_per_token` says; an integer without them)."""
    per_token = model.kv_capacity_bytes_per_token(tp, max_model_len)
    return block_size * (int(per_token) if float(per_token).is_integer() else per_token)


def reserve_bytes(model: ModelSpec, hardware_cfg, tp: int = 1, max_num_batched_tokens: int = 8192,
                  max_num_seqs: int = 256) -> int:
    """What the profiling pass takes besides weights: ``hardware.activation_reserve_gib`` when
    set, else :func:`sim.hardware.memory_profile.activation_reserve_bytes` at the token budget."""
    pinned = getattr(hardware_cfg, "activation_reserve_gib", None)
    if pinned is not None:
        return int(pinned * GIB)
    return activation_reserve_bytes(model, max_num_batched_tokens, max_num_seqs, tp, expert_parallel(hardware_cfg),
                                    moe_tensor_parallel(hardware_cfg))


def num_gpu_blocks(model: ModelSpec, gpu: GPUSpec, hardware_cfg, block_size: int, tp: int = 1, *,
                   max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
                   max_model_len: int | None = None) -> int:
    """vLLM's ``num_gpu_blocks`` (the whole pool, null block included) for one GPU.

    ``hardware_cfg`` supplies ``gpu_memory_utilization``, ``activation_reserve_gib`` (null: estimated
    from the token budget and ``max_num_seqs``, :mod:`sim.hardware.memory_profile`) and the
    expert-parallel layout (the scenario's ``hardware`` section, or any object with those
    attributes). Raises :class:`CbsimError` stating bytes needed and available when not even one
    block fits.
    """
    util = hardware_cfg.gpu_memory_utilization
    reserve = reserve_bytes(model, hardware_cfg, tp, max_num_batched_tokens, max_num_seqs)
    budget = gpu.memory_bytes * util
    weights = model.weight_bytes(tp, expert_parallel(hardware_cfg), moe_tensor_parallel(hardware_cfg))
    per_block = block_bytes(model, block_size, tp, max_model_len)
    available = budget - weights - reserve
    if available < per_block:
        needed = int(weights + reserve + per_block)
        raise CbsimError(
            f"model {model.name!r} does not fit on {gpu.name} with tensor_parallel={tp}: each GPU needs "
            f"{_bytes(weights)} of weights + {_bytes(reserve)} activation reserve + at least one KV block "
            f"({_bytes(per_block)}) = {needed:,} bytes ({_bytes(needed)}), but "
            f"{gpu.memory_bytes:,} bytes × gpu_memory_utilization {util} = {int(budget):,} bytes "
            f"({_bytes(budget)}) are available. Raise hardware.tensor_parallel, choose a GPU with more "
            f"memory, raise hardware.gpu_memory_utilization, or use a smaller model."
        )
    return int(available // per_block)


def expert_parallel(hardware_cfg) -> int:
    """Expert-parallel GPUs: tensor × data parallel with ``hardware.expert_parallel``, else 1."""
    if not getattr(hardware_cfg, "expert_parallel", False):
        return 1
    return getattr(hardware_cfg, "tensor_parallel", 1) * getattr(hardware_cfg, "data_parallel", 1)


def moe_tensor_parallel(hardware_cfg) -> int:
    """GPUs one expert's width is split over without expert parallelism: tensor × data parallel (vLLM's
    MoE layers form one ``tp × dp`` group when the attention is data-parallel)."""
    return getattr(hardware_cfg, "tensor_parallel", 1) * getattr(hardware_cfg, "data_parallel", 1)


def num_cpu_blocks(swap_space_gib: float, model: ModelSpec, block_size: int, tp: int = 1,
                   max_model_len: int | None = None) -> int:
    """Blocks of the CPU swap pool: ``swap_space_gib`` GiB per GPU // bytes per block."""
    return int(int(swap_space_gib * GIB) // block_bytes(model, block_size, tp, max_model_len))


def resolve_kv(scenario, model: ModelSpec, gpu: GPUSpec) -> tuple[int, int]:
    """(usable GPU blocks, CPU swap blocks) for one replica of a scenario, whose model and GPU
    specs :func:`sim.scenario.resolved.resolve` has already looked up.

    ``engine.num_gpu_blocks`` pins the usable count; otherwise it is :func:`num_gpu_blocks`
    minus vLLM V1's null block. A computed pool that cannot hold one ``max_model_len`` request is
    an error, as in vLLM (``max_model_len`` larger than the KV cache can store), and so is one
    of more than ``MAX_KV_BLOCKS`` blocks over all replicas (a tiny model with block_size 1 on a
    big GPU: tens of millions of blocks would exhaust the simulator's memory before it started).
    """
    usable, cpu = _resolve_kv(scenario, model, gpu)
    replicas = scenario.replicas.count
    if usable * replicas > MAX_KV_BLOCKS:
        eng = scenario.engine
        raise CbsimError(
            f"the KV cache would have {usable:,} blocks of {eng.block_size} tokens per replica × {replicas} "
            f"replica(s), more than the {MAX_KV_BLOCKS:,} blocks cbsim simulates; raise engine.block_size, "
            f"lower hardware.gpu_memory_utilization, or pin engine.num_gpu_blocks"
        )
    return usable, cpu


def _resolve_kv(scenario, model: ModelSpec, gpu: GPUSpec) -> tuple[int, int]:
    tp = scenario.hardware.tensor_parallel
    eng = scenario.engine
    cpu = num_cpu_blocks(eng.swap_space_gib, model, eng.block_size, tp, eng.max_model_len)
    if eng.num_gpu_blocks is not None:
        return eng.num_gpu_blocks, cpu
    usable = num_gpu_blocks(model, gpu, scenario.hardware, eng.block_size, tp,
                            max_num_batched_tokens=eng.max_num_batched_tokens, max_num_seqs=eng.max_num_seqs,
                            max_model_len=eng.max_model_len) - 1
    if usable * eng.block_size < eng.max_model_len:
        # vLLM refuses to start the same way (check_enough_kv_cache_memory, vllm/v1/core/kv_cache_utils.py)
        own = "" if "max_model_len" in eng.model_fields_set else ", unset: the model's own context length"
        raise CbsimError(
            f"the KV cache of {model.name!r} on {gpu.name} holds {usable} blocks × {eng.block_size} = "
            f"{usable * eng.block_size:,} tokens, fewer than engine.max_model_len ({eng.max_model_len:,}{own}), "
            f"so vLLM would not start: set engine.max_model_len to at most {usable * eng.block_size:,}, raise "
            f"hardware.gpu_memory_utilization or tensor_parallel, or pin engine.num_gpu_blocks"
        )
    return usable, cpu


def _bytes(n: float) -> str:
    """GiB for weights, MiB or KiB for a block: never "0.00 GiB"."""
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} bytes"
