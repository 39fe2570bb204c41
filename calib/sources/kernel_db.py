"""A cbsim latency table composed from NVIDIA AIConfigurator's kernel database
(``cbsim calibrate --from-kernel-db``).

AIConfigurator (ai-dynamo/aiconfigurator, Apache-2.0; on PyPI as ``aiconfigurator-core``) ships
per-kernel latencies measured on real GPUs *inside* the serving engines (vLLM, SGLang,
TensorRT-LLM): GEMMs by (m, n, k, dtype), context attention by (batch, input length, heads, KV
heads, head dim, KV dtype), generation attention by (batch, KV length, ...), vLLM's custom
all-reduce and NCCL by message size and GPU count, fused MoE by tokens, experts and top-k. Its
compiled engine (``aiconfigurator_core.sdk.engine.EngineHandle``) turns a model's ``config.json``
into the engine's own operator list and prices each operator from those tables (interpolating
between measured points and flooring at the speed of light). Why we go through that engine rather
than reading the parquet files ourselves: it knows which kernel each engine version runs for
each shape and how AIConfigurator's authors interpolate their own data; re-deriving that would
only add our own errors to theirs.

The composition (``L`` decoder layers; every operator value is already summed over the layers
by AIConfigurator):

- ``linear(T)`` = the token-major operators at T tokens: embedding, the two RMSNorm + residual
  adds, the QKV, O, gate/up and down GEMMs at their tensor-parallel shard shapes (MoE layers:
  router GEMM and fused experts), SiLU-and-multiply, and at ``--tp`` > 1 the two all-reduces per
  layer of ``T × hidden`` activations (vLLM's custom all-reduce, CUDA-graph lane);
- ``per_seq(S)`` = the LM head GEMM at ``m = S`` sequences (vLLM computes logits for the last
  position of every scheduled request, partial prefill chunks included);
- ``prefill_attn(n, c)`` = AIConfigurator's context attention of one chunk of ``n`` new tokens
  over ``c`` cached ones (plus the rotary and KV-write memory ops it fuses into it);
- ``decode_attn(b, c̄)`` = its generation attention of ``b`` sequences each reading ``c̄ + 1`` keys,
  never below streaming that KV cache from DRAM (:meth:`KernelDb.kv_stream_seconds`: the
  collector replays each kernel on one warm KV cache, so batches whose KV fits in L2 were
  measured faster than a served step, where the weights flush L2 between layers, can run), at
  the rate the database's own decode kernel streams a KV cache no L2 holds
  (:meth:`KernelDb.kv_stream_rate`);
- ``decode_attn_mixed(b, c̄)`` (only where the engine's attention kernel is FlashAttention-2, e.g.
  vLLM on the RTX PRO 6000): decodes beside a prefill chunk lose FA2's GQA packing and cost one
  64-row query tile per query head (:meth:`KernelDb.decode_attn_mixed_ops`).

AIConfigurator itself prices a mixed step as the shared non-attention work of all tokens plus the
context attention plus the *pure* generation attention of the decodes (``Engine::mixed_step_breakdown``,
aic-core engine/runtime.rs; its vLLM backend's ``_mix_step_efficiency`` is 1.0), so it has no
mixed-step term to take over; the FA2 term above comes from the kernel's source and the
database's own prefill throughput instead.

What the database does not measure, and how the table models it, is written into
``metadata.json`` (``provenance.modelled``): attention over prior context (AIConfigurator scales
the measured full-length prefill by ``(s² − p²) / s²``, operators/attention.rs), the memory-bound
elementwise operators (its analytic ``bytes / (0.8 × HBM bandwidth) + 3 µs``), the two terms
above, decode skew (none), and the engine's CPU time per step (not a kernel: ``overhead`` and
``step_gap`` are 0 in these tables; ``engine_cpu`` is cbsim's default for the engine version).

aiconfigurator is an optional extra (``pip install 'cbsim[gpu-data]'``), imported only when a
table is composed; the module never imports torch and never reaches the network (the model's
``config.json`` is handed to AIConfigurator as a local folder).
"""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calib.sources.kernel_db_comm import AllReduceRows, check_kind, is_allreduce_op
from sim.errors import CbsimError, nearest

PACKAGE = "aiconfigurator-core"
PINNED_VERSION = "0.12.0"
INSTALL_HINT = "pip install 'cbsim[gpu-data]'"

# cbsim GPU id -> AIConfigurator system name (PKG/systems/<system>.yaml). AIConfigurator's own
# names are accepted too. Systems that ship a yaml but no kernel tables (a100_pcie, h100_pcie,
# a30, l4) are left out on purpose.
GPU_SYSTEMS = {
    "h100-sxm": "h100_sxm",
    "h200": "h200_sxm",
    "a100-80gb": "a100_sxm",
    "l40s": "l40s",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
    "rtx-pro-6000": "rtx_pro_6000_server",
}
ENGINES = ("vllm", "sglang", "trtllm")


def check_engine(engine: str) -> str:
    """``engine`` when the database has it, else the one-line refusal naming ``--engine`` (called before
    anything that would refuse the table for another reason, so a typo is named as one)."""
    if engine not in ENGINES:
        raise CbsimError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}{nearest(engine, ENGINES)}")
    return engine
DTYPES = ("bf16", "fp16", "fp8")
MS = 1e-3  # AIConfigurator's latencies are in milliseconds

# FlashAttention-2's paged (split-KV) forward kernel, which vLLM's FLASH_ATTN backend runs for every
# batch (a block table forces it): query tiles of 64 rows for every head dimension
# (Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h,
# run_mha_fwd_splitkv_dispatch: ``kBlockM = 64``).
FA2_SPLITKV_BLOCK_M = 64
FA2_KERNEL = "vllm_flash_attn_fa2"
# the batched context-attention rows whose difference from batch 1 gives one launch's fixed cost
# (KernelDb.prefill_launch_seconds): short chunks, where the fixed cost dominates
LAUNCH_BATCH, LAUNCH_TOKENS = 16, 64
# the causal prefill whose measured time gives the prefill kernel's throughput (long enough to fill
# every SM many times over; the longest length AIConfigurator measures for every GPU)
THROUGHPUT_PREFILL_TOKENS = 16384
# the decode batch whose measured time gives the decode kernel's DRAM streaming rate
# (KernelDb.kv_stream_rate): a row AIConfigurator measures on every GPU (batch 128, step 4095), whose
# KV cache is 2.1 GB a layer at 8 KV heads of 128 (Llama-3.1-8B at TP 1) and 268 MB at one KV head
# (TP 8): beyond the H100/H200's 50 MB L2 and twice the largest (128 MB), so it was read from DRAM
STREAM_REF_BATCH, STREAM_REF_CONTEXT = 128, 4095

# Grid points. Dense where a kernel's time bends (small m, where GEMMs are weight-read bound and
# flat; powers of two and halfway points above), since cbsim interpolates linearly between them.
TOKEN_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536,
              2048, 2560, 3072, 4096, 5120, 6144, 8192, 10240, 12288, 16384, 24576, 32768, 65536, 131072, 262144)
# Static batching and Orca compute steps no token budget bounds (a padded batch of whole prompts: 32
# prompts padded to 8192 tokens is 262,144 rows through the GEMMs), so the linear grid always reaches
# that far, whatever the engine limits; GEMM time there is AIConfigurator's own extrapolation.
LINEAR_TOKENS_FLOOR = 262144
SEQ_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
CHUNK_GRID = (1, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384,
              24576, 32768)
CONTEXT_GRID = (0, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
                65536, 98304, 131072)
BATCH_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048)
MEAN_CONTEXT_GRID = (1, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
                     49152, 65536, 98304, 131072)


def require_aiconfigurator():
    """The ``aiconfigurator_core`` module, or one clear error saying how to install it."""
    try:
        import aiconfigurator_core
        from aiconfigurator_core.sdk.engine import EngineHandle  # noqa: F401
    except ImportError:
        raise CbsimError(f"--from-kernel-db needs NVIDIA AIConfigurator's kernel database ({PACKAGE}=="
                         f"{PINNED_VERSION}): {INSTALL_HINT}") from None
    return aiconfigurator_core


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:  # an editable / vendored install
        return "unknown"


