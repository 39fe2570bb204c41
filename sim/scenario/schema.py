"""Scenarios: one YAML file that describes everything a run needs, validated before anything runs.

The key names are an interface (scripts, ``--set`` and the results' ``scenario.yaml`` use them),
so they follow DESIGN.md. Every section is a pydantic model that forbids unknown keys, and every
field has a default and a description (``sim.scenario.docs.field_docs(Scenario)`` lists them for docs/scenario-keys.md).
Values are checked strictly: ``block_size: "16"`` is an error, not a silent conversion.

A mistake becomes one :class:`sim.errors.ScenarioError` whose message names the file, the key
path (``engine.max_num_seqs``, ``policies.1.batch_size``), what was expected and the nearest
valid key, instead of pydantic's multi-line report (``sim.scenario.errors`` writes it; the key
table comes from ``sim.scenario.docs``).

Policy entries are open-ended: besides ``name`` and ``label`` an entry takes the knobs its policy
declares (``policies.registry.POLICIES[name].KNOBS``), looked up when the scenario is validated.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from sim.errors import CbsimError, ScenarioError, nearest
from sim.hardware.kv_capacity import MAX_KV_BLOCKS
from sim.scenario.errors import KeyedError, format_validation_error, show_value
from sim.scenario.overrides import StrictLoader, YamlTooLarge, apply_overrides

GIB = 1 << 30


def policy_registry() -> dict:
    """``policies.registry.POLICIES``, imported when a scenario is validated (not at import)."""
    from policies.registry import POLICIES

    return POLICIES


def _cfg(**extra: Any) -> ConfigDict:
    # allow_inf_nan=False: `.inf` or `.nan` in YAML is a mistake, never a rate or a length
    return ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, **extra)


# Sizes past which a run would exhaust memory before it started: refused with a clear message
# instead of an allocation error (10 million requests take several GB as request objects;
# MAX_KV_BLOCKS: see sim.hardware.kv_capacity).
MAX_REQUESTS = 10_000_000
MAX_REPLICAS = 1024
MAX_NAME_BYTES = 200  # a scenario name: 255 (NAME_MAX) less "-sweep" and the temporary folders' affixes
MAX_TOKENS = 10**9  # any token count (lengths, limits): far above every model's context, inside int64


# ------------------------------------------------------------------------------------------------
# model
# ------------------------------------------------------------------------------------------------
class ModelSpecConfig(BaseModel):
    """An inline model spec, for a model that is not in ``sim.hardware.models.MODELS``."""

    model_config = _cfg()

    name: str = Field("inline", description="a name for the model in outputs")
    num_layers: int = Field(gt=0, description="decoder layers (required)")
    hidden_size: int = Field(gt=0, description="model width (required)")
    num_heads: int = Field(gt=0, description="attention (query) heads (required)")
    num_kv_heads: int | None = Field(None, gt=0, description="KV heads (grouped-query attention); null: num_heads")
    head_dim: int | None = Field(None, gt=0, description="per-head width; null: hidden_size / num_heads")
    intermediate_size: int = Field(gt=0, description="MLP width (required)")
    vocab_size: int = Field(gt=0, description="vocabulary size (required)")
    dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="activation dtype (and of weights "
                                                                       "and KV cache unless quantized)")
    tied_embeddings: bool = Field(False, description="LM head shares the embedding matrix")
    num_experts: int | None = Field(None, ge=0, description="routed experts per MoE layer; null/0: a dense MLP")
    num_experts_per_tok: int | None = Field(None, ge=0, description="experts each token is routed to (MoE top-k)")
    moe_intermediate_size: int | None = Field(None, ge=0, description="width of one routed expert (MoE)")
    shared_expert_intermediate_size: int | None = Field(None, ge=0, description="width of the always-on "
                                                        "shared expert (MoE); null/0: none")
    sliding_window: int | None = Field(None, ge=0, description="window of the sliding-window layers, tokens; "
                                       "null/0: none")
    num_sliding_layers: int | None = Field(None, ge=0, description="how many layers use sliding_window")
    quantization: Literal["fp8"] | None = Field(None, description="fp8: w8a8 FP8 linear layers (1 byte per "
                                                "weight); null: weights in dtype")
    kv_lora_rank: int | None = Field(None, ge=0, description="multi-head latent attention (DeepSeek, Kimi): "
                                     "width of the cached KV latent; null/0: grouped-query attention")
    qk_rope_head_dim: int | None = Field(None, ge=0, description="MLA: width of the decoupled rope key "
                                         "(cached beside the latent)")
    qk_nope_head_dim: int | None = Field(None, ge=0, description="MLA: per-head query/key width without rope")
    v_head_dim: int | None = Field(None, ge=0, description="MLA: per-head value width")
    q_lora_rank: int | None = Field(None, ge=0, description="MLA: low-rank query width; null/0: one q_proj")
    first_k_dense_layers: int | None = Field(None, ge=0, description="MoE: leading layers with a dense MLP "
                                             "of intermediate_size (DeepSeek's first_k_dense_replace)")
    expert_quantization: Literal["mxfp4", "int4"] | None = Field(None, description="routed experts only: "
                                                                 "mxfp4 (4.25 bits) or int4 group-32 (4.5 bits) "
                                                                 "weight-only; null: as quantization")
    attention_sinks: bool = Field(False, description="gpt-oss's per-head attention sinks (recorded; priced as "
                                                     "zero: one logit per head)")
    context_length: int | None = Field(None, gt=0, le=MAX_TOKENS,
                                       description="the longest sequence the model takes (its "
                                                   "max_position_embeddings, rope scaling applied): "
                                                   "engine.max_model_len's default; null: set engine.max_model_len")

    @model_validator(mode="after")
    def _check(self) -> ModelSpecConfig:
        from sim.hardware.models import get_model

        if self.head_dim is None and self.hidden_size % self.num_heads:
            # never rounded: a head_dim of 333 for 1000 / 3 would price other matrices than the model's
            raise KeyedError("head_dim", f"not given, and hidden_size {self.hidden_size} is not a multiple of "
                                         f"num_heads {self.num_heads} ({self.hidden_size} / {self.num_heads} = "
                                         f"{self.hidden_size / self.num_heads:.6g}); set head_dim (the per-head "
                                         f"width) or make hidden_size a multiple of num_heads")
        try:
            spec = get_model(self)
        except CbsimError as exc:
            raise ValueError(str(exc)) from None
        self.num_kv_heads, self.head_dim = spec.num_kv_heads, spec.head_dim  # resolved, for to_yaml
        return self


class HfModelConfig(BaseModel):
    """A model read from a Hugging Face ``config.json`` (``sim.hardware.hf_config``)."""

    model_config = _cfg()

    hf_config: str = Field(description="path of a Hugging Face config.json, or of the folder holding it "
                                       "(required); relative paths are tried from the current directory, "
                                       "then from the scenario file's folder")
    name: str | None = Field(None, description="a name for the model in outputs; null: the config's folder")
    quantization: Literal["fp8"] | None = Field(None, description="fp8: price the weights as w8a8 FP8 even "
                                                "if the config has no quantization_config; null: as the config says")


# ------------------------------------------------------------------------------------------------
# hardware, latency, engine
# ------------------------------------------------------------------------------------------------
class GpuConfig(BaseModel):
    """An inline GPU, for one that is not in ``sim.hardware.gpus.GPUS`` (datasheet figures)."""

    model_config = _cfg()

    name: str = Field("inline-gpu", description="a name for the GPU in outputs")
    memory_gib: float = Field(gt=0, description="device memory as the device reports it, GiB "
                                                "(torch.cuda.mem_get_info total; required)")
    bf16_tflops: float = Field(gt=0, description="dense BF16 Tensor Core TFLOP/s (required)")
    memory_bandwidth_gbps: float = Field(gt=0, description="device memory bandwidth, GB/s (required)")
    pcie_gbps: float = Field(32.0, gt=0, description="host <-> device bandwidth, one direction, GB/s")
    fp8_tflops: float = Field(0.0, ge=0, description="dense FP8 Tensor Core TFLOP/s; 0: no FP8 Tensor Cores")
    link_gbps: float | None = Field(None, gt=0, description="GPU <-> GPU bandwidth, one direction, GB/s "
                                                           "(NVLink); null: pcie_gbps")
    link_latency_us: float = Field(10.0, ge=0, description="fixed cost of one collective, microseconds")


class Hardware(BaseModel):
    """The GPUs of ONE replica (a tensor-parallel group); ``replicas.count`` copies it."""

    model_config = _cfg()

    gpu: str | GpuConfig = Field("h200", description="GPU id: h100-sxm, h200, h100-pcie, a100-80gb, a100-40gb, "
                                                     "l40s, b200, rtx-pro-6000, rtx-4090, cpu "
                                                     "(sim.hardware.gpus.GPUS), or an inline spec")
    count: int = Field(1, ge=1, description="GPUs per replica; must equal tensor_parallel × data_parallel "
                                            "(the default follows them); total GPUs = count × replicas.count")
    tensor_parallel: int = Field(1, ge=1, description="tensor-parallel GPUs: weights and KV heads are "
                                                      "sharded over them")
    data_parallel: int = Field(1, ge=1, le=1024, description="data-parallel attention ranks (vLLM's "
                               "--data-parallel-size): each is its own engine (scheduler, KV cache) on "
                               "tensor_parallel GPUs, requests spread over them by replicas.router")
    expert_parallel: bool = Field(False, description="vLLM's --enable-expert-parallel (MoE models): the "
                                  "experts are split over tensor_parallel × data_parallel GPUs instead of "
                                  "each expert's width over tensor_parallel")
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1, description="fraction of GPU memory vLLM may "
                                          "use for weights, activations and KV cache (vLLM's flag)")
    activation_reserve_gib: float | None = Field(
        None, ge=0,
        description="GiB per GPU kept for activations and non-torch memory, subtracted before KV "
                    "blocks are counted; null: estimated as vLLM's profiling pass would measure it "
                    "(forward pass at engine.max_num_batched_tokens, sampler at max_num_seqs, "
                    "non-torch memory: sim.hardware.memory_profile)")

    @model_validator(mode="after")
    def _check(self) -> Hardware:
        gpus = self.tensor_parallel * self.data_parallel
        if "count" not in self.model_fields_set:
            self.count = gpus
        elif self.count != gpus:
            raise KeyedError("count", f"{self.count} GPUs per replica but hardware.tensor_parallel × "
                                      f"data_parallel is {gpus}: one replica is one tensor × data parallel "
                                      f"group, so set count to that (or drop count: it follows them); use "
                                      f"replicas.count for more copies")
        return self


class Latency(BaseModel):
    """Where step times come from (``sim.latency``)."""

    model_config = _cfg()

    backend: Literal["roofline", "constant", "table"] = Field(
        "roofline", description="roofline (datasheet peak rates), constant (every step step_s), or "
                                "table (a measured or fitted latency table at path, or a shipped one by name)")
    step_s: float | None = Field(None, gt=0, description="seconds per step; required for backend "
                                                         "constant, unused otherwise")
    path: str | None = Field(None, description="latency table folder or file; for backend table, this or "
                                               "name; unused otherwise")
    name: str | None = Field(None, description="a table shipped with cbsim, by name (`cbsim tables` lists "
                                               "them), e.g. kernel-db-llama-3-8b-h200-tp1: resolved from the "
                                               "installed package, so a copied scenario still runs; for "
                                               "backend table, this or path")
    overhead_s: float | None = Field(None, ge=0, description="per-step fixed overhead in seconds "
                                     "(roofline, table); null: the backend's own default")
    compute_efficiency: float | None = Field(None, gt=0, le=1, description="roofline: fraction of the dense "
                                             "peak FLOP/s each operator reaches; null: 0.8 (sim.latency.roofline)")
    memory_efficiency: float | None = Field(None, gt=0, le=1, description="roofline: fraction of the memory "
                                            "bandwidth each operator reaches; null: 0.8")

    @model_validator(mode="after")
    def _check(self) -> Latency:
        for key in ("compute_efficiency", "memory_efficiency"):
            if self.backend != "roofline" and getattr(self, key) is not None:
                raise KeyedError(key, f"only used by backend 'roofline', not {self.backend!r}")
        if self.backend == "constant" and self.step_s is None:
            raise KeyedError("step_s", "required for backend 'constant' (seconds per step)")
        if self.backend != "constant" and self.step_s is not None:
            raise KeyedError("step_s", f"only used by backend 'constant', not {self.backend!r}")
        if self.backend == "table" and not self.path and not self.name:
            raise KeyedError("path", "required for backend 'table' (a latency table folder or file), or "
                                     "name: a shipped table (`cbsim tables`)")
        if self.path and self.name:
            raise KeyedError("name", "give either name (a shipped table) or path (a table folder), not both")
        for key in ("path", "name"):
            if self.backend != "table" and getattr(self, key) is not None:
                raise KeyedError(key, f"only used by backend 'table', not {self.backend!r}")
        if self.name is not None:
            from sim.latency.shipped import shipped_table_path

            try:
                shipped_table_path(self.name, field="name")
            except CbsimError as exc:
                raise KeyedError("name", str(exc).removeprefix("name: ")) from None
        if self.backend == "constant" and self.overhead_s is not None:
            raise KeyedError("overhead_s", "not used by backend 'constant' (step_s is the whole step)")
        return self


class KVTier(BaseModel):
    """A KV tier below the CPU one (LMCache's local disk, HiCache's storage): its size and speed."""

    model_config = _cfg()

    name: str = Field(..., min_length=1, description="the tier's name in the summary (e.g. disk)")
    capacity_gib: float = Field(..., gt=0, description="GiB of KV blocks it holds (the total over TP ranks)")
    read_gbps: float = Field(..., gt=0, description="GB/s read back to the GPU (e.g. an NVMe SSD's sequential read)")
    write_gbps: float = Field(..., gt=0, description="GB/s written (blocks demoted from the tier above)")


class Engine(BaseModel):
    """Engine-wide limits, with vLLM's names and defaults."""

    model_config = _cfg()

    block_size: int = Field(16, ge=1, le=MAX_TOKENS, description="tokens per KV block (a power of two)")
    max_num_seqs: int | None = Field(None, ge=1, le=MAX_TOKENS,
                                     description="most requests running at once; null: each policy's engine "
                                                 "default on this GPU (vllm-v1: vLLM 0.32's, e.g. 1024 on "
                                                 "H100/H200; others 256; `cbsim policies`)")
    max_num_batched_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS,
                                               description="token budget of one step (>= block_size); null: "
                                                           "each policy's engine default on this GPU "
                                                           "(vllm-v1: vLLM 0.32's, e.g. 8192 on H100/H200, "
                                                           "2048 on A100/L40S; others 8192)")
    max_model_len: int | None = Field(None, ge=1, le=MAX_TOKENS,
                                      description="longest prompt + output; longer prompts are rejected and "
                                                  "outputs stop there (counted as cut); null: the model's own "
                                                  "context length (config.json max_position_embeddings with "
                                                  "its rope scaling, as vLLM), refused when the KV pool cannot "
                                                  "hold one such request")
    swap_space_gib: float = Field(4.0, ge=0, description="GiB of host memory per GPU for swapped-out KV blocks")
    num_gpu_blocks: int | None = Field(None, ge=1, le=MAX_KV_BLOCKS,
                                       description="pin the usable KV block count; null: computed from "
                                                   "memory as vLLM does (sim.hardware.kv_capacity)")
    enable_prefix_caching: bool | None = Field(None, description="reuse KV blocks of identical prompt "
                                                                 "prefixes (policies that support it); null: "
                                                                 "each engine's default (on in vllm-v1, as in "
                                                                 "vLLM V1)")
    kv_cache_dtype: Literal["auto", "fp8"] = Field("auto", description="KV cache dtype (vLLM's "
                                                   "--kv-cache-dtype): auto = the model's dtype; fp8 = one "
                                                   "byte per element (more blocks, cheaper attention reads)")
    async_scheduling: bool = Field(True, description="vLLM's async scheduling (on by default since vLLM 0.14, "
                                                     "PR #27614): the engine's CPU time per step (a table's "
                                                     "engine_cpu) overlaps the GPU's, a step takes the larger "
                                                     "of the two; false: their sum (vLLM before 0.14 launched "
                                                     "without --async-scheduling, or --no-async-scheduling)")

    kv_offloading_size: float | None = Field(None, gt=0, description="GiB of CPU memory for KV blocks evicted "
                                             "from the GPU prefix cache (vLLM's --kv-offloading-size, the "
                                             "total over TP ranks); null: no offloading (vllm-v1 only; "
                                             "docs/kv-tiers.md)")
    kv_offloading_backend: Literal["native", "lmcache"] = Field(
        "native", description="vLLM's --kv-offloading-backend: native (OffloadingConnector: loads overlap "
                              "a step, the request computes from the next) or lmcache (256-token chunks, "
                              "loads on the step)")
    kv_tiers: list[KVTier] = Field(default_factory=list, description="further tiers below the CPU one, in "
                                   "order (e.g. a local disk); needs kv_offloading_size")

    @model_validator(mode="after")
    def _check(self) -> Engine:
        if self.kv_tiers and self.kv_offloading_size is None:
            raise KeyedError("kv_tiers", "needs engine.kv_offloading_size (the CPU tier above them); set it")
        if self.block_size & (self.block_size - 1):
            raise KeyedError("block_size", f"must be a power of two, got {self.block_size}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.block_size:
            raise KeyedError("max_num_batched_tokens", f"must be >= block_size ({self.block_size}), "
                                                       f"got {self.max_num_batched_tokens}")
        return self


# ------------------------------------------------------------------------------------------------
# workload
# ------------------------------------------------------------------------------------------------
def _check_dist_params(dist, params: dict[str, tuple[str, ...]]):
    """Check a {dist, value, min, max, mean, p99} section against its table of each dist's parameters.

    Shared by TimeDist (seconds) and LengthDist (tokens), whose keys and rules are the same: each dist
    takes exactly its own parameters, uniform wants min <= max, lognormal a p99 above the mean.
    """
    needed = params[dist.dist]
    for key in ("value", "min", "max", "mean", "p99"):
        given = getattr(dist, key) is not None
        if key in needed and not given:
            raise KeyedError(key, f"required for dist {dist.dist!r}")
        if key not in needed and given:
            use = [d for d, ps in params.items() if key in ps][0]
            raise KeyedError(key, f"not used by dist {dist.dist!r} (it belongs to dist {use!r}); "
                                  f"dist {dist.dist!r} takes {', '.join(needed) or 'nothing'}")
    if dist.dist == "uniform" and dist.min > dist.max:
        raise KeyedError("min", f"must be <= max ({dist.max}), got {dist.min}")
    if dist.dist == "lognormal":
        from sim.workload.distributions import lognormal_params

        try:
            lognormal_params(dist.mean, dist.p99)
        except CbsimError as exc:
            raise KeyedError("p99", str(exc)) from None
    return dist


class TimeDist(BaseModel):
    """A distribution of seconds (a client's think time)."""

    model_config = _cfg()

    dist: Literal["fixed", "uniform", "exponential", "lognormal"] = Field(
        "fixed", description="fixed {value}, uniform {min, max}, exponential {mean}, lognormal {mean, p99}")
    value: float | None = Field(None, ge=0, description="seconds (fixed)")
    min: float | None = Field(None, ge=0, description="shortest (uniform)")
    max: float | None = Field(None, ge=0, description="longest (uniform)")
    mean: float | None = Field(None, gt=0, description="mean seconds (exponential, lognormal)")
    p99: float | None = Field(None, gt=0, description="99th-percentile seconds (lognormal), > mean")

    @model_validator(mode="after")
    def _check(self) -> TimeDist:
        return _check_dist_params(self, _TIME_PARAMS)


_TIME_PARAMS = {"fixed": ("value",), "uniform": ("min", "max"), "exponential": ("mean",),
                "lognormal": ("mean", "p99")}


class Arrival(BaseModel):
    """When requests arrive: an open-loop process (at a rate) or closed-loop clients."""

    model_config = _cfg()

    process: Literal["poisson", "gamma", "constant", "trace", "closed"] = Field(
        "poisson", description="poisson (exponential gaps), gamma (gaps with coefficient of variation cv), "
                               "constant (equal gaps), trace (the trace's timestamps), closed (concurrency "
                               "clients, each sending its next request when its previous one ends: "
                               "vllm bench serve --max-concurrency; docs/closed-loop.md)")
    rate: float | None = Field(None, gt=0, description="requests per second; required for poisson, gamma "
                                                       "and constant")
    cv: float | None = Field(None, gt=0, description="coefficient of variation of the gaps; required for "
                                                     "gamma (1 = Poisson, >1 burstier)")
    concurrency: int | None = Field(None, ge=1, le=MAX_REQUESTS, description="closed: clients, each with "
                                    "one request in flight at a time (required for process closed)")
    think_time_s: float | TimeDist | None = Field(None, description="closed: seconds a client waits after "
                                                  "its request ends (last token, or rejection) before it "
                                                  "sends the next; a number or a distribution "
                                                  "{dist: fixed|uniform|exponential|lognormal}; null: 0")
    ramp_s: float | None = Field(None, ge=0, description="closed: the window [0, ramp_s) the clients' "
                                 "first sends are placed in (how: start); null: all at t = 0")
    start: Literal["together", "even", "random"] | None = Field(
        None, description="closed: how the clients' first sends are placed: together (all at t = 0), even "
                          "(client c at c × ramp_s / concurrency), random (each uniform over [0, ramp_s), "
                          "drawn from the scenario's seed, sent in time order); null: even with ramp_s, "
                          "together without")

    @model_validator(mode="after")
    def _check(self) -> Arrival:
        if self.process == "trace" and self.rate is not None:
            raise KeyedError("rate", "not used with process 'trace' (arrivals are the trace's timestamps); "
                                     "scale them with workload.trace.rate_scale")
        if self.process == "closed" and self.rate is not None:
            raise KeyedError("rate", "not used with process 'closed' (clients send when their previous "
                                     "request ends); set concurrency instead")
        if self.process not in ("trace", "closed") and self.rate is None:
            raise KeyedError("rate", f"required for process {self.process!r} (requests per second)")
        if self.process == "gamma" and self.cv is None:
            raise KeyedError("cv", "required for process 'gamma' (coefficient of variation of the gaps)")
        if self.process != "gamma" and self.cv is not None:
            raise KeyedError("cv", f"only used by process 'gamma', not {self.process!r}")
        if self.process == "closed" and self.concurrency is None:
            raise KeyedError("concurrency", "required for process 'closed' (how many clients send at once)")
        for key in ("concurrency", "think_time_s", "ramp_s", "start"):
            if self.process != "closed" and getattr(self, key) is not None:
                raise KeyedError(key, f"only used by process 'closed', not {self.process!r}")
        if self.start in ("even", "random") and not self.ramp_s:
            raise KeyedError("ramp_s", f"required (> 0 seconds) with start {self.start!r}: the window the first "
                                       "sends are placed in")
        if self.start == "together" and self.ramp_s:
            raise KeyedError("start", "'together' sends every first request at t = 0, but ramp_s is "
                                      f"{self.ramp_s}: drop ramp_s, or set start to even or random")
        if isinstance(self.think_time_s, float | int) and self.think_time_s < 0:
            raise KeyedError("think_time_s", f"must be >= 0 seconds, got {self.think_time_s}")
        return self

    @property
    def closed(self) -> bool:
        return self.process == "closed"


_DIST_PARAMS = {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("mean", "p99"), "azure-conv": (),
                "trace": ()}


class LengthDist(BaseModel):
    """A distribution of token counts."""

    model_config = _cfg()

    dist: Literal["fixed", "uniform", "lognormal", "azure-conv", "trace"] = Field(
        "fixed", description="fixed {value}, uniform {min, max} (inclusive), lognormal {mean, p99}, azure-conv "
                             "(the Azure conversation trace's lengths by quantiles, built in), or trace (the "
                             "trace's own lengths)")
    value: int | None = Field(None, ge=1, le=MAX_TOKENS, description="tokens (fixed)")
    min: int | None = Field(None, ge=1, le=MAX_TOKENS, description="smallest length (uniform)")
    max: int | None = Field(None, ge=1, le=MAX_TOKENS, description="largest length (uniform)")
    mean: float | None = Field(None, gt=0, le=MAX_TOKENS, description="mean length (lognormal)")
    p99: float | None = Field(None, gt=0, le=MAX_TOKENS, description="99th-percentile length (lognormal), > mean")

    @model_validator(mode="after")
    def _check(self) -> LengthDist:
        return _check_dist_params(self, _DIST_PARAMS)


class TraceSource(BaseModel):
    """A trace file to replay (``sim.workload.traces``)."""

    model_config = _cfg()

    path: str = Field(description="trace file (required); relative paths are tried from the current "
                                  "directory, then from the scenario file's folder")
    format: Literal["azure", "mooncake", "csv"] | None = Field(
        None, description="azure (TIMESTAMP,ContextTokens,GeneratedTokens), mooncake (JSONL with hash_ids), "
                          "csv (arrival_s,prompt_tokens,output_tokens); null: detected from the file")
    rate_scale: float = Field(1.0, gt=0, description="divide arrival times by this (2 = twice the rate)")
    window_s: list[float] | None = Field(None, min_length=2, max_length=2,
                                         description="[start, end) in the trace's seconds, applied before "
                                                     "rate_scale; arrivals re-based to start; null: whole trace")

    @model_validator(mode="after")
    def _check(self) -> TraceSource:
        if self.window_s is not None:
            start, end = self.window_s
            if start < 0 or not start < end:
                raise KeyedError("window_s", f"must be [start, end) with 0 <= start < end, got {self.window_s}")
        return self


class Prefix(BaseModel):
    """Synthetic shared prefixes (system prompts, few-shot examples) for prefix caching."""

    model_config = _cfg()

    num_groups: int = Field(1, ge=1, le=MAX_REQUESTS,
                            description="distinct shared prefixes; each request draws one uniformly")
    prefix_len: int = Field(ge=1, le=MAX_TOKENS, description="tokens of the shared prefix (required); a "
                                                             "prompt shorter than this is all prefix")


class SystemPrompt(BaseModel):
    """The system prompts sessions start with: each session draws one of ``num_groups`` uniformly."""

    model_config = _cfg()

    num_groups: int = Field(1, ge=1, le=MAX_REQUESTS, description="distinct system prompts")
    tokens: int = Field(0, ge=0, le=MAX_TOKENS, description="tokens of each system prompt; 0: none")


class Sessions(BaseModel):
    """Multi-turn sessions (chat, agents): turn k+1 is sent think_time_s after turn k's last token,
    its prompt the whole history (system prompt, every earlier message and answer) plus a new
    message (docs/sessions.md)."""

    model_config = _cfg()

    count: int = Field(ge=1, le=MAX_REQUESTS, description="sessions (required); they start by "
                       "workload.arrival (rate: sessions per second; closed: concurrency sessions at a time)")
    turns: LengthDist = Field(default_factory=lambda: LengthDist(dist="fixed", value=4),
                              description="turns per session (requests); a turn whose prompt would not fit "
                                          "engine.max_model_len ends its session early")
    think_time_s: float | TimeDist = Field(0.0, description="seconds between a turn's last token and the next "
                                           "turn's send: a number or {dist: fixed|uniform|exponential|lognormal}")
    new_tokens: LengthDist = Field(default_factory=lambda: LengthDist(dist="fixed", value=128),
                                   description="tokens of each turn's new user (or tool) message")
    output_tokens: LengthDist = Field(default_factory=lambda: LengthDist(dist="fixed", value=256),
                                      description="tokens of each turn's answer")
    system_prompt: SystemPrompt = Field(default_factory=SystemPrompt, description="the shared system prompts")

    @model_validator(mode="after")
    def _check(self) -> Sessions:
        if self.turns.dist in ("trace", "azure-conv"):
            raise KeyedError("turns.dist", f"{self.turns.dist!r} is a token-length table; turns takes fixed, "
                                           f"uniform or lognormal")
        for key in ("new_tokens", "output_tokens"):
            if getattr(self, key).dist == "trace":
                raise KeyedError(f"{key}.dist", "'trace' is not a session distribution: a trace with "
                                                "session_id and turn columns replays as sessions itself")
        if isinstance(self.think_time_s, float | int) and self.think_time_s < 0:
            raise KeyedError("think_time_s", f"must be >= 0 seconds, got {self.think_time_s}")
        return self


class InlineRequest(BaseModel):
    """One request written out in the scenario."""

    model_config = _cfg()

    arrival_s: float = Field(0.0, ge=0, description="arrival time in seconds")
    prompt_tokens: int = Field(ge=1, le=MAX_TOKENS, description="prompt length (required)")
    output_tokens: int = Field(ge=1, le=MAX_TOKENS, description="tokens it really generates (required)")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS,
                                   description="the client's limit (>= output_tokens); null: "
                                               "workload.max_tokens, else output_tokens")
    priority: int = Field(0, ge=-MAX_TOKENS, le=MAX_TOKENS,
                          description="scheduling priority (policies that use it; lower runs first)")

    @model_validator(mode="after")
    def _check(self) -> InlineRequest:
        if self.max_tokens is not None and self.max_tokens < self.output_tokens:
            raise KeyedError("max_tokens", f"must be >= output_tokens ({self.output_tokens}), got {self.max_tokens}")
        return self


