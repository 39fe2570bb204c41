"""Kernel-database tables for MLA and MoE models under wide expert parallelism and attention data
parallelism (``cbsim calibrate --from-kernel-db --data-parallel D --expert-parallel``).

What changes from :mod:`calib.sources.kernel_db` (the dense and tensor-parallel path, whose
composition this reuses unchanged):

- **the layout** AIConfigurator compiles the model for: ``tp`` attention ranks per data-parallel
  rank, ``attention_dp`` data-parallel attention ranks, and the MoE over the same
  ``tp × attention_dp`` GPUs either expert-parallel (``moe_ep = tp × dp``, ``moe_tp = 1``: vLLM's
  ``--enable-expert-parallel``, SGLang's ``--ep``) or tensor-parallel (``moe_tp = tp × dp``: vLLM's
  DP without EP, where the MoE layers form one ``tp × dp`` tensor-parallel group). The database
  then prices the experts from its ``moe`` rows at this rank's expert share, and the dispatch and
  combine of an EP MoE (``moe_pre_dispatch``, ``moe_post_dispatch``) from the engine's own
  communication rows (all-to-all / all-gather + reduce-scatter by message size and GPU count);
- **lockstep**: under attention DP, AIConfigurator's MoE operators see the tokens of every DP rank
  (T per rank × dp: its ``attention_dp_size`` multiplies the MoE's token count), so ``linear(T)``
  is the step of one rank when every rank runs T tokens, the MoE waiting for all of them. A
  table made so prices the ranks of a DP engine as stepping together on equal shares, which is
  how the corpus rows run them (one concurrency split evenly over the ranks). When the ranks run
  unequal token counts (one prefilling beside the others' decodes) the experts see the group's
  tokens, not D times the slowest rank's: the table's ``moe_group`` component (the routed experts'
  share of ``linear(T)``, :func:`add_moe_group`) lets :mod:`sim.lockstep` price them so;
- **dense first layers**: DeepSeek's ``first_k_dense_replace`` layers run a dense FFN where
  AIConfigurator's operator list prices the MoE block over every layer
  (:meth:`MoeKernelDb.with_dense_layers`);
- **MLA**: AIConfigurator prices DeepSeek-style attention as one ``mla_block`` operator (the
  q/kv low-rank projections, the rope, the attention and o_proj, from its ``mla`` and
  ``mla_bmm`` rows), so the block is taken whole as attention: ``prefill_attn(n, c)`` is the
  block over a chunk of ``n`` tokens after ``c`` cached ones (the non-absorbed path) and
  ``decode_attn(b, c̄)`` the block for ``b`` decodes (the absorbed path). What that leaves out: in
  a step that has both, the block's projections run once per kind rather than once over all
  rows (their weights are read twice), written to ``provenance.modelled``;
- **the routed experts' kernel**: the database's own rows for the model (``moe_kernel="database"``,
  AIConfigurator's choice), or vLLM's Marlin MXFP4 kernel (``"marlin"``: ``VLLM_MXFP4_USE_MARLIN=1``,
  priced from the database's Marlin MXFP4 rows at the same tokens per expert;
  :mod:`calib.sources.kernel_db_marlin`), or vLLM's FlashInfer MXFP4 x MXFP8 kernel on Blackwell
  (``"flashinfer-mxfp8"``: ``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``, priced from the database's SGLang
  rows of the same FlashInfer operator; :mod:`calib.sources.kernel_db_fi_mxfp8`);
- **quantization** as the checkpoint ships it: FP8 block-quantized GEMMs and experts
  (``fp8_block``) for DeepSeek-V3/R1 and Kimi-K2, MXFP4 weight-only experts (``w4a16_mxfp4``)
  for gpt-oss, INT4 weight-only experts (``int4_wo``) for Kimi-K2.5; context attention in bf16
  (the database has no FP8 context-MLA rows for these engines on Hopper).

The table prices the target without its multi-token-prediction layers (the engines load them only
as a speculative-decoding draft); ``--draft mtp`` composes the MTP layer's own table
(:mod:`calib.sources.kernel_db_mtp`) for ``speculative.draft_table``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calib.sources.kernel_db import KernelDb, ModelSource, Op, check_engine
from calib.sources.kernel_db_fi_mxfp8 import KERNEL as FI_MXFP8
from calib.sources.kernel_db_fi_mxfp8 import mxfp8_rows
from calib.sources.kernel_db_marlin import check_moe_kernel, marlin_rows
from sim.errors import CbsimError


@dataclass(frozen=True)
class Layout:
    """One replica's parallel layout, in the scenario's words: ``tensor_parallel`` attention GPUs per
    data-parallel rank, ``data_parallel`` ranks, experts split over all of them or TP-sharded."""

    tensor_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        for key in ("tensor_parallel", "data_parallel"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CbsimError(f"--{key.replace('_', '-')} must be a positive integer, got {value!r}")

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.data_parallel

    @property
    def moe_ep(self) -> int:
        return self.gpus if self.expert_parallel else 1

    @property
    def moe_tp(self) -> int:
        return 1 if self.expert_parallel else self.gpus

    def to_metadata(self) -> dict[str, Any]:
        """The table's ``parallel`` metadata: what :func:`sim.latency.table.check_compatible` compares."""
        return {
            "data_parallel": self.data_parallel,
            "expert_parallel": self.moe_ep,
            "moe_tensor_parallel": self.moe_tp,
        }

    @property
    def is_plain(self) -> bool:
        """Tensor parallelism only (the layout every table without ``parallel`` metadata was made for)."""
        return self.data_parallel == 1 and not self.expert_parallel