def aic_system(gpu: str) -> str:
    """AIConfigurator's system name for a cbsim GPU id (or its own name)."""
    key = str(gpu).lower()
    if key in GPU_SYSTEMS:
        return GPU_SYSTEMS[key]
    if key in GPU_SYSTEMS.values():
        return key
    choices = list(GPU_SYSTEMS) + sorted(set(GPU_SYSTEMS.values()) - set(GPU_SYSTEMS))
    raise CbsimError(f"--gpu {gpu!r} has no kernel measurements in {PACKAGE}{nearest(key, choices)}; GPUs it "
                     f"covers: {', '.join(GPU_SYSTEMS)} (or AIConfigurator's names: "
                     f"{', '.join(sorted(set(GPU_SYSTEMS.values())))})")


# ------------------------------------------------------------------------------------------------
# the model: a cbsim ModelSpec for the table, a local config.json folder for AIConfigurator
# ------------------------------------------------------------------------------------------------
@dataclass
class ModelSource:
    spec: Any  # sim.hardware.models.ModelSpec
    config: dict  # the HF config.json handed to AIConfigurator
    origin: str  # where the config came from, in words



def systems_root() -> Path:
    """aiconfigurator-core's ``systems`` folder: each GPU's ``<system>.yaml`` and its data."""
    import importlib.resources as res

    return Path(str(res.files("aiconfigurator_core") / "systems"))


def system_yaml(system: str) -> dict[str, Any]:
    """The database's ``<system>.yaml`` (the GPU's spec, ``data_dir``, NCCL version, ...)."""
    import yaml

    return yaml.safe_load((systems_root() / f"{system}.yaml").read_text()) or {}


def system_data_dir(system: str, spec: dict[str, Any] | None = None) -> Path:
    """The folder of the system's measurements (``data_dir`` of its yaml; ``data/<system>`` by default)."""
    spec = system_yaml(system) if spec is None else spec
    return systems_root() / spec.get("data_dir", f"data/{system}")


def resolve_model(model: str) -> ModelSource:
    """MODEL as a cbsim model id, ``ORG/NAME`` or the path of a config.json (or its folder)."""
    from sim.hardware.models import get_model

    path = Path(model)
    if model.endswith(".json") or path.is_dir():
        cfg_path = path / "config.json" if path.is_dir() else path
        if not cfg_path.is_file():
            raise CbsimError(f"--model {model!r}: no such config.json; give a cbsim model id, ORG/NAME or the path "
                             f"of a Hugging Face config.json")
        try:
            config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CbsimError(f"--model {model!r}: not a JSON config.json ({exc})") from None
        spec = get_model({"hf_config": str(cfg_path)})
        return ModelSource(spec, config, f"config.json at {cfg_path}")
    spec = get_model(model)
    if "/" in model:  # ORG/NAME: the same local config.json cbsim's spec was read from
        from sim.hardware.hf_config import read_config_file
        from sim.hardware.model_sources import find_config

        found = find_config(model)
        # read as cbsim's spec was: a ModelOpt checkpoint's hf_quant_config.json side file becomes its
        # quantization_config, which fp8_activation_scales reads (ModelOpt's input scales are static)
        return ModelSource(spec, read_config_file(found.path), f"{found.origin}: {found.path}")
    return ModelSource(spec, synthesize_config(spec), f"config.json written from cbsim's model spec {spec.name!r}")


DRAFT_HEADS = ("eagle", "eagle3")


def draft_source(target: ModelSource, method: str, vocab_size: int | None = None) -> ModelSource:
    """The EAGLE / EAGLE-3 head of ``target`` as a model AIConfigurator can compile: a one-layer
    decoder of the target's width with the head's LM head (its config.json written from the
    spec). The head's input projection is no layer of such a config (the drafter prices it on the
    roofline)."""
    from sim.speculative.draft_cost import draft_spec

    if method not in DRAFT_HEADS:
        raise CbsimError(f"--draft {method!r} is not one of {', '.join(DRAFT_HEADS)}{nearest(method, DRAFT_HEADS)}; "
                         f"a draft model's table is that model's own (--model DRAFT_MODEL), MTP's the target's layer")
    if getattr(target.spec, "num_experts", 0) or getattr(target.spec, "is_mla", False):
        raise CbsimError(f"--draft {method}: heads of MoE/MLA models ({target.spec.name!r}) are not composed; "
                         f"the drafter stays on the roofline")
    head = draft_spec(method, target.spec, draft_vocab_size=vocab_size)
    return ModelSource(head, synthesize_config(head), f"the {method} head of {target.origin}")


