"""A scenario resolved once: the model spec, GPU spec, parallel layout, engine limits and KV capacity
that one replica runs with.

Why one object: the raw scenario names things (``model: llama-3-8b``, ``hardware.gpu: h200``) and
each layer used to turn those names into specs again, seven times on one ``cbsim validate`` path.
Model configs from files and new GPUs have one door now: :func:`resolve`. The engine loop, the
latency backends, the planners and ``calib/`` take a :class:`Deployment` and read its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from policies.base import EngineLimits
from sim.hardware.gpus import GPUSpec, get_gpu
from sim.hardware.kv_capacity import expert_parallel, resolve_kv
from sim.hardware.kv_tiers import host_link, offload_config
from sim.hardware.models import ModelSpec, get_model
from sim.scenario.schema import Scenario


@dataclass(frozen=True)
class Deployment:
    """What one replica of a scenario runs: resolved once, read everywhere."""

    scenario: Scenario
    model: ModelSpec
    gpu: GPUSpec
    tensor_parallel: int
    limits: EngineLimits  # KV capacity included: limits.num_gpu_blocks (usable) and num_cpu_blocks

    @property
    def block_size(self) -> int:
        return self.limits.block_size

    @property
    def data_parallel(self) -> int:
        return self.scenario.hardware.data_parallel

    @property
    def replicas(self) -> int:
        """Engines simulated: ``replicas.count`` × ``hardware.data_parallel`` (each data-parallel
        rank schedules its own requests and holds its own KV cache, as in vLLM)."""
        return self.scenario.replicas.count * self.scenario.hardware.data_parallel

    @property
    def lockstep(self) -> int:
        """Data-parallel ranks that step together: ``data_parallel`` for an MoE model (its experts
        span every rank, :mod:`sim.lockstep`), 1 (independent engines) for a dense one."""
        return self.data_parallel if self.model.is_moe and self.data_parallel > 1 else 1

    @property
    def table_path(self) -> Path | None:
        """The latency table folder, resolved against the scenario file's location."""
        lat = self.scenario.latency
        if lat.name:  # a shipped table: from the installed package, wherever the scenario file is
            from sim.latency.shipped import shipped_table_path

            return shipped_table_path(lat.name)
        return self.scenario.resolve_path(lat.path) if lat.path else None

    def limits_for(self, policy: str, knobs: dict | None = None) -> EngineLimits:
        """The limits one policy runs with: unset ``engine.max_num_seqs`` / ``max_num_batched_tokens``
        take that policy's engine defaults on this GPU, and the KV pool is sized with them
        (:mod:`sim.scenario.batch_limits`). ``limits`` is the same for policies without defaults of
        their own."""
        from policies.registry import POLICIES
        from sim.scenario.batch_limits import sized_for

        cls = POLICIES.get(policy)
        if cls is not None and cls.kv_sizing in ("sglang", "tgi") and self.scenario.engine.num_gpu_blocks is None:
            return own_pool_limits(self, cls, knobs or {})
        scn = sized_for(self.scenario, self.gpu, policy, knobs)
        if _kv_sizing(policy) == "trtllm":
            return trtllm_limits(scn, self.model, self.gpu, knobs or {})
        if scn is self.scenario:
            return self.limits
        limits = engine_limits(scn, self.model, self.gpu)
        return self.limits if limits == self.limits else limits

    def kv_sizing(self, policy: str, knobs: dict | None = None) -> str:
        """How the policy's KV pool was sized, in words with the figures (the run's summary meta)."""
        e = self.scenario.engine
        if _kv_sizing(policy) == "trtllm":
            from sim.hardware.trtllm_kv import trtllm_pool
            from sim.scenario.batch_limits import sized_for

            return trtllm_pool(sized_for(self.scenario, self.gpu, policy, knobs), self.model, self.gpu,
                               knobs or {}).note
        if e.num_gpu_blocks is not None:
            return f"pinned: engine.num_gpu_blocks {e.num_gpu_blocks} of {e.block_size} tokens"
        limits = self.limits_for(policy, knobs)
        if _kv_sizing(policy) == "sglang":
            return (f"SGLang: (memory × mem_fraction_static − weights) / KV bytes per token = "
                    f"{limits.num_gpu_blocks * limits.block_size:,} tokens (sim/hardware/engine_memory.py)")
        if _kv_sizing(policy) == "tgi":
            return (f"TGI warm-up: (memory − weights − one prefill of max_batch_prefill_tokens) × 0.90 = "
                    f"{limits.num_gpu_blocks * limits.block_size:,} tokens (sim/hardware/engine_memory.py)")
        return (f"vLLM: (memory × gpu_memory_utilization {self.scenario.hardware.gpu_memory_utilization} − weights − "
                f"profiling peak) = {limits.num_gpu_blocks:,} usable blocks of {limits.block_size}")

    def latency(self):
        """A fresh latency model for one replica (backends keep per-replica state such as warnings)."""
        from sim.latency import make_latency

        return make_latency(self.scenario.latency, self.model, self.gpu, self.tensor_parallel, self.block_size,
                            self.table_path, async_scheduling=self.scenario.engine.async_scheduling,
                            data_parallel=self.data_parallel, expert_parallel=expert_parallel(self.scenario.hardware))