def moe_quant_mode(spec, dtype: str, engine: str = "vllm", system: str | None = None) -> str:
    """AIConfigurator's quantization mode of the routed experts as the engine runs the checkpoint.

    MXFP4 experts (gpt-oss) run with bf16 activations (``w4a16_mxfp4``) except in TensorRT-LLM on
    Blackwell, which quantizes the activations to MXFP8 there (``w4a8_mxfp4_mxfp8``: the MoE
    support matrix of TensorRT-LLM's ``examples/models/core/gpt_oss/README.md``, "Hopper: bf16 /
    Blackwell: mxfp8", whose Blackwell backends CUTLASS and TRTLLM take no bf16 activation;
    InferenceMAX's ``benchmarks/gptoss_fp4_b200_trt.sh`` serves with ``moe_config: backend: TRTLLM``;
    the database's TensorRT-LLM rows on every Blackwell GPU have that mode, its RTX PRO 6000 rows
    only that one). AIConfigurator's own predictor prices the checkpoint's label, ``w4a16_mxfp4``,
    everywhere (``sdk/models/helpers.py``), 2.6-6.7x the MXFP8 rows' time on the B200 from 1 to
    256 tokens."""
    expert = getattr(spec, "expert_quantization", None)
    if expert == "mxfp4":
        if engine == "trtllm" and system is not None and _is_blackwell(system):
            return "w4a8_mxfp4_mxfp8"
        return "w4a16_mxfp4"
    if expert == "int4":
        return "int4_wo"
    if dtype == "fp8":
        return "fp8_block" if getattr(spec, "is_mla", False) else "fp8"
    return "bfloat16"


def _is_blackwell(system: str) -> bool:
    """Whether AIConfigurator's system is a Blackwell GPU (SM100/SM120), by its own test."""
    from aiconfigurator_core.sdk.perf_database import is_blackwell_system

    return bool(is_blackwell_system(system))