def _default_arrival() -> Arrival:
    return Arrival(process="poisson", rate=1.0)


def _default_prompt() -> LengthDist:
    # Azure LLM inference trace, conversation (Patel et al., Splitwise, ISCA'24), by its quantiles
    # (sim.workload.azure_conv): mean 1155, median 1020, p99 4142.
    return LengthDist(dist="azure-conv")


def _default_output() -> LengthDist:
    # Same trace: output mean 211, median 129, p99 601 (bimodal: no lognormal matches all three).
    return LengthDist(dist="azure-conv")


class Workload(BaseModel):
    """What requests arrive: synthetic, replayed from a trace, or written out (``requests``)."""

    model_config = _cfg()

    num_requests: int | None = Field(1000, ge=1, le=MAX_REQUESTS,
                                     description="requests to generate (synthetic); with a "
                                     "trace the first N of the window (default: all); with requests: "
                                     "their count")
    arrival: Arrival = Field(default_factory=_default_arrival,
                             description="arrival process; default Poisson at 1 req/s (with a trace: its "
                                         "timestamps)")
    prompt_tokens: LengthDist = Field(default_factory=_default_prompt,
                                      description="prompt lengths; default azure-conv: the Azure conversation "
                                                  "trace's (mean 1155, median 1020, p99 4142; with a trace: "
                                                  "its lengths)")
    output_tokens: LengthDist = Field(default_factory=_default_output,
                                      description="output lengths (where EOS comes); default azure-conv: the Azure "
                                                  "conversation trace's (mean 211, median 129, p99 601; with a "
                                                  "trace: its lengths)")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS,
                                   description="the clients' max_tokens for every request (outputs "
                                   "longer are stopped there, and counted); null: a trace's own max_tokens "
                                   "column where it has one, else what the engine fills in, max_model_len - "
                                   "prompt (for traces and synthetic lengths alike; written-out requests: "
                                   "output_tokens)")
    trace: TraceSource | None = Field(None, description="replay a trace file; null: synthetic")
    prefix: Prefix | None = Field(None, description="shared prompt prefixes; null: every prompt unique")
    sessions: Sessions | None = Field(None, description="multi-turn sessions (docs/sessions.md); then "
                                      "num_requests, prompt_tokens and output_tokens are unused; null: none")
    requests: list[InlineRequest] | None = Field(None, min_length=1, description="requests written out one by "
                                                 "one (then arrival, prompt_tokens and output_tokens are unused); "
                                                 "null: generated")

    @model_validator(mode="after")
    def _check(self) -> Workload:
        explicit = self.model_fields_set
        if self.sessions is not None:
            for key in ("requests", "trace", "prefix"):
                if getattr(self, key) is not None:
                    why = {"requests": "written-out requests", "prefix": "sessions share their system_prompt "
                           "and history instead", "trace": "a trace with session_id and turn columns replays "
                           "as sessions itself"}[key]
                    raise KeyedError(key, f"cannot be combined with workload.sessions ({why})")
            for key in ("num_requests", "prompt_tokens", "output_tokens", "max_tokens"):
                if key in explicit and getattr(self, key) is not None:
                    raise KeyedError(key, "not used with workload.sessions (sessions.count, turns, new_tokens "
                                          "and output_tokens say what is sent); drop it")
            if self.arrival.process == "trace":
                raise KeyedError("arrival.process", "'trace' needs workload.trace; sessions start by a "
                                                    "synthetic process or closed-loop clients")
            self.num_requests = None
            return self
        if self.requests is not None:
            for key in ("trace", "prefix"):
                if getattr(self, key) is not None:
                    raise KeyedError(key, "cannot be combined with workload.requests (written-out requests)")
            if "num_requests" not in explicit:
                self.num_requests = None
            elif self.num_requests not in (None, len(self.requests)):
                raise KeyedError("num_requests", f"is {self.num_requests} but workload.requests lists "
                                                 f"{len(self.requests)}; drop num_requests")
            return self
        if self.trace is not None:
            if "arrival" not in explicit:
                self.arrival = Arrival(process="trace")
            if "prompt_tokens" not in explicit:
                self.prompt_tokens = LengthDist(dist="trace")
            if "output_tokens" not in explicit:
                self.output_tokens = LengthDist(dist="trace")
            if "num_requests" not in explicit:
                self.num_requests = None
        else:
            if self.arrival.process == "trace":
                raise KeyedError("arrival.process", "'trace' needs workload.trace {path, format}")
            for key in ("prompt_tokens", "output_tokens"):
                if getattr(self, key).dist == "trace":
                    raise KeyedError(f"{key}.dist", "'trace' needs workload.trace {path, format}")
            if self.num_requests is None:
                raise KeyedError("num_requests", "required for a synthetic workload (how many requests)")
        return self


