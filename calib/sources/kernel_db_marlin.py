"""Which kernel a kernel-db table prices an MXFP4 model's routed experts with in vLLM: the database's
own rows for the model, or vLLM's Marlin MXFP4 MoE kernel (``moe_kernel="marlin"``).

Why a choice: vLLM picks the MXFP4 MoE backend at start-up (``select_mxfp4_moe_backend`` in
``vllm/model_executor/layers/fused_moe/oracle/mxfp4.py``; ``get_mxfp4_backend`` in
``quantization/mxfp4.py`` before it). On Hopper it runs OpenAI's Triton kernel by default, and
``VLLM_MXFP4_USE_MARLIN=1`` makes it run the Marlin kernel instead (a weight-only kernel: FP4
weights dequantized to bf16 in registers, bf16 tensor-core math, cp.async loads). The database
times gpt-oss's experts on the H100 and H200 with the Triton kernel only
(``vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic``), which AIConfigurator prices; it
measures the Marlin MXFP4 MoE kernel on the same GPUs for another model's experts (Kimi-K3:
hidden 3584, intermediate 3072, 896 experts, top 16,
``vllm_compressedtensorsw4a4mxfp4moe_marlin_marlinexperts_situ_as_silu``).

How ``marlin`` prices the experts from those rows (:class:`MarlinMoeRows`): at the same **tokens
per expert** each expert's GEMMs have the same M, so the kernel runs at the same FLOP rate. The
model's experts at N tokens cost ``C × L(N × r)``, where ``L`` is the measured row's latency
(linear between measured token counts, proportional beyond the last), ``r = (k / E) / (k' / E')``
maps N tokens of the model (top k of E experts) to the source's tokens at the same tokens per
expert, and ``C`` is the ratio of the two kernels' FLOPs at those token counts
(``2 × k × 3 × H × I`` per token, with the shapes Marlin pads to: hidden to a multiple of 256, the
per-GPU intermediate to a multiple of 128; vLLM's ``create_weights`` /
``mxfp4_round_up_hidden_size_and_intermediate_size``). Rows at the table's own layout
(``moe_tp``, ``moe_ep``) and AIConfigurator's token distribution for the model
(:data:`DISTRIBUTION`). Where the database has Marlin rows of the model's own shape (the L40S,
where vLLM has no Triton kernel) they are used as measured (``C = r = 1``).

The transfer checked on the database itself: the Kimi-K2 INT4 Marlin rows (hidden 7168, 384
experts, top 8) predict the Kimi-K3 MXFP4 Marlin rows on the H200 and H100 within 0.78-1.15x from
1 to 8,192 tokens at TP 1-8, and the L40S's own gpt-oss MXFP4 Marlin rows within 0.85-1.12x from
32 to 8,192 tokens (docs/accuracy-corpus.md, "The MoE kernel of InferenceMAX's gpt-oss scripts").

At decode sizes the FLOP ratio also scales the source's fixed cost (its chain of kernel launches:
align, two Marlin GEMMs, activation, reduction), which a smaller shape does not shorten: on the
H200 at TP 8 the transfer gives gpt-oss 10 us a layer at 1 token where no Marlin MoE row of the
database, any shape or layout, is under 40 us (the cheapest: Kimi-K2's INT4 experts at TP 8, 1
token; the Kimi-K3 MXFP4 rows themselves never go under 59 us). So a layer never costs less than the
cheapest Marlin MoE layer the database measured on the GPU (:attr:`MarlinMoeRows.floor_ms`). On the
L40S a floor at the cheapest Kimi-K2 row (31 us) turns the Kimi-K2 transfer's 0.28-0.45x of
gpt-oss's measured rows at 1 token, TP 4-8, into 1.07-1.14x. (Every one of these rows times vLLM's
whole FusedMoE forward, routing included: AIConfigurator's vLLM 0.24.0 MoE collector. The Kimi
models route by grouped top-k with a bias, heavier than gpt-oss's softmax top-k, so the floor is
if anything high for gpt-oss.)
"""