def synthesize_config(spec) -> dict:
    """A Hugging Face config.json for a cbsim ModelSpec: Llama (dense) or Mixtral (MoE) layout,
    which is all AIConfigurator reads of it (shapes and dtype)."""
    experts = getattr(spec, "num_experts", 0) or 0
    cfg = {
        "architectures": ["MixtralForCausalLM" if experts else "LlamaForCausalLM"],
        "model_type": "mixtral" if experts else "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": (getattr(spec, "moe_intermediate_size", 0) or spec.intermediate_size) if experts
        else spec.intermediate_size,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "num_hidden_layers": spec.num_layers,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": bool(spec.tied_embeddings),
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    if experts:
        cfg["num_local_experts"] = experts
        cfg["num_experts_per_tok"] = spec.num_experts_per_tok
    return cfg


# ------------------------------------------------------------------------------------------------
# the database, through AIConfigurator's compiled engine
# ------------------------------------------------------------------------------------------------
@dataclass
class Op:
    seconds: float
    source: str  # AIConfigurator's label: silicon (measured rows), empirical (its formula), mixed


class KernelDb:
    """One model on one GPU at one TP degree in one engine version: per-operator times."""

    def __init__(self, model: ModelSource, gpu: str, tp: int = 1, dtype: str = "bf16", engine: str = "vllm",
                 engine_version: str | None = None, fp8_scaling: str | None = None,
                 allreduce: str = "custom") -> None:
        require_aiconfigurator()
        import logging

        from aiconfigurator_core.sdk.engine import EngineHandle
        from aiconfigurator_core.sdk.perf_database import resolve_query_version
        from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

        check_engine(engine)
        if dtype not in DTYPES:
            raise CbsimError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}{nearest(dtype, DTYPES)}")
        model.spec.check_tp(tp)
        self.model, self.tp, self.dtype, self.engine = model, tp, dtype, engine
        self.spec = priced_spec(model.spec, dtype)
        self.system = aic_system(gpu)
        try:
            self.engine_version = resolve_query_version(self.system, engine, engine_version or "current")
        except ValueError as exc:
            raise CbsimError(f"--engine-version: {exc}") from None
        self._dir = tempfile.TemporaryDirectory(prefix="cbsim-kernel-db-")
        (Path(self._dir.name) / "config.json").write_text(json.dumps(model.config), encoding="utf-8")
        self.parsed = get_model_config_from_model_path(self._dir.name)
        self._check_shape()
        # AIConfigurator logs a warning per low-fidelity fallback table it *could* use (MLA, DSA)
        # even for models that never touch them; keep the console to our own lines.
        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
        self.fp8_mode = fp8_quant_mode(model.config, fp8_scaling) if dtype == "fp8" else None
        # per-tensor FP8 GEMMs: whether the activations' scale is the checkpoint's (static) or computed
        # every step (dynamic); the database's fp8 rows are dynamic (fp8_activation_scales)
        self.fp8_activations = (fp8_activation_scales(engine, model.config) if self.fp8_mode == "fp8" else None)
        if self.fp8_activations == "static" and not self._has_compute_scale_rows():
            self.fp8_activations = "dynamic (the database has no compute_scale rows to take out)"
        kwargs = self.compile_kwargs()
        try:
            self.handle = EngineHandle.compile(self._dir.name, self.system, engine,
                                               backend_version=self.engine_version, **kwargs)
            # the compiled operator lists position by position: the indices evaluate_*_ops take;
            # listing them evaluates every operator once, where a table the GPU's data lacks shows
            self.context_ops = spec_op_names(self.handle.evaluate_context_ops)
            gen_ops = spec_op_names(self.handle.evaluate_generation_ops)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CbsimError(f"{PACKAGE} cannot model {model.spec.name!r} on {self.system} in {engine} "
                             f"{self.engine_version} at tp {tp}: {str(exc).split(' at /')[0]}; the database "
                             f"has no such rows for this GPU and engine: choose another --gpu or --engine") from None
        self._attn = [i for i, n in enumerate(self.context_ops) if self.is_attention_op(n)]
        self._linear = [i for i, n in enumerate(self.context_ops) if i not in self._attn and "logits" not in n]
        # the LM head from the generation list: AIConfigurator's MoE models leave it out of their
        # context list (a per-sequence GEMM, the same kernel either way)
        self._gen_attn = [i for i, n in enumerate(gen_ops) if self.is_attention_op(n)]
        self._per_seq = [i for i, n in enumerate(gen_ops) if "logits" in n]
        if not self._attn or not self._per_seq or not self._gen_attn:
            raise CbsimError(f"{PACKAGE}'s operator list for {model.spec.name!r} has no attention or LM head "
                             f"({', '.join(self.context_ops)}); this architecture is not a decoder cbsim can price")
        self.gpu_spec = self._system_yaml()["gpu"]
        self.attention_kernel = self._generation_kernel()
        self._prefill_ref_s: float | None = None
        self._stream_rate: float | None = None  # kv_stream_rate, measured once
        # the all-reduce kernel the engine ran (calib/sources/kernel_db_comm.py): AIConfigurator's custom
        # rows, or NCCL's rows in their place
        self.allreduce = check_kind(allreduce)
        self._nccl = None
        if self.allreduce == "nccl" and tp > 1:
            spec = self._system_yaml()
            self._nccl = AllReduceRows(system_data_dir(self.system, spec), engine,
                                       self.engine_version, (spec.get("misc") or {}).get("nccl_version"))

    def compile_kwargs(self) -> dict[str, Any]:
        """AIConfigurator's compile arguments: the TP degree and quantization modes (an MoE's experts
        sharded over the TP ranks, as vLLM runs them without expert parallelism).
        :mod:`calib.sources.kernel_db_moe` overrides this for expert- and data-parallel layouts."""
        quant = getattr(self, "fp8_mode", None) or ("fp8" if self.dtype == "fp8" else "bfloat16")
        gemm = "fp8_static" if quant == "fp8" and getattr(self, "fp8_activations", None) == "static" else quant
        kv = "fp8" if getattr(self.spec, "kv_cache_dtype", None) == "fp8" else "bfloat16"
        kwargs = {"tp_size": self.tp, "gemm_quant_mode": gemm, "kvcache_quant_mode": kv}
        if kv == "bfloat16":
            # a bf16 KV cache runs bf16 attention (FP8 context attention needs an FP8 cache in TensorRT-LLM,
            # use_fp8_context_fmha; vLLM quantizes the query only for an FP8 cache). Unset, AIConfigurator
            # infers FP8 attention from an FP8 checkpoint's quantization_config whatever the cache
            # (sdk/models/helpers.py), a pairing no engine runs and its databases mostly lack. With an FP8
            # cache AIConfigurator's own choice stands (vLLM's rows are bf16 attention over FP8 KV)
            kwargs["fmha_quant_mode"] = "bfloat16"
        if getattr(self.model.spec, "num_experts", 0):
            kwargs.update(moe_quant_mode=quant, moe_tp_size=self.tp, moe_ep_size=1)
        return kwargs

    def _has_compute_scale_rows(self) -> bool:
        """Whether the database measured the dynamic scale's own cost (``quantize/<engine>/<version>/
        computescale_perf.parquet``), which AIConfigurator's ``fp8_static`` mode takes out of its fp8 rows."""
        data = system_data_dir(self.system)
        return (data / "quantize" / self.engine / self.engine_version / "computescale_perf.parquet").is_file()

    @staticmethod
    def is_attention_op(name: str) -> bool:
        """Whether an AIConfigurator operator is attention (priced per chunk and context)."""
        return _is_attention(name)

    def _check_shape(self) -> None:
        """The config AIConfigurator parsed must be the model cbsim prices (same shapes)."""
        s, p = self.model.spec, self.parsed
        pairs = {"num_layers": (s.num_layers, p["layers"]), "hidden_size": (s.hidden_size, p["hidden_size"]),
                 "num_heads": (s.num_heads, p["n"]), "num_kv_heads": (s.num_kv_heads, p["n_kv"]),
                 "head_dim": (s.head_dim, p["d"]), "vocab_size": (s.vocab_size, p["vocab"])}
        for key, (mine, theirs) in pairs.items():
            if mine != theirs:
                raise CbsimError(f"model {s.name!r}: {key} is {mine} in cbsim's spec but {theirs} in the config.json "
                                 f"given to {PACKAGE} ({self.model.origin}); they must describe the same model")

    # --- per-operator times (seconds), summed over the layers -------------------------------------
    def linear_ops(self, tokens: int) -> dict[str, Op]:
        ops = self._ops(self.handle.evaluate_context_ops(self._linear, batch_size=1, s=int(tokens)))
        if self._nccl is not None:  # each all-reduce moves tokens x hidden values
            ratio = self._nccl.ratio(self.tp, int(tokens) * self.spec.hidden_size)
            ops = {k: Op(v.seconds * ratio, "silicon (nccl)") if is_allreduce_op(k) else v for k, v in ops.items()}
        return ops

    def per_seq_ops(self, sequences: int) -> dict[str, Op]:
        return self._ops(self.handle.evaluate_generation_ops(self._per_seq, batch_size=int(sequences), s=1))

    def prefill_attn_ops(self, chunk_tokens: int, context: int) -> dict[str, Op]:
        return self._ops(self.handle.evaluate_context_ops(self._attn, batch_size=1, s=int(chunk_tokens),
                                                          prefix=int(context)))

    def prefill_launch_seconds(self, batch: int = LAUNCH_BATCH, tokens: int = LAUNCH_TOKENS) -> float:
        """The fixed cost of one context-attention launch (summed over the layers), from the
        database's own batched rows: ``batch`` chunks of ``tokens`` each in one launch cost
        ``T(batch) = F + batch × w`` and one chunk ``T(1) = F + w``, so ``F = (batch T(1) - T(batch)) /
        (batch - 1)``. Why it matters: vLLM and SGLang run every prefill chunk of a step in one varlen
        attention launch (vLLM's FlashAttentionImpl.forward calls flash_attn_varlen_func once per
        layer with cu_seqlens over all scheduled requests), so a step of 8 chunks pays F once; on the
        H200 16 chunks of 64 tokens cost 1.4x one chunk in the database, not 16x."""
        def launch(b: int) -> float:
            rows = self.handle.evaluate_context_ops(self._attn, batch_size=b, s=int(tokens))
            return sum(float(ms) for _name, ms, *_ in rows) * MS

        one, many = launch(1), launch(int(batch))
        return max(0.0, (batch * one - many) / (batch - 1))

    def decode_attn_ops(self, batch: int, mean_context: float, *, floor: bool = True) -> dict[str, Op]:
        """The generation attention of ``batch`` sequences at ``mean_context``, raised to the time of
        streaming their KV cache from DRAM when the measurement is faster (``floor``; see
        :meth:`kv_stream_seconds`)."""
        keys = max(1, int(round(mean_context)) + 1)  # each decode reads its context plus its own token
        ops = self._ops(self.handle.evaluate_generation_ops(self._gen_attn, batch_size=int(batch), s=keys))
        if floor:
            dram = self.kv_stream_seconds(batch, keys)
            measured = sum(op.seconds for op in ops.values())
            if dram > measured:
                ops["kv_dram_floor"] = Op(dram - measured, "modelled")
        return ops

    def kv_stream_seconds(self, batch: int, keys: int) -> float:
        """Every layer's decode attention reads the batch's whole KV cache from DRAM.

        Why a floor: AIConfigurator times each kernel by replaying it in a CUDA graph on the same
        KV cache (collector/helper.py ``benchmark_with_power``), so a batch whose KV fits in the
        L2 cache (128 MB on the RTX PRO 6000: 32 decodes at 1k context of Llama-3-8B are 134 MB a
        layer) is read from L2 at more than the DRAM bandwidth. In a served step the 16 GB of
        weights pass through L2 between two uses of a layer's KV, which is therefore cold. The
        floor is AIConfigurator's memory-op formula (bytes / rate + mem_empirical_constant_latency,
        from the system yaml) applied to those bytes, once per layer, at the rate
        :meth:`kv_stream_rate` gives: never slower than the database's own decode kernel streams a
        KV cache no L2 can hold."""
        g = self.gpu_spec
        per_layer = batch * keys * self.spec.kv_layer_bytes_per_token(self.tp)
        return self.spec.num_layers * (per_layer / self.kv_stream_rate()
                                       + float(g.get("mem_empirical_constant_latency", 0.0)))

    def kv_stream_rate(self) -> float:
        """Bytes per second at which the floor streams a decode batch's KV cache: the rate the
        database's own generation-attention row of this model's heads reaches at
        :data:`STREAM_REF_BATCH` sequences of :data:`STREAM_REF_CONTEXT` cached tokens (a KV cache
        no L2 holds, so that row was read from DRAM), never below AIConfigurator's ``mem_bw x
        mem_bw_empirical_scaling_factor`` (0.8, its rate for small elementwise kernels); a row
        faster than ``mem_bw`` did not read those bytes from DRAM and leaves AIConfigurator's rate.

        Why not 0.8 everywhere: the database's decode kernels stream a large KV cache faster than
        that. Its rows of 8 KV heads of 128 (Llama-3.1-8B, TP 1) at 128 x 4095, 64 x 8191 and
        32 x 16383 run at 4.35-4.38 TB/s on the H200 (91 % of 4.8), 3.11-3.12 on the H100 (93 % of
        3.35), 1.51 on the RTX PRO 6000 (84 % of 1.79), so a floor at 80 % priced those measured rows
        slower than measured (H200: 128 decodes at 5k context 21.9 ms against the database's 19.3
        ms), the most of a decode-bound step's error on the corpus' H200 vLLM Llama-3.1-8B rows at
        1,000-2,000 output tokens. Where the reference row is slower than 0.8 (one KV head a rank:
        Llama-3.1-8B at TP 8, 73 % on the H200) the floor stays AIConfigurator's."""
        if self._stream_rate is None:
            g = self.gpu_spec
            peak = float(g["mem_bw"])
            lowest = peak * float(g.get("mem_bw_empirical_scaling_factor", 1.0))
            keys = STREAM_REF_CONTEXT + 1
            measured = sum(op.seconds for op in self.decode_attn_ops(STREAM_REF_BATCH, STREAM_REF_CONTEXT,
                                                                     floor=False).values())
            layers = self.spec.num_layers
            fixed = layers * float(g.get("mem_empirical_constant_latency", 0.0))
            moved = layers * STREAM_REF_BATCH * keys * self.spec.kv_layer_bytes_per_token(self.tp)
            rate = moved / (measured - fixed) if measured > fixed else float("inf")
            # faster than the DRAM can deliver: the row did not stream those bytes from DRAM (gpt-oss's
            # sliding-window layers read 128 keys, not 4,096), so it cannot say the rate
            self._stream_rate = lowest if rate > peak else max(lowest, rate)
        return self._stream_rate

    def kv_reread_seconds(self, batch: int, keys: int) -> float:
        """One more pass of the batch's KV cache at the DRAM's full rate (``mem_bw``, no empirical
        factor: thousands of independent tiles stream it, as in a long prefill). What a decode
        costs in FA2's varlen kernel for each query head of its group: the LLMServingSim bundles'
        mixed rows (attention of a 1,024-token chunk plus 16-64 decodes, less the chunk alone)
        come out at 3.7-4.4 x the KV bytes / HBM bandwidth on the RTX PRO 6000 and the RTX 4090,
        with 4 query heads per KV head (../shared/reference/gpu-runs/*/profile/tp1/attention.csv)."""
        per_layer = batch * keys * self.spec.kv_layer_bytes_per_token(self.tp)
        return self.spec.num_layers * per_layer / float(self.gpu_spec["mem_bw"])

    @property
    def prices_mixed_decodes(self) -> bool:
        """Whether decodes beside a prefill chunk cost more than alone in this engine's kernel: in
        FlashAttention-2's varlen API (vLLM's FLASH_ATTN backend on GPUs without FA3) the GQA
        packing that makes a pure decode batch cheap (``seqlenq_ngroups_swapped``, taken only when
        ``max_seqlen_q == 1``; csrc/flash_attn/flash_api.cpp, mha_varlen_fwd) is off as soon as one
        sequence in the launch has more than one query token."""
        return self.engine == "vllm" and self.attention_kernel == FA2_KERNEL and self.spec.num_heads > \
            self.spec.num_kv_heads

    def decode_attn_mixed_ops(self, batch: int, mean_context: float) -> dict[str, Op]:
        """The decodes of a step that also holds a prefill chunk, in FlashAttention-2's varlen
        kernel (:attr:`prices_mixed_decodes`): without GQA packing each decode runs, for every query
        head, one 64-row query tile (one valid row) over its ``c + 1`` keys: ``64 (c + 1)`` query-key
        pairs of tile work per head, where a causal prefill of ``s`` tokens does ``s² / 2``. Priced
        at the prefill kernel's own measured throughput (the database's causal prefill of
        :data:`THROUGHPUT_PREFILL_TOKENS` tokens; heads and head size cancel) and never below the
        same decodes alone (:meth:`decode_attn_ops`, with its DRAM floor)."""
        alone = self.decode_attn_ops(batch, mean_context)
        keys = max(1, int(round(mean_context)) + 1)
        s = THROUGHPUT_PREFILL_TOKENS
        if self._prefill_ref_s is None:
            self._prefill_ref_s = sum(op.seconds for op in self.prefill_attn_ops(s, 0).values())
        tiles = self._prefill_ref_s * batch * FA2_SPLITKV_BLOCK_M * keys / (s * s / 2)
        total = sum(op.seconds for op in alone.values())
        if tiles > total:
            alone["unpacked_gqa_tiles"] = Op(tiles - total, "modelled")
            total = tiles
        # and each query head's tile streams its KV head's keys and values itself: the KV cache is
        # read once per query head of the group, not once (the same DRAM formula as the floor)
        group = self.spec.num_heads // self.spec.num_kv_heads
        reread = group * self.kv_reread_seconds(batch, keys)
        if reread > total:
            alone["kv_reread_per_query_head"] = Op(reread - total, "modelled")
        return alone

    @staticmethod
    def _ops(rows) -> dict[str, Op]:
        """Operator times by short name; operators of one name (gpt-oss's sliding-window and
        full-attention layers are two ``attention`` operators) add up."""
        out: dict[str, Op] = {}
        for name, ms, _energy, source in rows:
            short = name.split("_", 1)[1] if name.startswith(("context_", "generation_")) else name
            if short in out:
                prev = out[short]
                out[short] = Op(prev.seconds + float(ms) * MS, prev.source if prev.source == str(source) else "mixed")
            else:
                out[short] = Op(float(ms) * MS, str(source))
        return out

    # --- AIConfigurator's own whole-step predictions (seconds), to check the composition -----------
    def predict_prefill(self, batch: int, isl: int, prefix: int = 0) -> float:
        return self.handle.predict_prefill_latency(batch, isl, prefix) * MS

    def predict_decode(self, batch: int, isl: int) -> float:
        return self.handle.predict_decode_latency(batch, isl, 2) * MS

    def _system_yaml(self) -> dict[str, Any]:
        return system_yaml(self.system)

    def _generation_kernel(self) -> str | None:
        """The kernel the engine's default attention backend ran for this model's heads in the
        generation-attention rows (the label AIConfigurator's collector records as ``kernel_source``;
        rows collected under an explicit backend override, e.g. FlashInfer or Triton, are not the
        default), or None when the rows say nothing."""
        import pyarrow.parquet as pq

        data = system_data_dir(self.system)
        path = data / "attention" / self.engine / self.engine_version / "generation_attention_perf.parquet"
        if not path.is_file():
            return None
        rows = pq.read_table(path, columns=["kernel_source", "num_heads", "num_key_value_heads"]).to_pylist()
        heads = self.spec.heads_per_rank(self.tp)
        kv_heads = self.spec.kv_heads_per_rank(self.tp)
        labels = sorted({r["kernel_source"] for r in rows if r["num_heads"] == heads
                         and r["num_key_value_heads"] == kv_heads})
        default = [k for k in labels if not any(t in k for t in ("flashinfer", "triton", "trtllm"))]
        return default[0] if len(default) == 1 else None

    # --- provenance ----------------------------------------------------------------------------
    def data_files(self) -> dict[str, Any]:
        """The parquet files the engine version reads, with the device column and collection notes."""
        import pyarrow.parquet as pq
        import yaml

        root = systems_root()
        spec = system_yaml(self.system)
        data = system_data_dir(self.system, spec)
        out: dict[str, Any] = {}
        for family in ("gemm", "attention", "comm", "moe"):
            folder = data / family / self.engine / self.engine_version
            if not folder.is_dir():
                continue
            files = sorted(p.name for p in folder.glob("*.parquet"))
            entry: dict[str, Any] = {"folder": str(folder.relative_to(root.parent)), "files": files}
            if files:
                entry["device"] = str(pq.read_table(folder / files[0], columns=["device"]).column(0)[0])
            meta = folder / "collection_meta.yaml"
            if meta.is_file():
                runtime = (yaml.safe_load(meta.read_text()) or {}).get("runtime") or {}
                entry["runtime"] = {k: v for k, v in runtime.items() if k in ("framework", "version", "image")}
            out[family] = entry
        return {"system": self.system, "system_yaml": f"systems/{self.system}.yaml",
                "hbm_bandwidth": spec["gpu"]["mem_bw"], "bf16_tc_flops": spec["gpu"].get("bfloat16_tc_flops"),
                "tables": out}