# ------------------------------------------------------------------------------------------------
# policies, SLO, replicas
# ------------------------------------------------------------------------------------------------
SPEC_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft")
MAX_SPEC_TOKENS = 32


class SpecAcceptance(BaseModel):
    """How often the target accepts draft tokens (``sim.speculative.acceptance``): exactly one key."""

    model_config = _cfg()

    rate: float | None = Field(None, ge=0, le=1, description="one acceptance rate for every draft "
                               "position (the geometric model: each draft accepted with this probability "
                               "once the drafts before it were)")
    per_position: list[float] | None = Field(None, min_length=1, description="vLLM's per-position "
                                             "acceptance rates: the fraction of drafts at position 1, 2, "
                                             "... accepted (non-increasing, one per draft token)")
    mean_length: float | None = Field(None, ge=1, description="a measured mean acceptance length: tokens "
                                      "emitted per verification step, the bonus token included (as the "
                                      "EAGLE papers report it); turned into the geometric rate")

    @model_validator(mode="after")
    def _check(self) -> SpecAcceptance:
        given = [k for k in ("rate", "per_position", "mean_length") if getattr(self, k) is not None]
        if len(given) != 1:
            raise KeyedError("rate", "give exactly one of rate, per_position, mean_length"
                                     + (f" (got {', '.join(given)})" if given else ""))
        pp = self.per_position
        if pp is not None:
            if any(not 0 <= r <= 1 for r in pp):
                raise KeyedError("per_position", f"rates must be in [0, 1], got {pp}")
            if any(b > a for a, b in zip(pp, pp[1:])):
                raise KeyedError("per_position", f"must be non-increasing (a draft is accepted only "
                                                 f"after every draft before it), got {pp}")
        return self