class MoeKernelDb(KernelDb):
    """:class:`KernelDb` compiled for a :class:`Layout` and for MLA's ``mla_block`` operator."""

    def __init__(
        self,
        model: ModelSource,
        gpu: str,
        layout: Layout,
        dtype: str = "bf16",
        engine: str = "vllm",
        engine_version: str | None = None,
        moe_kernel: str = "database",
    ) -> None:
        spec = model.spec
        if layout.expert_parallel and not spec.is_moe:
            raise CbsimError(
                f"--expert-parallel needs a mixture-of-experts model; {spec.name!r} has no experts"
            )
        if layout.data_parallel > 1 and not spec.is_moe:
            raise CbsimError(
                f"--data-parallel: the data-parallel ranks of a dense model ({spec.name!r}) are "
                f"independent engines; make the table at --tp {layout.tensor_parallel} without "
                f"--data-parallel (the scenario's hardware.data_parallel then runs one per rank)"
            )
        spec.check_ep(layout.moe_ep)
        self.layout = layout
        # the routed experts' kernel (calib/sources/kernel_db_marlin.py): None prices the database's own
        # rows; refused (model, engine, rows) before anything is compiled, after the engine and TP
        # checks, so a typo in either is named as that rather than as a Marlin refusal
        self.moe_kernel = check_moe_kernel(moe_kernel)
        if moe_kernel != "database":
            check_engine(engine)
            spec.check_tp(layout.tensor_parallel)
        self.marlin = (marlin_rows(gpu, engine, engine_version, spec, moe_tp=layout.moe_tp, moe_ep=layout.moe_ep)
                       if moe_kernel == "marlin" else None)
        # vLLM's FlashInfer MXFP4 x MXFP8 experts (calib/sources/kernel_db_fi_mxfp8.py)
        self.mxfp8 = (mxfp8_rows(gpu, engine, spec, moe_tp=layout.moe_tp, moe_ep=layout.moe_ep)
                      if moe_kernel == FI_MXFP8 else None)
        super().__init__(
            model, gpu, tp=layout.tensor_parallel, dtype=dtype, engine=engine, engine_version=engine_version
        )

    @property
    def expert_rows(self):
        """The rows that price the routed experts in place of the database's own (:attr:`marlin` or
        :attr:`mxfp8`), or None."""
        return self.marlin if self.marlin is not None else self.mxfp8

    def with_moe_kernel(self, ops: dict, tokens: int) -> dict:
        """``ops`` with the routed experts (AIConfigurator's ``moe`` operator, summed over the layers) priced
        on the kernel the table was asked for (:attr:`expert_rows`: Marlin MXFP4, or FlashInfer's MXFP4 x
        MXFP8), at the tokens the experts see (``tokens`` x the data-parallel ranks, as AIConfigurator
        prices them); else unchanged."""
        rows = self.expert_rows
        if rows is None or "moe" not in ops or tokens <= 0:
            return ops
        seconds = self.model.spec.num_layers * rows.seconds(tokens * self.layout.data_parallel)
        return {**ops, "moe": Op(seconds, f"silicon ({self.moe_kernel})")}

    def compile_kwargs(self) -> dict[str, Any]:
        spec, lay = self.model.spec, self.layout
        kwargs = super().compile_kwargs()
        if spec.is_mla and self.dtype == "fp8":
            kwargs["gemm_quant_mode"] = "fp8_block"  # DeepSeek's 128 x 128 weight blocks
        if spec.is_mla:
            kwargs["fmha_quant_mode"] = "bfloat16"
        kwargs["attention_dp_size"] = lay.data_parallel
        if spec.is_moe:
            kwargs.update(
                moe_quant_mode=moe_quant_mode(spec, self.dtype, self.engine, self.system),
                moe_tp_size=lay.moe_tp,
                moe_ep_size=lay.moe_ep,
            )
        return kwargs

    @staticmethod
    def is_attention_op(name: str) -> bool:
        return name.endswith("mla_block") or KernelDb.is_attention_op(name)

    def linear_ops(self, tokens: int):
        """The token-major operators at ``tokens``; up to :data:`MOE_OVERLAP_MAX_TOKENS` the
        shared experts run beside the routed ones (:data:`MODELLED_MOE_OVERLAP`), priced as
        AIConfigurator's generation list composes them (its ``generation_moe_overlap`` operator:
        the slower of the two groups, not their sum). The first dense layers get their dense FFN
        in place of the MoE block (:meth:`with_dense_layers`)."""
        gen = self._gen_linear
        if gen and int(tokens) <= MOE_OVERLAP_MAX_TOKENS:
            ops = self._ops(self.handle.evaluate_generation_ops(gen, batch_size=int(tokens), s=1))
            return self.with_dense_layers(ops, int(tokens), context=False)
        return self.context_linear_ops(tokens)

    def context_linear_ops(self, tokens: int):
        """AIConfigurator's context list of token-major operators at ``tokens`` (shared and routed
        experts summed), the first dense layers corrected (:meth:`with_dense_layers`)."""
        ops = self.with_moe_kernel(super().linear_ops(tokens), int(tokens))
        return self.with_dense_layers(ops, int(tokens), context=True)

    @property
    def dense_layers(self) -> int:
        """How many of the model's first layers have a dense FFN that AIConfigurator's operator list
        prices as MoE layers: ``first_k_dense_replace`` of a DeepSeek-style config (DeepSeek-V3/R1: 3
        of 61; Kimi-K2.5: 1 of 61) when the list has no dense FFN GEMM of its own (its DeepSeek
        model counts every layer in the shared-expert, router and MoE operators:
        ``sdk/models/deepseek.py``, ``num_moe_layers=self._num_layers``), else 0."""
        if not hasattr(self, "_dense_layers"):
            spec = self.model.spec
            k = int(getattr(spec, "first_k_dense_layers", 0) or 0) if spec.is_moe else 0
            names = self.context_ops
            has_dense = any("gate_up_gemm" in n and "shared" not in n for n in names)
            self._dense_layers = k if 0 < k < spec.num_layers and not has_dense else 0
        return self._dense_layers

    def with_dense_layers(self, ops: dict, tokens: int, *, context: bool) -> dict:
        """``ops`` with the MoE block (:data:`MOE_BLOCK_OPS`) over ``L - k`` of the ``L`` layers and
        the ``k`` dense layers' SwiGLU FFN added (:data:`MODELLED_DENSE_LAYERS`): its gate/up and down
        GEMMs priced from the database's GEMM rows at ``tokens`` rows, its activation by
        AIConfigurator's memory-op formula, at the engine's MLP tensor parallelism
        (:meth:`dense_mlp_tp`). Unchanged without dense layers or tokens."""
        k = self.dense_layers
        if not k or tokens <= 0:
            return ops
        keep = 1.0 - k / self.model.spec.num_layers
        out = {name: (Op(op.seconds * keep, op.source) if name in MOE_BLOCK_OPS else op) for name, op in ops.items()}
        out.update(self._ops(self._dense_ffn_rows(tokens, context)))
        return out

    def dense_mlp_tp(self) -> int:
        """TensorRT-LLM's (and SGLang's) tensor parallelism of a DeepSeek dense layer's MLP: 1 under
        attention DP ("the MLP also uses DP instead of TP"), else gcd(intermediate / 128, tp)
        (``DeepseekV3DecoderLayer._compute_mlp_tp_size``: the FP8 128-block scales bound it)."""
        import math

        if self.layout.data_parallel > 1:
            return 1
        return math.gcd(self.model.spec.intermediate_size // 128, self.layout.tensor_parallel)

    def _dense_ffn_rows(self, tokens: int, context: bool):
        import aiconfigurator_core.sdk.operations as aic_ops
        from aiconfigurator_core.sdk import common
        from aiconfigurator_core.sdk.engine import build_ops_json

        spec, k, tp = self.model.spec, self.dense_layers, self.dense_mlp_tp()
        inter, h = spec.intermediate_size // tp, spec.hidden_size
        quant = getattr(common.GEMMQuantMode, str(self.compile_kwargs()["gemm_quant_mode"]))
        phase = "context" if context else "generation"
        key = (phase, k, tp)
        cache = self.__dict__.setdefault("_dense_json", {})
        if key not in cache:
            cache[key] = build_ops_json([
                aic_ops.GEMM(f"{phase}_dense_gate_up_gemm", k, 2 * inter, h, quant),
                aic_ops.ElementWise(f"{phase}_dense_act_gate", k, 2 * inter, inter, 0.8),
                aic_ops.GEMM(f"{phase}_dense_ffn2_gemm", k, h, inter, quant),
            ])
        if context:
            return self.handle.evaluate_ops_json(cache[key], is_context=True, batch_size=1, s=int(tokens))
        return self.handle.evaluate_ops_json(cache[key], is_context=False, batch_size=int(tokens), s=1)

    @property
    def overlaps_shared_experts(self) -> bool:
        """Whether the engine runs the shared experts beside the routed ones in this layout: TensorRT-LLM
        always (``DeepseekV3MoE``: ``maybe_execute_in_parallel`` on ``aux_stream``), SGLang unless its
        experts are expert-parallel (``DeepseekV2MoE.forward`` takes ``forward_deepep``, shared experts
        first, when an all-to-all backend is on); vLLM: not claimed (no source read)."""
        return self.engine == "trtllm" or (self.engine == "sglang" and not self.layout.expert_parallel)

    @property
    def _gen_linear(self) -> list[int]:
        """Positions of the generation list's token-major operators when the engine overlaps the MoE's
        shared and routed experts (:attr:`overlaps_shared_experts`) and the list has the operator for
        it (``*_moe_overlap``), else []."""
        if not hasattr(self, "_gen_linear_idx"):
            from calib.sources.kernel_db import spec_op_names

            names = spec_op_names(self.handle.evaluate_generation_ops)
            overlap = self.overlaps_shared_experts and any(n.endswith("moe_overlap") for n in names)
            self._gen_linear_idx = (
                [i for i, n in enumerate(names) if not self.is_attention_op(n) and "logits" not in n]
                if overlap
                else []
            )
        return self._gen_linear_idx

    def _check_shape(self) -> None:
        s, p = self.model.spec, self.parsed
        if not s.is_mla:
            return super()._check_shape()
        # AIConfigurator's parsed `d` is not MLA's head size; the layer count, width, heads and
        # vocabulary still name the same model
        for key, mine, theirs in (
            ("num_layers", s.num_layers, p["layers"]),
            ("hidden_size", s.hidden_size, p["hidden_size"]),
            ("num_heads", s.num_heads, p["n"]),
            ("vocab_size", s.vocab_size, p["vocab"]),
        ):
            if mine != theirs:
                raise CbsimError(
                    f"model {s.name!r}: {key} is {mine} in cbsim's spec but {theirs} in the config.json "
                    f"given to the kernel database ({self.model.origin}); they must describe the same "
                    f"model"
                )
        return None


# AIConfigurator's operators of a DeepSeek-style MoE block (shared experts, router, dispatch, routed
# experts; ``moe_overlap``: the block with shared and routed experts overlapped), each priced over
# every layer of the model
MOE_BLOCK_OPS = (
    "shared_gate_up_gemm", "shared_act_gate", "shared_ffn2_gemm", "router_gemm", "moe_pre_dispatch", "moe",
    "moe_post_dispatch", "moe_overlap",
)
MODELLED_DENSE_LAYERS = (
    "first dense layers: AIConfigurator's DeepSeek model prices the MoE block (shared experts, router, "
    "dispatch, routed experts) over every layer (sdk/models/deepseek.py: num_moe_layers = num_layers); "
    "the checkpoint's first_k_dense_replace layers run a dense SwiGLU FFN instead. linear(T) takes the "
    "MoE block's operators over L - k of the L layers and adds the k layers' FFN (gate/up and down "
    "GEMMs from the database's GEMM rows, the activation by AIConfigurator's memory-op formula) at the "
    "engine's MLP tensor parallelism (TensorRT-LLM DeepseekV3DecoderLayer._compute_mlp_tp_size: 1 "
    "under attention DP, else gcd(intermediate_size / 128, tp)); the dense layers' own all-reduce is "
    "left out with the MoE block's dispatch and combine"
)

# SGLang runs the shared experts on the current stream and the router + routed experts on an
# alternate one when a step has at most this many tokens (python/sglang/srt/models/deepseek_v2.py,
# DeepseekV2MoE.forward: DUAL_STREAM_TOKEN_THRESHOLD = 1024, forward_normal_dual_stream)
MOE_OVERLAP_MAX_TOKENS = 1024
MODELLED_MOE_OVERLAP = (
    "shared experts beside the routed ones: up to 1024 tokens a step, linear(T) takes the MoE block "
    "as AIConfigurator's generation list composes it (generation_moe_overlap, the slower of the "
    "shared and the routed group) instead of their sum. SGLang: DeepseekV2MoE.forward runs "
    "forward_normal_dual_stream (shared experts on the current stream, gate + routed experts on "
    "alt_stream) at <= DUAL_STREAM_TOKEN_THRESHOLD = 1024 tokens (python/sglang/srt/models/"
    "deepseek_v2.py); TensorRT-LLM: DeepseekV3MoE computes shared and routed outputs through "
    "maybe_execute_in_parallel on aux_stream (tensorrt_llm/_torch/models/modeling_deepseekv3.py), "
    "multi-stream in CUDA-graph (decode) steps (tensorrt_llm/_torch/modules/multi_stream_utils.py); "
    "not for SGLang with expert-parallel experts (forward_deepep: shared experts first) nor vLLM. "
    "On 8 x H200, SGLang, DeepSeek-V3 TP 8: 1.3 ms less a step at 4 tokens (7.43 -> 6.13 ms), 1.1 ms "
    "at 64; above 1024 tokens the two groups are summed"
)
MODELLED_MLA = (
    "MLA: the mla_block operator (projections + attention) is priced per chunk in prefill_attn and per "
    "decode batch in decode_attn, so in a step with both its projection weights are read twice"
)


# AIConfigurator's operators of the routed experts and their dispatch / combine: under attention DP
# it prices them at every rank's tokens (T x attention_dp_size), the rest at the rank's own T
ROUTED_OPS = ("moe_pre_dispatch", "moe", "moe_post_dispatch")
MODELLED_MOE_GROUP = (
    "attention DP: moe_group(T) is the part of linear(T) that is the routed experts with their dispatch "
    "and combine (AIConfigurator's moe_pre_dispatch, moe, moe_post_dispatch, priced over T x D tokens): "
    "linear(T) less the operators each rank runs on its own T tokens (norms, shared experts, router). "
    "A lockstep group whose ranks ran unequal token counts prices the experts once at the group's mean "
    "tokens per rank instead of each rank's own (sim/lockstep.py): TensorRT-LLM all-gathers each rank's "
    "own count (DeepseekV3MoE.compute_routed_output, use_dp_padding off on Hopper; CUDA graphs, which "
    "pad, only when every rank is generation-only at one batch size)"
)


def moe_group_seconds(db: MoeKernelDb, tokens: int, linear_s: float) -> float:
    """The routed experts' share of ``linear(tokens) = linear_s`` (:data:`MODELLED_MOE_GROUP`):
    ``linear_s`` less AIConfigurator's per-rank operators at ``tokens`` (its context list, every
    operator but :data:`ROUTED_OPS`), within [0, linear_s]. Where the shared experts overlap the
    routed ones (:attr:`MoeKernelDb.overlaps_shared_experts`, up to 1024 tokens) ``linear_s`` holds the
    slower group, so the share is what the routed group adds beyond the shared one."""
    if tokens <= 0:
        return 0.0
    own = sum(op.seconds for name, op in db.context_linear_ops(tokens).items() if name not in ROUTED_OPS)
    return min(max(linear_s - own, 0.0), linear_s)


def add_moe_group(comp) -> None:
    """The table's ``moe_group`` component on its ``linear`` grid (sim/latency/table_format.py)."""
    from sim.latency.table_format import make_component

    lin = comp.table.components["linear"]
    axis = lin.axes[0]
    values = [moe_group_seconds(comp.db, int(t), float(v)) for t, v in zip(axis, lin.values)]
    comp.table.components["moe_group"] = make_component("moe_group", (axis,), values)


def build_table(
    model: str,
    gpu: str,
    layout: Layout,
    *,
    dtype: str | None = None,
    engine: str = "vllm",
    engine_version: str | None = None,
    block_size: int = 16,
    max_num_batched_tokens: int = 16384,
    max_model_len: int = 32768,
    max_num_seqs: int = 1024,
    moe_kernel: str = "database",
    kv_cache_dtype: str | None = None,
):
    """:func:`calib.sources.kernel_db.build_table` for a :class:`Layout` (and MLA models); ``moe_kernel``
    the routed experts' kernel (:mod:`calib.sources.kernel_db_marlin`); ``kv_cache_dtype`` ``fp8``: the
    attention rows of an FP8 KV cache (:func:`calib.sources.kernel_db.with_kv_cache_dtype`)."""
    from calib.sources.kernel_db import require_aiconfigurator, resolve_model, with_kv_cache_dtype

    require_aiconfigurator()
    return compose_source(with_kv_cache_dtype(resolve_model(model), kv_cache_dtype), gpu, layout, dtype=dtype,
                          engine=engine, engine_version=engine_version, block_size=block_size,
                          max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                          max_num_seqs=max_num_seqs, moe_kernel=moe_kernel)


def compose_source(
    source: ModelSource,
    gpu: str,
    layout: Layout,
    *,
    dtype: str | None = None,
    engine: str = "vllm",
    engine_version: str | None = None,
    block_size: int = 16,
    max_num_batched_tokens: int = 16384,
    max_model_len: int = 32768,
    max_num_seqs: int = 1024,
    moe_kernel: str = "database",
):
    """The table of one resolved model source (the target, or its MTP layer) for ``layout``."""
    from calib.sources.kernel_db import Grids, compose

    if dtype is None:
        dtype = "fp8" if getattr(source.spec, "quantization", None) == "fp8" else "bf16"
    db = MoeKernelDb(source, gpu, layout, dtype=dtype, engine=engine, engine_version=engine_version,
                     moe_kernel=moe_kernel)
    comp = compose(
        db, Grids.covering(max_num_batched_tokens, max_model_len, max_num_seqs), block_size=block_size
    )
    meta = comp.table.metadata
    meta["parallel"] = layout.to_metadata()
    notes = {"mla_block": MODELLED_MLA} if source.spec.is_mla else {}
    if layout.data_parallel > 1 and source.spec.is_moe:
        add_moe_group(comp)
        notes["moe_group"] = MODELLED_MOE_GROUP
    if db._gen_linear:
        notes["moe shared/routed overlap"] = MODELLED_MOE_OVERLAP
    if db.dense_layers:
        notes["first dense layers"] = MODELLED_DENSE_LAYERS
    if db.expert_rows is not None:
        notes["moe kernel"] = db.expert_rows.describe()
    mode = db.compile_kwargs().get("moe_quant_mode")
    if mode == "w4a8_mxfp4_mxfp8":  # not the checkpoint's label (moe_quant_mode's docstring)
        notes["moe activations"] = (
            "routed experts priced from the database's w4a8_mxfp4_mxfp8 rows (MXFP4 weights, MXFP8 activations), "
            "not the checkpoint's w4a16_mxfp4: TensorRT-LLM quantizes the MoE activations to MXFP8 on Blackwell "
            "(examples/models/core/gpt_oss/README.md); AIConfigurator's own predictor prices w4a16_mxfp4"
        )
    if notes:
        prov = meta.setdefault("provenance", {}) or {}
        modelled = prov.get("modelled")
        if isinstance(modelled, list):
            modelled.extend(notes.values())
        elif isinstance(modelled, dict):
            modelled.update(notes)
        else:
            prov["modelled"] = ([modelled] if modelled else []) + list(notes.values())
        meta["provenance"] = prov
    return comp


def takes(model: str, layout: Layout) -> bool:
    """Whether ``cbsim calibrate --from-kernel-db`` composes through this module: a layout beyond
    tensor parallelism, an MLA model, or experts in a 4-bit format."""
    if not layout.is_plain:
        return True
    from calib.sources.kernel_db import resolve_model

    spec = resolve_model(model).spec
    return spec.is_mla or spec.expert_quantization is not None