from __future__ import annotations

from bisect import bisect_left
from pathlib import Path

from sim.errors import CbsimError, nearest

# "flashinfer-mxfp8": vLLM's FlashInfer MXFP4 x MXFP8 MoE on Blackwell (calib/sources/kernel_db_fi_mxfp8.py)
MOE_KERNELS = ("database", "marlin", "flashinfer-mxfp8")
# AIConfigurator's token distribution over the experts for the models its MOEModel prices (gpt-oss):
# workload_distribution "power_law" (sdk/config.py) at MOEModel._power_law_alpha 1.2 (sdk/models/moe.py)
DISTRIBUTION = "power_law_1.2"
MARLIN_DTYPE = "w4a16_mxfp4"
MS = 1e-3


def check_moe_kernel(kind: str) -> str:
    if kind not in MOE_KERNELS:
        raise CbsimError(f"--moe-kernel {kind!r} is not one of {', '.join(MOE_KERNELS)}{nearest(kind, MOE_KERNELS)}")
    return kind


def refusal(spec, engine: str) -> str | None:
    """Why ``--moe-kernel marlin`` cannot price this model in this engine, or None."""
    if engine != "vllm":
        return (f"--moe-kernel marlin prices vLLM's Marlin MXFP4 MoE kernel (VLLM_MXFP4_USE_MARLIN=1); this "
                f"table is for {engine}; drop --moe-kernel, or use --engine vllm")
    if getattr(spec, "expert_quantization", None) != "mxfp4":
        what = getattr(spec, "expert_quantization", None) or ("bf16/fp8" if getattr(spec, "num_experts", 0) else "no")
        return (f"--moe-kernel marlin prices MXFP4 experts (gpt-oss); {spec.name!r} has {what} experts: "
                "drop --moe-kernel")
    return None


def marlin_rows(gpu: str, engine: str, engine_version: str | None, spec, *, moe_tp: int, moe_ep: int):
    """:class:`MarlinMoeRows` of the database's system for ``gpu`` and the engine version a table of it
    prices (resolved as :class:`calib.sources.kernel_db.KernelDb` resolves it), or the one-line refusal."""
    from aiconfigurator_core.sdk.perf_database import resolve_query_version

    from calib.sources.kernel_db import aic_system, system_data_dir

    why = refusal(spec, engine)
    if why:
        raise CbsimError(why)
    system = aic_system(gpu)
    try:
        version = resolve_query_version(system, engine, engine_version or "current")
    except ValueError as exc:
        raise CbsimError(f"--engine-version: {exc}") from None
    return MarlinMoeRows(system_data_dir(system), engine, version, spec, moe_tp=moe_tp, moe_ep=moe_ep,
                         system=system)