class Speculative(BaseModel):
    """Speculative decoding on a policy entry (vllm-v1, sglang, trtllm): a drafter proposes, the target verifies."""

    model_config = _cfg()

    method: Literal["ngram", "eagle", "eagle3", "mtp", "draft"] = Field(
        description="the drafter (required): ngram (prompt lookup on the CPU), eagle / eagle3 (a one-layer "
                    "head on the target's hidden states), mtp (the model's multi-token-prediction layer), "
                    "draft (a smaller model, draft_model)")
    num_speculative_tokens: int = Field(gt=0, le=MAX_SPEC_TOKENS, description="draft tokens proposed per "
                                        "request and step, k (required; vLLM's num_speculative_tokens, SGLang's "
                                        "speculative_num_steps, TensorRT-LLM's max_draft_len)")
    acceptance: SpecAcceptance = Field(description="acceptance of the drafts (required): rate, "
                                                   "per_position or mean_length")
    draft_model: str | None = Field(
        None, description="method draft: the draft model, a model id or ORG/NAME of a config.json found "
                          "locally (cbsim models), priced on the roofline; unused by the other methods")
    draft_vocab_size: int | None = Field(None, gt=0, description="eagle / eagle3: rows of the head's LM "
                                         "head; null: the target's vocabulary (eagle) or 32000 (eagle3, as "
                                         "the published Llama-3.1-8B EAGLE-3 head)")
    propose_s_per_request: float | None = Field(None, ge=0, description="ngram: CPU seconds of the n-gram "
                                                "search per proposing request and step; null: 1e-05 (an "
                                                "assumption)")
    draft_table: str | None = Field(None, description="latency.backend table: a latency table (a folder, "
                                    "or a shipped table's name) of the drafter's own shapes (cbsim calibrate "
                                    "--from-kernel-db --draft eagle3, or the draft model's table) that prices "
                                    "its passes; null: the roofline")

    @model_validator(mode="after")
    def _check(self) -> Speculative:
        k = self.num_speculative_tokens
        acc = self.acceptance
        if acc.per_position is not None and len(acc.per_position) != k:
            raise KeyedError("acceptance.per_position", f"needs one rate per draft token: "
                                                        f"{len(acc.per_position)} given, num_speculative_tokens is {k}")
        if acc.mean_length is not None and acc.mean_length > k + 1:
            raise KeyedError("acceptance.mean_length", f"at most num_speculative_tokens + 1 = {k + 1} tokens "
                                                       f"a step, got {acc.mean_length}")
        if (self.method == "draft") != (self.draft_model is not None):
            raise KeyedError("draft_model", "required by method draft (the draft model)" if self.method == "draft"
                             else f"only used by method draft, not {self.method!r}")
        if self.draft_model is not None:
            from sim.hardware.models import get_model

            try:
                get_model(self.draft_model)
            except CbsimError as exc:
                raise KeyedError("draft_model", str(exc)) from None
        if self.draft_vocab_size is not None and self.method not in ("eagle", "eagle3"):
            raise KeyedError("draft_vocab_size", f"only used by methods eagle and eagle3, not {self.method!r}")
        if self.draft_table is not None and self.method == "ngram":
            raise KeyedError("draft_table", "method ngram runs no model to price; drop draft_table")
        if self.propose_s_per_request is not None and self.method != "ngram":
            raise KeyedError("propose_s_per_request", f"only used by method ngram, not {self.method!r}")
        return self