def spec_op_names(evaluate) -> list[str]:
    """The names of a compiled operator list in its own order, one per position (``evaluate`` is
    ``EngineHandle.evaluate_context_ops`` or ``evaluate_generation_ops``, which take positions).

    Why not ``run_static_per_op`` or ``decode_step_per_op``: those fold operators of one name into
    one entry (aic-core engine.py: "name-folded"), so their positions are not the list's once a
    name repeats. gpt-oss has two ``context_attention`` operators (its sliding-window and its
    full-attention layers, positions 0 and 4 of 13): read from the folded list, the second one
    was priced inside ``linear`` as the attention of one sequence of T tokens, prefill_attn and
    decode_attn held only the first, and ``per_seq`` took position 10 of the generation list
    (the MoE combine, 0 ms) for the LM head (position 11: 0.32 ms at 8 sequences, vLLM, H200)."""
    names: list[str] = []
    while True:
        try:
            rows = evaluate([len(names)], batch_size=1, s=16)
        except ValueError:  # "index N out of range (N context ops)": the end of the list
            break
        if not rows:
            break
        names.append(str(rows[0][0]))
    return names


FP8_SCALINGS = ("tensor", "block")


def fp8_quant_mode(config: dict, scaling: str | None = None) -> str:
    """AIConfigurator's quant mode for the FP8 kernels the engine runs for this checkpoint:
    ``fp8_block`` (128 x 128 block scales: DeepGEMM / CUTLASS block-scaled GEMMs, the Triton fused
    MoE with block scales) when the config's ``quantization_config`` has ``weight_block_size`` (as
    Qwen3-*-FP8 and DeepSeek ship), else ``fp8`` (per-tensor scales: vLLM's CutlassFP8ScaledMM, also
    what ``--quantization fp8`` makes of a bf16 checkpoint). ``scaling`` ('tensor' or 'block')
    overrides it for a checkpoint whose config does not say. Why it matters: the two kernel families
    differ up to 3x at small batches in the database (H200, vLLM 0.24: Qwen3-235B's MoE layer at 1
    token is 0.19 ms per-tensor, 0.06 ms block-scaled)."""
    if scaling is not None:
        if scaling not in FP8_SCALINGS:
            raise CbsimError(f"fp8 scaling {scaling!r} is not one of {', '.join(FP8_SCALINGS)}")
        return "fp8_block" if scaling == "block" else "fp8"
    q = config.get("quantization_config") or {}
    return "fp8_block" if q.get("weight_block_size") else "fp8"