def marlin_flops_per_token(hidden: int, inter: int, topk: int, moe_tp: int) -> int:
    """FLOPs one token costs in the Marlin MoE kernel: top-k experts x (gate/up GEMM ``2I x H`` + down
    GEMM ``H x I``) x 2, at the shapes Marlin pads to (hidden to 256, the per-GPU intermediate to 128)."""
    h = -(-hidden // 256) * 256
    i = -(-(inter // moe_tp) // 128) * 128
    return 2 * topk * 3 * h * i


class MarlinMoeRows:
    """The database's Marlin MXFP4 MoE rows of one system and vLLM version, at one layout, priced for
    one model's experts (see the module docstring)."""

    def __init__(self, data_dir: Path, engine: str, engine_version: str, spec, *, moe_tp: int, moe_ep: int,
                 system: str) -> None:
        import pyarrow.parquet as pq

        why = refusal(spec, engine)
        if why:
            raise CbsimError(why)
        path = data_dir / "moe" / engine / engine_version / "moe_perf.parquet"
        rows = pq.read_table(path).to_pylist() if path.is_file() else []
        where = (f"vLLM {engine_version} on {system} at moe_tp {moe_tp}, moe_ep {moe_ep}, distribution "
                 f"{DISTRIBUTION}")
        shapes: dict[tuple[int, int, int, int], dict[int, list[float]]] = {}
        marlin = [r for r in rows if "marlin" in str(r.get("kernel_source", ""))]
        for r in marlin:
            if (r.get("moe_dtype") == MARLIN_DTYPE
                    and int(r["moe_tp_size"]) == moe_tp and int(r["moe_ep_size"]) == moe_ep
                    and r.get("distribution") == DISTRIBUTION):
                shape = (int(r["hidden_size"]), int(r["inter_size"]), int(r["num_experts"]), int(r["topk"]))
                shapes.setdefault(shape, {}).setdefault(int(r["num_tokens"]), []).append(float(r["latency"]))
        if not shapes:
            raise CbsimError(f"--moe-kernel marlin: the kernel database has no Marlin MXFP4 MoE rows for {where}; "
                             "drop --moe-kernel (the database's own rows), or pick a GPU / layout it measured")
        own = (spec.hidden_size, spec.moe_intermediate_size or spec.intermediate_size, spec.num_experts,
               spec.num_experts_per_tok)
        mine = marlin_flops_per_token(own[0], own[1], 1, moe_tp)
        # the model's own shape where measured, else the shape whose per-GPU expert GEMMs are nearest in size
        self.shape = own if own in shapes else min(
            shapes, key=lambda s: (abs(marlin_flops_per_token(s[0], s[1], 1, moe_tp) / mine - 1), s))
        h, i, e, k = self.shape
        points = shapes[self.shape]
        self.tokens = sorted(points)
        self.latency_ms = [sum(points[t]) / len(points[t]) for t in self.tokens]
        self.ratio = (own[3] / own[2]) / (k / e)  # source tokens per model token, same tokens per expert
        self.scale = marlin_flops_per_token(own[0], own[1], own[3], moe_tp) / (
            marlin_flops_per_token(h, i, k, moe_tp) * self.ratio)
        self.source = (f"{path.parent.name} moe_perf.parquet, Marlin MXFP4 rows of hidden {h}, intermediate {i}, "
                       f"{e} experts, top {k} ({where})")
        # the cheapest Marlin MoE layer the database measured on this GPU, any shape, weight format and layout
        self.floor_ms = min(float(r["latency"]) for r in marlin)

    def seconds(self, tokens: float) -> float:
        """One layer's routed experts at ``tokens`` tokens: ``scale x L(tokens x ratio)``, never below
        :attr:`floor_ms`."""
        if tokens <= 0:
            return 0.0
        return max(self.scale * interpolate_tokens(self.tokens, self.latency_ms, tokens * self.ratio), self.floor_ms) * MS

    def describe(self) -> str:
        return ("routed experts on vLLM's Marlin MXFP4 MoE kernel (--moe-kernel marlin: VLLM_MXFP4_USE_MARLIN=1; "
                "the database times this model's experts with another kernel): per layer, C x L(T x r), L the "
                f"database's {self.source}, r = {self.ratio:.4g} (the same tokens per expert), C = {self.scale:.4g} "
                "(the two shapes' FLOPs at those token counts, 2 x topk x 3 x H x I with hidden padded to 256 and "
                "the per-GPU intermediate to 128 as Marlin pads them), never below the cheapest Marlin MoE layer "
                f"the database measured on this GPU ({self.floor_ms * 1e3:.1f} us: the op's chain of kernel launches "
                "and pipeline fill, which a smaller shape does not shorten); calib/sources/kernel_db_marlin.py. "
                "aic_agreement compares with AIConfigurator's own predictor, which prices the database's kernel")


def interpolate_tokens(xs: list[int], ys: list[float], x: float) -> float:
    """Latency at ``x`` tokens: linear between measured points, the first row below them, proportional
    to the tokens beyond the last (the kernel's FLOP rate at its largest measured size)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * x / xs[-1]
    j = bisect_left(xs, x)
    f = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
    return ys[j - 1] + f * (ys[j] - ys[j - 1])