class PolicyEntry(BaseModel):
    """One policy to simulate, with its knobs (``cbsim policies`` lists them)."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str = Field(description="policy id (required): a key of policies.registry.POLICIES")
    label: str | None = Field(None, description="the name in results and plots; default: name; unique")
    speculative: Speculative | None = Field(None, description="speculative decoding (vllm-v1, sglang, "
                                            "trtllm): method, num_speculative_tokens, acceptance; null: none")

    @model_validator(mode="after")
    def _check(self) -> PolicyEntry:
        registry = policy_registry()
        if self.name not in registry:
            raise KeyedError("name", f"unknown policy {self.name!r}{nearest(self.name, registry)}; "
                                     f"policies: {', '.join(registry)}")
        cls = registry[self.name]
        if self.speculative is not None and not getattr(cls, "supports_speculation", False):
            supported = [n for n, c in registry.items() if getattr(c, "supports_speculation", False)]
            raise KeyedError("speculative", f"policy {self.name!r} does not model speculative decoding; "
                                            f"drop the key or use {', '.join(supported)}")
        methods = getattr(cls, "speculative_methods", SPEC_METHODS)
        if isinstance(self.speculative, Speculative) and self.speculative.method not in methods:
            raise KeyedError("speculative.method", f"policy {self.name!r} has no {self.speculative.method!r} "
                                                   f"drafter; it supports {', '.join(methods)}")
        knobs = getattr(cls, "KNOBS", {})
        for key, value in (self.__pydantic_extra__ or {}).items():
            if key not in knobs:
                allowed = ["name", "label", *(["speculative"] if cls.supports_speculation else []), *knobs]
                raise KeyedError(key, f" for policy {self.name!r}{nearest(key, allowed)}; "
                                      f"allowed keys: {', '.join(allowed)}", unknown=True)
            problem = _knob_type_problem(knobs[key], value)
            if problem:
                raise KeyedError(key, problem)
        _check_knob_values(cls, self.__pydantic_extra__ or {})
        if self.label is None:
            self.label = self.name
        return self

    def knobs(self) -> dict[str, Any]:
        """The knobs this entry sets (the policy supplies its defaults for the rest)."""
        return dict(self.__pydantic_extra__ or {})


class PoolPolicyEntry(PolicyEntry):
    """A disaggregated pool's scheduler: a policy entry without speculative decoding."""

    speculative: Any = Field(None, description="not modelled in disaggregated pools: must be left out")