def fp8_activation_scales(engine: str, config: dict) -> str:
    """``static`` or ``dynamic``: how a per-tensor FP8 linear layer gets its activations' scale.

    Why it matters: AIConfigurator's ``fp8`` GEMM rows time TensorRT-LLM's ``Linear`` loaded with a
    weight scale and no ``input_scale`` (collector/trtllm/collect_gemm.py ``_build_weights``), so
    ``FP8QDQLinearMethod.apply`` (tensorrt_llm/_torch/modules/linear.py) quantizes every input
    dynamically with ``quantize_e4m3_per_tensor``: an amax pass over the activations before the
    GEMM. A checkpoint with calibrated input scales takes ``static_quantize_e4m3_per_tensor``
    instead (``load_weights_vanilla`` sets ``has_static_input_scale``). The database measures the
    difference itself (``quantize/*/computescale_perf.parquet``: dynamic minus static, 7.3 us a
    GEMM at 8 tokens on the H100, TensorRT-LLM 1.3.0rc20), and AIConfigurator's ``fp8_static``
    quant mode prices a GEMM as its fp8 row less that ``compute_scale`` (sdk/perf_database.py
    ``_gemm_key_names``). Qwen3-32B at TP 1 has 4 such GEMMs in each of 64 layers: 2.1 ms of its
    18.4 ms decode step at 8 sequences (TensorRT-LLM, H100).

    The rule: the checkpoint's own ``quantization_config.activation_scheme`` when it says, or its
    ``config_groups``' ``input_activations.dynamic`` (the compressed-tensors layout, which
    Qwen/Qwen3-32B-FP8-Static-PerTensor ships: ``dynamic: false``); then ``static`` for a ModelOpt
    checkpoint (``quant_method: modelopt``, as cbsim reads NVIDIA's
    ``hf_quant_config.json``) in any engine: ModelOpt calibrates an ``input_scale`` for every
    linear layer, and vLLM runs such a checkpoint with ``ModelOptFp8LinearMethod``, "Model Optimizer
    static quantization", ``Fp8LinearOp(act_quant_static=True)``
    (vllm/model_executor/layers/quantization/modelopt.py); otherwise ``static`` for TensorRT-LLM,
    whose per-tensor FP8 checkpoints are ModelOpt's (and the LLM API's own FP8 quantization runs
    the same ModelOpt calibration), and ``dynamic`` for vLLM and SGLang, whose ``--quantization
    fp8`` of a bf16 checkpoint computes the scale per step (vLLM ``Fp8Config`` ``activation_scheme``
    'dynamic'). On the corpus' H200 vLLM rows of nvidia/Llama-3.1-8B-Instruct-FP8 (ModelOpt) the
    static rows take 0.29 ms off a TP 1 decode step at 40 sequences (linear(40) 3.44 -> 3.15 ms)."""
    q = config.get("quantization_config") or {}
    scheme = str(q.get("activation_scheme") or "").lower()
    if scheme in ("static", "dynamic"):
        return scheme
    acts = [g.get("input_activations") for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
    flags = {a.get("dynamic") for a in acts if isinstance(a, dict) and isinstance(a.get("dynamic"), bool)}
    if len(flags) == 1:  # compressed-tensors layout: input_activations.dynamic says it
        return "dynamic" if flags.pop() else "static"
    if str(q.get("quant_method") or "").lower() == "modelopt":
        return "static"
    return "static" if engine == "trtllm" else "dynamic"


def priced_spec(spec, dtype: str):
    """The model spec the table is for: activations in bf16 (fp16 for --dtype fp16), and for
    --dtype fp8 w8a8 FP8 linear layers (``quantization: fp8``), so that cbsim's weight bytes and
    KV capacity match the kernels priced."""
    from dataclasses import fields, replace

    names = {f.name for f in fields(spec)}
    if dtype == "fp8":
        if "quantization" not in names:
            raise CbsimError("--dtype fp8 needs a cbsim whose model specs know `quantization` (sim.hardware.models)")
        return replace(spec, dtype="bf16", quantization="fp8")
    changes = {"dtype": dtype}
    if "quantization" in names:
        changes["quantization"] = None
    return replace(spec, **changes)


def _is_attention(name: str) -> bool:
    short = name.split("_", 1)[1] if "_" in name else name
    return short == "attention" or (short.endswith("attention") and "_ar" not in short)


# ------------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------------
@dataclass
class Grids:
    tokens: tuple[int, ...]
    sequences: tuple[int, ...]
    chunk_tokens: tuple[int, ...]
    context: tuple[int, ...]
    batch: tuple[int, ...]
    mean_context: tuple[int, ...]

    @classmethod
    def covering(cls, max_num_batched_tokens: int = 16384, max_model_len: int = 32768,
                 max_num_seqs: int = 1024) -> Grids:
        """The default grids cut to what a server with these limits can schedule (plus the next point,
        so the last cell interpolates rather than extrapolates)."""
        def upto(grid, limit):
            keep = [v for v in grid if v < limit]
            nxt = [v for v in grid if v >= limit]
            return tuple(keep + nxt[:1]) if nxt else tuple(keep)

        return cls(tokens=upto(TOKEN_GRID, max(max_num_batched_tokens, LINEAR_TOKENS_FLOOR)), sequences=upto(SEQ_GRID, max_num_seqs),
                   chunk_tokens=upto(CHUNK_GRID, min(max_num_batched_tokens, max_model_len)),
                   context=upto(CONTEXT_GRID, max_model_len), batch=upto(BATCH_GRID, max_num_seqs),
                   mean_context=upto(MEAN_CONTEXT_GRID, max_model_len))


@dataclass
class Composition:
    """The composed table plus the per-operator values behind every grid point (for tests and
    reports; the table folder keeps only the sums and a breakdown at reference points)."""

    table: Any  # sim.latency.table_format.LatencyTable
    db: KernelDb
    ops: dict[str, dict[tuple, dict[str, Op]]] = field(default_factory=dict)
    # decode_attn as the database measured it (no DRAM floor), on the table's grid: what
    # agreement() compares with AIConfigurator's own step predictions
    measured_decode: Any = None
    launch_s: float = 0.0  # prefill_attn's fixed cost per launch (KernelDb.prefill_launch_seconds)


def compose(db: KernelDb, grids: Grids | None = None, *, block_size: int = 16) -> Composition:
    """The latency table of ``db``'s model, GPU, TP degree and engine (see the module docstring)."""
    from sim.latency.table_format import FORMAT_VERSION, LatencyTable, make_component

    g = grids or Grids.covering()
    ops: dict[str, dict[tuple, dict[str, Op]]] = {"linear": {}, "per_seq": {}, "prefill_attn": {},
                                                 "decode_attn": {}, "decode_attn_mixed": {}}

    def total(component: str, key: tuple, found: dict[str, Op]) -> float:
        ops[component][key] = found
        return sum(op.seconds for op in found.values())

    linear = [total("linear", (t,), db.linear_ops(t)) for t in g.tokens]
    per_seq = [total("per_seq", (s,), db.per_seq_ops(s)) for s in g.sequences]
    prefill = [[total("prefill_attn", (n, c), never_faster_with_more_context(db, n, c, ops["prefill_attn"], g.context))
                for c in g.context] for n in g.chunk_tokens]
    launch = min(db.prefill_launch_seconds(), min(min(row) for row in prefill))
    decode = [[total("decode_attn", (b, c), db.decode_attn_ops(b, c)) for c in g.mean_context] for b in g.batch]
    measured = [[sum(op.seconds for n, op in ops["decode_attn"][(b, c)].items() if op.source != "modelled")
                 for c in g.mean_context] for b in g.batch]
    mixed = ([[total("decode_attn_mixed", (b, c), db.decode_attn_mixed_ops(b, c)) for c in g.mean_context]
              for b in g.batch] if db.prices_mixed_decodes else None)
    if mixed is None:
        del ops["decode_attn_mixed"]
    cpu = _engine_cpu(db)
    components = {
        "overhead": make_component("overhead", (), 0.0),
        "step_gap": make_component("step_gap", (), 0.0),
        "linear": make_component("linear", ((0,) + g.tokens,), [0.0] + linear),
        "per_seq": make_component("per_seq", (g.sequences,), per_seq),
        "prefill_attn": make_component("prefill_attn", (g.chunk_tokens, g.context), prefill),
        "decode_attn": make_component("decode_attn", (g.batch, g.mean_context), decode),
    }
    if mixed is not None:
        components["decode_attn_mixed"] = make_component("decode_attn_mixed", (g.batch, g.mean_context), mixed)
    if cpu is not None:
        components["engine_cpu"] = make_component("engine_cpu", (g.sequences,), [cpu.seconds(s) for s in g.sequences])
    table = LatencyTable(components, {})
    comp = Composition(table, db, ops, make_component("decode_attn", (g.batch, g.mean_context), measured))
    comp.launch_s = round(launch, 9)
    table.metadata = metadata(comp, g, block_size=block_size, format_version=FORMAT_VERSION)
    return comp


def never_faster_with_more_context(db: KernelDb, n: int, c: int, done: dict, contexts) -> dict[str, Op]:
    """``prefill_attn_ops(n, c)``, raised to the same chunk over less cached context when it is
    cheaper (operator 'prefix_monotone', source 'modelled'). Why: AIConfigurator prices a chunk over
    ``c`` cached tokens as the causal prefill of ``s = n + c`` scaled by ``(s² − c²) / s²``
    (aic-core operators/attention.rs), which scales the launch's fixed cost too: on the H200
    ``(16, 1024)`` came out at 0.46 ms and ``(16, 0)`` at 0.81 ms. The kernel runs the same query
    rows over more keys, and never finishes sooner."""
    found = db.prefill_attn_ops(n, c)
    prev = [cc for cc in contexts if cc < c]
    if prev:
        before = sum(op.seconds for op in done[(n, prev[-1])].values())
        now = sum(op.seconds for op in found.values())
        if before > now:
            found["prefix_monotone"] = Op(before - now, "modelled")
    return found


def _engine_cpu(db: KernelDb):
    """cbsim's default engine CPU time for the engine version (sim.latency.engine_cpu), or None
    where it has none (then the table carries no engine_cpu component and metadata says so)."""
    from sim.latency.engine_cpu import engine_cpu_default

    try:
        return engine_cpu_default(db.engine, db.engine_version)
    except CbsimError:
        return None


def metadata(comp: Composition, g: Grids, *, block_size: int, format_version: int) -> dict[str, Any]:
    db = comp.db
    files = db.data_files()
    device = (files["tables"].get("gemm") or {}).get("device") or db.system
    model = db.spec.to_dict()
    sources = {name: sorted({op.source for pts in comp.ops.values() for found in pts.values()
                             for n, op in found.items() if n == name}) for name in _op_names(comp)}
    ref_t = 1024 if 1024 in g.tokens else g.tokens[len(g.tokens) // 2]
    cpu = _engine_cpu(db)
    breakdown = {
        f"linear({ref_t})": _ms(comp.ops["linear"][(ref_t,)]),
        "per_seq(1)": _ms(comp.ops["per_seq"][(g.sequences[0],)]),
        f"decode_attn(1, {g.mean_context[min(5, len(g.mean_context) - 1)]})":
            _ms(comp.ops["decode_attn"][(g.batch[0], g.mean_context[min(5, len(g.mean_context) - 1)])]),
    }
    meta: dict[str, Any] = {
        "format_version": format_version,
        "source": "kernel_db",
        "device": device,
        "model": model,
        "dtype": db.dtype,  # of the kernels priced (fp8: w8a8 linear layers, bf16 activations)
        "block_size": block_size,
        "tensor_parallel": db.tp,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "grid": comp.table.grid(),
        "aic_agreement": agreement(comp),
        "prefill_attn_launch_s": comp.launch_s,
        "provenance": {
            "package": PACKAGE,
            "package_version": package_version(),
            "engine": db.engine,
            "engine_version": db.engine_version,
            "gpu": db.system,
            "device": device,
            "dtype": db.dtype,
            "model_config": db.model.origin,
            "data": files,
            "measured": "GEMMs (qkv, o, gate_up, down, LM head; MoE experts where the model has them), flash "
                        "attention (context, without prior context; generation), all-reduce: interpolated from "
                        f"the rows measured in {db.engine} {db.engine_version} on {device} by {PACKAGE}'s "
                        "compiled engine (source 'silicon')",
            "modelled": {
                "prefill_attn over prior context": "no row measures a chunk over cached tokens: AIConfigurator "
                    "prices the measured causal prefill of the full length s = n + c and scales it by "
                    "(s^2 - c^2) / s^2 (aic-core operators/attention.rs prefix_correction); rotary embedding and "
                    "KV-cache write are added as memory ops x 1.1; never below the same chunk over less "
                    "cached context (operator 'prefix_monotone': that scaling also shrinks the launch's fixed "
                    "cost, so (16, 1024) came out cheaper than (16, 0); the kernel runs the same query rows over "
                    "more keys)",
                "prefill chunks of one step": "one varlen attention launch per layer for all of them (vLLM "
                    "FlashAttentionImpl.forward: one flash_attn_varlen_func call with cu_seqlens over every "
                    "scheduled request; SGLang's FlashAttentionBackend likewise): the launch's fixed cost "
                    f"prefill_attn_launch_s = {comp.launch_s * 1e3:.4f} ms is paid once per step. From the "
                    f"database's batched context-attention rows: F = (B T(1) - T(B)) / (B - 1) at B = "
                    f"{LAUNCH_BATCH} chunks of {LAUNCH_TOKENS} tokens (KernelDb.prefill_launch_seconds)",
                "elementwise": "RMSNorm + residual, SiLU-and-multiply, embedding, rotary, KV write: "
                    "AIConfigurator's analytic memory-op formula bytes / (mem_bw x 0.8) + 3 us (source "
                    "'empirical')",
                "decode_attn": "b sequences at the same context c (the batch's mean); each reads c + 1 keys; "
                    "never below streaming their KV cache from DRAM once per layer, bytes / "
                    f"{db.kv_stream_rate() / 1e12:.4g} TB/s + "
                    f"{db.gpu_spec.get('mem_empirical_constant_latency', 0.0)} s (AIConfigurator's memory-op "
                    "formula, at the rate the database's own decode row of "
                    f"{STREAM_REF_BATCH} x {STREAM_REF_CONTEXT} tokens streams its KV, never below mem_bw x "
                    f"{db.gpu_spec.get('mem_bw_empirical_scaling_factor', 1.0)}; "
                    "KernelDb.kv_stream_rate): its collector replays each kernel on one KV "
                    "cache in a CUDA graph, so batches whose KV fits in L2 were measured faster than a served "
                    "step, whose KV is cold, can run (operator 'kv_dram_floor', source 'modelled')",
                "decode_attn_mixed": ("decodes beside a prefill chunk in FlashAttention-2's varlen kernel "
                    f"({db.attention_kernel}): no GQA packing (flash_api.cpp seqlenq_ngroups_swapped needs "
                    f"max_seqlen_q == 1), so each decode runs one {FA2_SPLITKV_BLOCK_M}-row query tile per "
                    "query head over c + 1 keys; priced at the throughput of the measured causal prefill of "
                    f"{THROUGHPUT_PREFILL_TOKENS} tokens, x {FA2_SPLITKV_BLOCK_M} (c + 1) b / (s^2 / 2), never "
                    "below decode_attn (operator 'unpacked_gqa_tiles', source 'modelled'); and never below one "
                    "pass of the decodes' KV cache per query head of the group at the DRAM's rate, "
                    "(num_heads / num_kv_heads) x b (c + 1) x KV bytes / mem_bw (operator "
                    "'kv_reread_per_query_head'): each query head's tile streams its KV head itself. Evidence: "
                    "the LLMServingSim bundles' mixed rows (RTX PRO 6000, RTX 4090; chunk 1,024 + 16-64 decodes, "
                    "less the chunk alone) are 3.3-4.7 such passes for a group of 4")
                    if db.prices_mixed_decodes else None,
                "attention kernel": f"{db.attention_kernel or 'not recorded'}: the kernel_source label of the "
                    f"database's default-backend generation rows for {db.engine} {db.engine_version} on {db.system} "
                    "(vLLM: FlashAttention-3 on SM90, FA2 on SM80/SM89/SM120; SGLang: its fa3 backend on Hopper); "
                    "only FA2 loses GQA packing in a mixed varlen launch (FA3's hopper/flash_api.cpp get_pack_gqa "
                    "packs GQA heads whenever the KV is paged without TMA or split, else by its tile-use "
                    "heuristic, in varlen launches too), so only FA2 tables carry decode_attn_mixed",
                "decode skew": "none: the database measures batches at one context; decode_attn is priced at "
                    "the batch's mean context (decode_skew_alpha 0)",
                "all-reduce": ("two per layer of T x hidden bf16 elements (after attention, after the MLP), "
                    "vLLM custom all-reduce, CUDA-graph lane, as AIConfigurator prices it; 0 at tensor_parallel 1"
                    if db._nccl is None else "two per layer of T x hidden bf16 elements, priced as NCCL's all_reduce "
                    f"(allreduce 'nccl': AIConfigurator's custom-kernel time x nccl/custom at each message size, "
                    f"{db._nccl.source}; calib/sources/kernel_db_comm.py)"),
                "per_seq": "the LM head GEMM at m = sequences in the step (vLLM computes logits for every "
                    "scheduled request's last position); sampling is CPU/engine time, not included",
                "overhead, step_gap": "0: the engine's CPU time per step (scheduling, input preparation, "
                    "sampling, output processing) is not a kernel and is not in the database",
                "engine_cpu": ("not in the database: cbsim's default for this engine version "
                               "(sim.latency.engine_cpu), " + json.dumps(cpu.describe())) if cpu is not None
                    else f"no cbsim default for {db.engine} {db.engine_version}: the table has no engine_cpu "
                         "component (0)",
                "fp16": "priced with the bf16 kernels (the database has no fp16 GEMMs; same tensor-core rate)"
                    if db.dtype == "fp16" else None,
                "fp8": (f"w8a8 FP8 GEMMs and MoE, AIConfigurator quant mode {db.fp8_mode} ("
                        + ("128 x 128 block scales: the checkpoint's quantization_config.weight_block_size"
                           if db.fp8_mode == "fp8_block" else "per-tensor scales") + "); attention and KV cache in bf16"
                        + (f"; activation scales {db.fp8_activations} (fp8_activation_scales: the database's fp8 rows "
                           "quantize the activations dynamically; static scales are priced with AIConfigurator's "
                           "fp8_static mode, the fp8 row less its measured compute_scale, "
                           "quantize/computescale_perf.parquet)" if db.fp8_activations else ""))
                    if db.dtype == "fp8" else None,
            },
            "known_limits": known_limits(db),
            "operator_sources": sources,
            "grids": {"linear.tokens": list(g.tokens), "per_seq.sequences": list(g.sequences),
                      "prefill_attn.chunk_tokens": list(g.chunk_tokens), "prefill_attn.context": list(g.context),
                      "decode_attn.batch": list(g.batch), "decode_attn.mean_context": list(g.mean_context)},
            "breakdown_ms": breakdown,
        },
    }
    meta["provenance"]["modelled"] = {k: v for k, v in meta["provenance"]["modelled"].items() if v is not None}
    return meta


def known_limits(db: KernelDb) -> str:
    """What a user of this table should know before trusting it with a purchase: what the database
    cannot see, and the real runs it has been checked on (docs/accuracy.md, docs/accuracy-corpus.md)."""
    text = ("the database measures pure-decode batches at one context only: batches of unequal contexts are "
            "priced as if even (no decode skew)")
    if db.prices_mixed_decodes:
        text += ("; decodes beside a prefill chunk are priced by FlashAttention-2's varlen rule (one KV pass per "
                 "query head). Checked on one real run of this kind (vLLM 0.19, Llama-3.1-8B, RTX PRO 6000, "
                 "10.3 req/s, near capacity): mean TTFT +6.6 %, TPOT +2.7 %, E2E +3.6 %")
    else:
        text += ("; decodes beside a prefill chunk are priced as if alone (FA3 and the SGLang/TRT-LLM kernels keep "
                 "GQA packing in mixed launches). Measured against AIConfigurator's public serving corpus: "
                 "bench/silicon_accuracy.py, docs/accuracy-corpus.md")
    return text


def _op_names(comp: Composition) -> list[str]:
    names: list[str] = []
    for pts in comp.ops.values():
        for found in pts.values():
            for n in found:
                if n not in names:
                    names.append(n)
    return names


def _ms(found: dict[str, Op]) -> dict[str, float]:
    return {n: round(op.seconds / MS, 6) for n, op in found.items()}


def agreement(comp: Composition, n: int = 24, seed: int = 0) -> dict[str, Any]:
    """How the composed table prices whole steps against AIConfigurator's own step predictions
    (``predict_prefill_latency`` / ``predict_decode_latency``) at random shapes inside the grids:
    the composition's own error (interpolation, the split into components), not the database's."""
    import random

    db, t = comp.db, comp.table
    rng = random.Random(seed)
    g = t.grid()
    max_tokens = g["linear"]["tokens"][-1]
    max_ctx = min(g["prefill_attn"]["context"][-1], g["decode_attn"]["mean_context"][-1])
    errs = []
    for i in range(n):
        if i % 2 == 0:  # a prefill step of `bs` prompts of `isl` tokens, `prefix` of them cached
            bs = rng.choice((1, 1, 2, 4))
            isl = rng.randint(16, max(16, min(max_tokens // bs, max_ctx)))
            prefix = rng.choice((0, 0, rng.randint(0, isl // 2)))
            new = isl - prefix
            truth = db.predict_prefill(bs, isl, prefix)
            guess = (interp(t, "linear", bs * new) + interp(t, "per_seq", bs)
                     + bs * interp(t, "prefill_attn", new, prefix) - (bs - 1) * comp.launch_s)
        else:  # a decode step of `bs` sequences at `isl` context
            bs = rng.choice((1, 2, 8, 32, 64, 128, 256))
            isl = rng.randint(16, max(16, max_ctx // 2))
            truth = db.predict_decode(bs, isl)
            dec = comp.measured_decode
            guess = (interp(t, "linear", bs) + interp(t, "per_seq", bs)
                     + (_interp_axes(dec.axes, dec.values, (bs, isl)) if dec is not None
                        else interp(t, "decode_attn", bs, isl)))
        errs.append(abs(guess - truth) / truth)
    errs.sort()
    return {"mean_abs_rel": round(sum(errs) / len(errs), 4), "p90_abs_rel": round(errs[int(0.9 * (len(errs) - 1))], 4),
            "n": len(errs), "measured_on": f"{PACKAGE}'s own whole-step predictions (predict_prefill_latency, "
            f"predict_decode_latency) at {n} random prefill and decode shapes, seed {seed}: the composition's error, "
            "not the database's"}


def interp(table, component: str, *point: float) -> float:
    """A component's value at a point, linear (bilinear) between grid points like the simulator's
    table backend, clamped to the outermost cells."""
    comp = table.components[component]
    return _interp_axes(comp.axes, comp.values, point)


def _interp_axes(axes, values, point) -> float:
    if not axes:
        return float(values)
    axis, x = axes[0], point[0]
    if len(axis) == 1:
        return _interp_axes(axes[1:], values[0], point[1:])
    i = max(0, min(len(axis) - 2, _bisect(axis, x)))
    t = (x - axis[i]) / (axis[i + 1] - axis[i])
    lo = _interp_axes(axes[1:], values[i], point[1:])
    hi = _interp_axes(axes[1:], values[i + 1], point[1:])
    return max(lo + t * (hi - lo), 0.0)


def _bisect(axis, x) -> int:
    from bisect import bisect_right

    return bisect_right(axis, x) - 1


def with_kv_cache_dtype(source: ModelSource, kv_cache_dtype: str | None) -> ModelSource:
    """The model with its KV cache in ``kv_cache_dtype`` (None or ``auto``: the model's own dtype).
    Why: the database times attention per KV dtype (AIConfigurator's ``kvcache_quant_mode``, which
    :meth:`KernelDb.compile_kwargs` reads from the spec), and a server launched with
    ``--kv-cache-dtype fp8`` runs those kernels: on the H200 for Llama-3.1-70B fp8 TP 2 its decode
    attention rows are a median 0.86x the bf16 ones, its context attention 1.10x. The spec's own
    check refuses a dtype cbsim does not know."""
    from dataclasses import replace

    if kv_cache_dtype in (None, "auto"):
        return source
    return replace(source, spec=replace(source.spec, kv_cache_dtype=kv_cache_dtype))


def build_table(model: str, gpu: str, *, tp: int = 1, dtype: str | None = None, engine: str = "vllm",
                engine_version: str | None = None, block_size: int = 16, max_num_batched_tokens: int = 16384,
                max_model_len: int = 32768, max_num_seqs: int = 1024, fp8_scaling: str | None = None,
                draft: str | None = None, draft_vocab_size: int | None = None,
                allreduce: str = "custom", kv_cache_dtype: str | None = None) -> Composition:
    """The whole path of ``cbsim calibrate --from-kernel-db``: resolve, compose, check.

    ``draft`` (``eagle`` / ``eagle3``): the table of MODEL's speculative-decoding head instead, the
    shapes ``sim.speculative.draft_cost.draft_spec`` gives it (one decoder layer at MODEL's width,
    an LM head of ``draft_vocab_size`` rows), so that ``speculative.draft_table`` prices the
    drafter from the same database's GEMM and attention rows. ``kv_cache_dtype`` ``fp8``: the
    attention rows of an FP8 KV cache (vLLM's ``--kv-cache-dtype fp8``), :func:`with_kv_cache_dtype`."""
    for name, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-model-len", max_model_len),
                        ("--max-num-seqs", max_num_seqs), ("--block-size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CbsimError(f"{name} must be a positive integer, got {value!r}")
    require_aiconfigurator()
    source = with_kv_cache_dtype(resolve_model(model), kv_cache_dtype)
    if draft is not None:
        source = draft_source(source, draft, draft_vocab_size)
    if dtype is None:  # the checkpoint's own: FP8 for an fp8-quantized config, else bf16
        dtype = "fp8" if getattr(source.spec, "quantization", None) == "fp8" else "bf16"
    db = KernelDb(source, gpu, tp=tp, dtype=dtype, engine=engine, engine_version=engine_version,
                  fp8_scaling=fp8_scaling, allreduce=allreduce)
    grids = Grids.covering(max_num_batched_tokens, max_model_len, max_num_seqs)
    return compose(db, grids, block_size=block_size)