def engine_limits(scn: Scenario, model: ModelSpec, gpu: GPUSpec) -> EngineLimits:
    """The engine section with the KV pool computed for this model on this GPU."""
    from sim.scenario.batch_limits import device_of, sized_for

    scn = sized_for(scn, gpu)  # unset batch limits: the defaults shared by policies without their own
    gpu_blocks, cpu_blocks = resolve_kv(scn, model, gpu)
    e = scn.engine
    return EngineLimits(
        block_size=e.block_size,
        num_gpu_blocks=gpu_blocks,
        num_cpu_blocks=cpu_blocks,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.max_model_len,
        device=device_of(gpu, scn.hardware.tensor_parallel),
        kv_offload=offload_config(e, model, gpu, scn.hardware.tensor_parallel),
        kv_host_link=host_link(model, gpu, scn.hardware.tensor_parallel),
    )


def own_pool_limits(dep: Deployment, cls, knobs: dict) -> EngineLimits:
    """The limits of a policy whose engine sizes its KV pool by its own rule (SGLang's
    ``mem_fraction_static``, TGI's warm-up: :mod:`sim.hardware.engine_memory`), then takes its own
    batch defaults from that pool (SGLang's running cap) through the policy's ``resolve_limits``."""
    from policies.sglang import sglang_chunk_default
    from sim.hardware.engine_memory import sglang_pool_tokens, tgi_pool_tokens
    from sim.scenario.batch_limits import device_of

    scn, model, gpu = dep.scenario, dep.model, dep.gpu
    e, tp, ep = scn.engine, dep.tensor_parallel, expert_parallel(scn.hardware)
    device = device_of(gpu, tp)
    merged = {k: knob.default for k, knob in cls.KNOBS.items()}
    merged.update(knobs)
    if cls.kv_sizing == "sglang":
        chunk = merged.get("chunked_prefill_size")
        if chunk is None:
            chunk = e.max_num_batched_tokens if e.max_num_batched_tokens is not None else sglang_chunk_default(device)
        tokens = sglang_pool_tokens(model, gpu, tp, ep, int(chunk), merged.get("mem_fraction_static"),
                                    e.max_model_len, int(merged.get("max_prefill_tokens") or 16384))
    elif cls.kv_sizing == "tgi":
        tokens = tgi_pool_tokens(model, gpu, tp, ep, int(merged["max_batch_prefill_tokens"]), int(merged["block_size"]),
                                 e.max_model_len)
    else:
        raise ValueError(f"no KV pool rule {cls.kv_sizing!r}")
    unset = EngineLimits(block_size=e.block_size, num_gpu_blocks=max(tokens // e.block_size, 1),
                         num_cpu_blocks=dep.limits.num_cpu_blocks, max_num_seqs=e.max_num_seqs,
                         max_num_batched_tokens=e.max_num_batched_tokens, max_model_len=e.max_model_len,
                         device=device, kv_host_link=dep.limits.kv_host_link)
    return cls.resolve_limits(unset, merged)


def _kv_sizing(policy: str) -> str:
    from policies.registry import POLICIES

    cls = POLICIES.get(policy)
    return cls.kv_sizing if cls is not None else "vllm"


def trtllm_limits(scn: Scenario, model: ModelSpec, gpu: GPUSpec, knobs: dict) -> EngineLimits:
    """The engine section with the KV pool sized as TensorRT-LLM sizes it (sim/hardware/trtllm_kv.py):
    blocks of ``tokens_per_block`` tokens, no CPU swap pool."""
    from sim.hardware.trtllm_kv import trtllm_pool
    from sim.scenario.batch_limits import device_of

    pool = trtllm_pool(scn, model, gpu, knobs)
    e = scn.engine
    return EngineLimits(block_size=pool.tokens_per_block, num_gpu_blocks=pool.num_blocks, num_cpu_blocks=0,
                        max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
                        max_model_len=e.max_model_len, device=device_of(gpu, scn.hardware.tensor_parallel))


def resolve(scn: Scenario) -> Deployment:
    """The one place a scenario's names become specs (errors name the scenario key to fix)."""
    model = with_kv_cache_dtype(get_model(scn.model), scn.engine.kv_cache_dtype)
    gpu = get_gpu(scn.hardware.gpu)
    return Deployment(scenario=scn, model=model, gpu=gpu, tensor_parallel=scn.hardware.tensor_parallel,
                      limits=engine_limits(scn, model, gpu))


def with_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str) -> ModelSpec:
    """The model with ``engine.kv_cache_dtype`` applied (``auto`` leaves it as it is), so weight
    bytes, KV capacity and every latency backend see one spec."""
    if kv_cache_dtype in (None, "auto"):
        return model
    from dataclasses import replace

    return replace(model, kv_cache_dtype=kv_cache_dtype)