def _check_knob_values(cls, knobs: dict[str, Any]) -> None:
    """Knob *values* (chunk_size >= 1, preemption in {recompute, swap}, ...) are checked by the
    policy's own constructor; build one on default limits now, so a bad value is a scenario
    error naming the key rather than a crash when the run starts."""
    from policies.base import EngineLimits
    from policies.kv.hiradix import NOMINAL_HOST_LINK

    try:  # (a nominal host link: SGLang's HiCache knobs are checked against the real one at run time)
        cls(EngineLimits(kv_host_link=NOMINAL_HOST_LINK), **knobs)
    except (ValueError, TypeError) as exc:
        text = str(exc)
        key = next((k for k in knobs if k in text), next(iter(knobs), "name"))
        value = knobs.get(key)
        hint = nearest(str(value), _knob_choices(text)) if isinstance(value, str) else ""
        raise KeyedError(key, f"{text}{hint}") from None


def _knob_choices(text: str) -> list[str]:
    """The quoted choices in a policy's error message ("must be one of ['a', 'b']")."""
    return re.findall(r"'([^']+)'", text.partition("got")[0])


def _knob_type_problem(knob, value) -> str | None:
    if value is None:
        return None if knob.default is None else f"expected {_type_word(knob.type)}, got null"
    kind = getattr(knob, "type", None)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif isinstance(kind, type):
        ok = isinstance(value, kind)
    else:
        ok = True
    return None if ok else f"expected {_type_word(kind)}, got {show_value(value)}"


def _type_word(kind) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        kind, getattr(kind, "__name__", str(kind)))


class Slo(BaseModel):
    """Service-level objectives; each bound is optional."""

    model_config = _cfg()

    ttft_s: float | None = Field(None, gt=0, description="time to first token bound, seconds; null: none")
    tpot_s: float | None = Field(None, gt=0, description="time per output token bound, seconds; null: none")
    e2e_s: float | None = Field(None, gt=0, description="end-to-end latency bound, seconds; null: none")
    percentile: float = Field(99.0, gt=0, lt=100, description="a run meets the SLO when this percentile "
                                                              "of each bounded metric is within bound")


class Replicas(BaseModel):
    """Identical copies of the engine behind a router."""

    model_config = _cfg()

    count: int = Field(1, ge=1, le=MAX_REPLICAS, description="engine replicas, each on hardware.count GPUs")
    router: Literal["round-robin", "least-outstanding", "least-kv", "prefix-affinity"] = Field(
        "round-robin", description="how arrivals are spread over replicas")


# ------------------------------------------------------------------------------------------------
# disaggregation (sim.disaggregation): prefill and decode pools with a KV transfer between them
# ------------------------------------------------------------------------------------------------
class DisaggPool(BaseModel):
    """One pool of a disaggregated deployment: identical instances of one engine.

    ``hardware`` and ``engine`` given here are merged over the scenario's own sections when the
    scenario is loaded (keys left out take the scenario's values; ``hardware.count`` follows the
    pool's parallel layout); null uses the scenario's sections as they are."""

    model_config = _cfg()

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="instances in this pool, each on its "
                                                                "hardware.count GPUs")
    hardware: Hardware | None = Field(None, description="GPUs of one instance of this pool; keys left out "
                                                        "take the scenario's hardware; null: the scenario's")
    engine: Engine | None = Field(None, description="engine limits of this pool's instances (e.g. a large "
                                                    "token budget for prefill, many seqs for decode); keys "
                                                    "left out take the scenario's engine; null: the scenario's")
    latency: Latency | None = Field(None, description="step time model of this pool (a table measured on "
                                                      "its GPU); null: the scenario's latency")
    policy: PoolPolicyEntry = Field(default_factory=lambda: PoolPolicyEntry(name="vllm-v1"),
                                description="the scheduler of this pool's instances, with its knobs; it "
                                            "must hand KV blocks over (vllm-v1)")

    @model_validator(mode="after")
    def _check(self) -> DisaggPool:
        from policies.base import EngineLimits
        from policies.kv.hiradix import NOMINAL_HOST_LINK
        from policies.kv.paged import PagedKVManager

        if self.policy.speculative is not None:
            raise KeyedError("policy.speculative", "speculative decoding is not modelled in disaggregated "
                                                   "pools; drop the key (or simulate it as a colocated policy)")
        cls = policy_registry()[self.policy.name]
        built = cls(EngineLimits(kv_host_link=NOMINAL_HOST_LINK), **self.policy.knobs())
        if not isinstance(getattr(built, "kv", None), PagedKVManager):
            raise KeyedError("policy.name", f"{self.policy.name!r} cannot hand a request's KV blocks to "
                                            f"another instance (it has no paged KV manager); use vllm-v1")
        return self


class Transfer(BaseModel):
    """The KV transfer from a prefill instance to a decode instance."""

    model_config = _cfg()

    link: Literal["per-decode", "per-prefill", "per-pair", "shared"] = Field(
        "per-decode", description="which transfers queue behind each other: one link into each decode "
                                  "instance (its NIC), out of each prefill instance, per (prefill, decode) "
                                  "pair, or one link shared by all")
    bandwidth_gbps: float = Field(50.0, gt=0, description="bandwidth of one link, GB/s (50: one 400 Gb/s "
                                                          "RDMA NIC; an instance with one NIC per GPU has "
                                                          "that many times it)")
    latency_s: float = Field(0.0, ge=0, description="fixed cost of one transfer, seconds (connection, "
                                                    "handshake, metadata)")


class Disaggregation(BaseModel):
    """Prefill/decode disaggregation: prefill instances compute the prompt and the first token, the
    request's KV blocks travel over a link, a decode instance generates the rest."""

    model_config = _cfg()

    label: str | None = Field(None, min_length=1, description="name of the disaggregated run in "
                                                              "outputs; null: xPyD (e.g. 2P1D)")
    prefill: DisaggPool = Field(default_factory=DisaggPool, description="the prefill pool")
    decode: DisaggPool = Field(default_factory=DisaggPool, description="the decode pool")
    transfer: Transfer = Field(default_factory=Transfer, description="the KV transfer between them")
    router: Literal["round-robin", "least-outstanding", "least-kv", "prefix-affinity"] = Field(
        "least-outstanding", description="how arrivals are spread over prefill instances, and prefilled "
                                         "requests over decode instances")

    @property
    def name(self) -> str:
        """The label of the disaggregated run (``label``, or xPyD)."""
        return self.label or f"{self.prefill.replicas}P{self.decode.replicas}D"


def _inherit_pool_sections(data: Any) -> Any:
    """Merge each pool's partial ``hardware`` and ``engine`` over the scenario's (raw data)."""
    if not isinstance(data, dict) or not isinstance(data.get("disaggregation"), dict):
        return data
    data = {**data, "disaggregation": dict(data["disaggregation"])}
    for pool in ("prefill", "decode"):
        section = data["disaggregation"].get(pool)
        if not isinstance(section, dict):
            continue
        section = dict(section)
        for key in ("hardware", "engine"):
            own, base = section.get(key), data.get(key)
            if isinstance(own, dict) and isinstance(base, dict):
                inherited = {k: v for k, v in base.items() if not (key == "hardware" and k == "count")}
                section[key] = {**inherited, **own}
        data["disaggregation"][pool] = section
    return data


def _default_policies() -> list[dict]:
    return [{"name": "vllm-v1"}]


class Scenario(BaseModel):
    """Everything one run needs."""

    model_config = _cfg()

    name: str = Field("scenario", min_length=1, description="names the results folder and plot titles")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="seeds the synthetic workload (same seed, same requests)")
    model: str | HfModelConfig | ModelSpecConfig = Field(
        "llama-3-8b", description="model id (llama-3-8b, llama-3-70b, llama-2-7b, mistral-7b, qwen2.5-7b, "
                                  "tiny), ORG/NAME of a config.json found locally (cbsim models), "
                                  "{hf_config: PATH}, or an inline spec")
    hardware: Hardware = Field(default_factory=Hardware, description="GPUs of one replica")
    latency: Latency = Field(default_factory=Latency, description="step time model")
    workload: Workload = Field(default_factory=Workload, description="requests")
    engine: Engine = Field(default_factory=Engine, description="engine limits")
    policies: list[PolicyEntry] = Field(default_factory=_default_policies, min_length=1,
                                        description="policies to compare on the same workload; default "
                                                    "[{name: vllm-v1}]")
    slo: Slo = Field(default_factory=Slo, description="latency objectives (goodput, meets-SLO)")
    horizon_s: float | None = Field(None, gt=0, description="stop simulated time here (requests still "
                                                            "queued or running are unfinished, reported "
                                                            "as the summary's backlog); null: run until "
                                                            "every request ended, but at most until the "
                                                            "last arrival + max(3600 s, arrival span)")
    replicas: Replicas = Field(default_factory=Replicas, description="engine copies and the router")
    cost_per_gpu_hour: float | None = Field(None, ge=0, description="price of one GPU-hour, for cost "
                                                                    "per request; null: no cost figures")
    disaggregation: Disaggregation | None = Field(
        None, description="prefill/decode disaggregation, simulated besides the colocated policies "
                          "(sim.disaggregation); null: none")

    _source: str | None = PrivateAttr(None)

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, name: str) -> str:
        # the name becomes results/<name>/: one folder, not a path, never "." or ".."
        bad = next((c for c in ("/", "\\", "\x00") if c in name), None)
        if bad is not None or name.strip(".") == "" or name != name.strip():
            shown = {"/": "'/'", "\\": "a backslash", "\x00": "a NUL character"}.get(bad, "")
            raise ValueError(f"must be a plain folder name (it names results/<name>/), got {name!r}"
                             + (f": it contains {shown}" if shown else ""))
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > MAX_NAME_BYTES:  # checked here, not by the file system after the whole simulation
            raise ValueError(f"must be at most {MAX_NAME_BYTES} bytes (it names results/<name>/ and "
                             f"results/<name>-sweep/; file systems allow 255 bytes per folder name, less the "
                             f"room of cbsim's temporary folders), got {size} bytes: {name[:40]!r}...")
        return name

    @model_validator(mode="before")
    @classmethod
    def _defaults_are_entries(cls, data: Any) -> Any:
        # The default policy list is data, so it is validated (against the registry) like any entry.
        if isinstance(data, dict) and "policies" not in data:
            data = {**data, "policies": _default_policies()}
        return _inherit_pool_sections(data)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        from sim.hardware.gpus import get_gpu
        from sim.hardware.models import get_model

        try:
            model = get_model(self.model)
        except CbsimError as exc:
            raise KeyedError("model", str(exc)) from None
        try:
            get_gpu(self.hardware.gpu)
        except CbsimError as exc:
            raise KeyedError("hardware.gpu", str(exc)) from None
        try:
            model.check_tp(self.hardware.tensor_parallel)
        except CbsimError as exc:
            raise KeyedError("hardware.tensor_parallel", str(exc)) from None
        if self.hardware.expert_parallel:
            try:
                model.check_ep(self.hardware.tensor_parallel * self.hardware.data_parallel)
            except CbsimError as exc:
                raise KeyedError("hardware.expert_parallel", str(exc)) from None
        seen: dict[str, int] = {}
        for i, entry in enumerate(self.policies):
            if entry.label in seen:
                raise KeyedError(f"policies.{i}.label", f"{entry.label!r} is already the label of "
                                 f"policies.{seen[entry.label]}; give each entry a distinct label")
            seen[entry.label] = i
        self._fill_max_model_len(model)
        if self.disaggregation is not None:
            self._check_disaggregation(model, seen)
        prefix = self.workload.prefix
        if prefix is not None and prefix.prefix_len >= self.engine.max_model_len:
            raise KeyedError("workload.prefix.prefix_len", f"must be < engine.max_model_len "
                                                           f"({self.engine.max_model_len})")
        return self

    def _fill_max_model_len(self, model) -> None:
        """``engine.max_model_len`` left unset takes the model's context length, as vLLM's does
        (``_get_and_verify_max_len``: sim.hardware.hf_config.context_length). It is filled in without
        counting as set, so a scenario re-validated with another model takes that model's length."""
        engines = [("engine", self.engine)]
        if self.disaggregation is not None:
            engines += [(f"disaggregation.{pool}.engine", getattr(self.disaggregation, pool).engine)
                        for pool in ("prefill", "decode")]
        for where, engine in engines:
            if engine is None or engine.max_model_len is not None:
                continue
            if not model.context_length:
                raise KeyedError(f"{where}.max_model_len",
                                 f"is unset and the model {model.name!r} states no context length; set "
                                 f"{where}.max_model_len (or the inline model's context_length)")
            object.__setattr__(engine, "max_model_len", model.context_length)

    def _check_disaggregation(self, model, labels: dict[str, int]) -> None:
        from sim.hardware.gpus import get_gpu

        dis = self.disaggregation
        if dis.name in labels:
            raise KeyedError("disaggregation.label", f"{dis.name!r} is already the label of "
                             f"policies.{labels[dis.name]}; give the disaggregated run another label")
        for pool in ("prefill", "decode"):
            hw = getattr(dis, pool).hardware
            if hw is None:
                continue
            try:
                get_gpu(hw.gpu)
            except CbsimError as exc:
                raise KeyedError(f"disaggregation.{pool}.hardware.gpu", str(exc)) from None
            try:
                model.check_tp(hw.tensor_parallel)
            except CbsimError as exc:
                raise KeyedError(f"disaggregation.{pool}.hardware.tensor_parallel", str(exc)) from None

    # --- derived ----------------------------------------------------------------------------
    @property
    def total_gpus(self) -> int:
        return self.hardware.count * self.replicas.count

    @property
    def source(self) -> str | None:
        """The YAML file this scenario was read from, if any."""
        return self._source

    def resolve_path(self, path: str | Path) -> Path:
        """A file the scenario names: as given (absolute or from the current directory), else
        relative to the scenario file's folder."""
        p = Path(path)
        if p.is_absolute() or p.exists() or self._source is None:
            return p
        beside = Path(self._source).parent / p
        return beside if beside.exists() else p

    # --- output -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every key with its resolved value. With written-out ``workload.requests`` the
        generator keys (arrival, lengths) are left out: they are unused, and reloading the
        dict gives them their defaults again."""
        data = self.model_dump(mode="json")
        if data.get("disaggregation") is None:  # absent is the same scenario: saved files stay as they were
            data.pop("disaggregation", None)
        if self.workload.requests is not None:
            for key in ("arrival", "prompt_tokens", "output_tokens", "trace", "prefix"):
                data["workload"].pop(key)
        if self.workload.sessions is not None:  # unused beside sessions (and refused when given)
            for key in ("num_requests", "prompt_tokens", "output_tokens", "max_tokens", "trace", "prefix"):
                data["workload"].pop(key, None)
        else:
            data["workload"].pop("sessions", None)  # absent is the same scenario: saved files stay as they were
        arrival = data["workload"].get("arrival")
        if arrival is not None and arrival.get("process") != "closed":
            for key in ("concurrency", "think_time_s", "ramp_s", "start"):  # closed loop only, null here
                arrival.pop(key, None)
        elif arrival is not None and arrival.get("start") is None:
            arrival.pop("start", None)  # absent is the same scenario: saved files stay as they were
        # files the scenario names, as absolute paths: a saved scenario.yaml re-runs from anywhere
        trace = data["workload"].get("trace")
        if trace and trace.get("path"):
            trace["path"] = self._absolute(trace["path"])
        if data["latency"].get("path"):
            data["latency"]["path"] = self._absolute(data["latency"]["path"])
        if isinstance(data["model"], dict) and data["model"].get("hf_config"):
            data["model"]["hf_config"] = self._absolute(data["model"]["hf_config"])
        return data

    def _absolute(self, path: str) -> str:
        resolved = self.resolve_path(path)
        return str(resolved.resolve()) if resolved.exists() else path

    def to_yaml(self) -> str:
        """The resolved scenario (every default filled in) as YAML that loads back to itself."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=110)


# ------------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------------
def load_scenario(source: Any, overrides=()) -> Scenario:
    """A validated :class:`Scenario` from a YAML path, a mapping or a Scenario, with ``--set``
    overrides applied. Any problem raises one :class:`ScenarioError`."""
    overrides = list(overrides or ())
    where = None
    if isinstance(source, Scenario):
        if not overrides:
            return source
        data = source.model_dump(mode="python", exclude_unset=True)
        data.setdefault("policies", [e.model_dump(mode="python", exclude_unset=True) for e in source.policies])
        origin = source.source
    elif isinstance(source, dict):
        data = copy.deepcopy(source)
        origin = None
    elif isinstance(source, str | Path):
        where = str(source)
        data = read_yaml(source)
        origin = where
    else:
        raise ScenarioError(f"a scenario is a YAML file, a mapping or a Scenario, not {type(source).__name__}")
    defaults = {"policies": _default_policies()}
    data = apply_overrides(data, overrides, defaults)
    _hf_config_beside(data, origin)
    try:
        scn = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc, Scenario, where, overrides)) from None
    scn._source = origin
    return scn


def _hf_config_beside(data: Any, origin: str | None) -> None:
    """A relative ``model.hf_config`` that is not found from the current directory is read from
    the scenario file's folder (as trace and table paths are), so examples run from anywhere."""
    model = data.get("model") if isinstance(data, dict) else None
    path = model.get("hf_config") if isinstance(model, dict) else None
    if not isinstance(path, str) or origin is None or Path(path).is_absolute() or Path(path).exists():
        return
    beside = Path(origin).parent / path
    if beside.exists():
        model["hf_config"] = str(beside)


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        hint = ""
        if p.parent.is_dir():
            hint = nearest(p.name, [q.name for q in p.parent.iterdir() if q.suffix in (".yaml", ".yml")])
        raise ScenarioError(f"scenario file {str(path)!r} does not exist{hint}")
    if p.is_dir():
        raise ScenarioError(f"{path} is a folder; give a scenario YAML file")
    try:
        text = p.read_text(encoding="utf-8")
        data = yaml.load(text, Loader=StrictLoader)
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not a text (UTF-8) file") from None
    except OSError as exc:  # unreadable: permissions, a broken link, an I/O error
        raise ScenarioError(f"cannot read scenario file {path}: {exc.strerror or exc}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: nested too deeply to read (thousands of levels of [ or {{)") from None
    except ValueError as exc:  # a value YAML parses but Python cannot hold: a 5000-digit integer
        raise ScenarioError(f"{path}: unreadable value: {str(exc).split(';')[0]}") from None
    except YamlTooLarge as exc:
        mark = exc.problem_mark
        raise ScenarioError(f"{path}:{mark.line + 1}:{mark.column + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = (getattr(exc, "problem", None) or str(exc)).splitlines()[0]  # one line: no "in <unicode string>"
        raise ScenarioError(f"{path}{at}: YAML syntax error: {problem}") from None
    if data is None:
        raise ScenarioError(f"{path} is empty; a scenario needs at least a workload and policies "
                            f"(see scenarios/quickstart.yaml)")
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario is a mapping of keys (name:, model:, workload:, ...), "
                            f"got a {type(data).__name__}")
    return data
