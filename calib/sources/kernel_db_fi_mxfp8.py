"""vLLM's FlashInfer TRT-LLM-gen MXFP4 MoE kernel with MXFP8 activations (``moe_kernel="flashinfer-mxfp8"``):
the routed experts of an MXFP4 model (gpt-oss) as vLLM runs them on Blackwell under
``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``, priced from the kernel database's rows of that same
FlashInfer operator measured under SGLang.

Why a choice: on SM100 vLLM runs gpt-oss's experts through FlashInfer's ``trtllm_fp4_block_scale_moe``
(the TRT-LLM-gen fused MoE: routing, two batched GEMMs, finalize) either way. By default with bf16
activations (``get_mxfp4_backend`` in ``vllm/model_executor/layers/quantization/mxfp4.py``:
``SM100_FI_MXFP4_BF16``, "For faster performance on SM100, consider setting
VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1"; ``select_mxfp4_moe_backend`` /
``FLASHINFER_TRTLLM_MXFP4_BF16`` in ``fused_moe/oracle/mxfp4.py`` after the refactor); with the
variable set it quantizes the activations to MXFP8 first (``SM100_FI_MXFP4_MXFP8_TRTLLM``:
``mxfp8_quantize(x)`` then the same call with the MXFP8 tensor and its scales; ``vllm/envs.py``: "use the
FlashInfer MXFP8 (activation) x MXFP4 (weight) MoE backend"). The database times vLLM's experts on the
B200 only in the default form (vLLM 0.24.0,
``vllm_gptossmxfp4moe_flashinfer_trtllm_mxfp4_bf16_trtllmmxfp4expertsmonolithic``, ``w4a16_mxfp4``).

Where the MXFP8 form is measured: the database's SGLang 0.5.14 rows of the same FlashInfer operator
(``sglang_flashinfer_trtllm_moe``; AIConfigurator's SGLang collector runs SGLang's ``Mxfp4MoEMethod`` on
its ``trtllm_sm100`` FlashInfer path with ``flashinfer_mxfp4_moe_precision`` "bf16" for ``w4a16_mxfp4``
and "default", MXFP8 activations, for ``w4a8_mxfp4_mxfp8``), at gpt-oss's own shape and every layout
(moe_tp 1-32, moe_ep 1-128). They are used as measured, at the table's own moe_tp / moe_ep and
AIConfigurator's token distribution for gpt-oss (:data:`DISTRIBUTION`), linear between measured token
counts and proportional beyond the last. What makes the borrowing sound, checked on the database
itself: the SGLang ``w4a16_mxfp4`` rows of the operator agree with vLLM's own rows of it (B200,
TP 1-8, 1-16,384 tokens; tested), so the engine around the call does not show in the op's time. (The
database's TensorRT-LLM ``w4a8_mxfp4_mxfp8`` rows time TensorRT-LLM's own copy of the TRT-LLM-gen
kernels, ``TRTLLMGenFusedMoE``, and come out at a median 0.99x of these where both exist (0.94-1.0x at
EP 1-8; p10-p90 0.85-1.56x over EP 1-128), but only at moe_tp 1: they cannot price vLLM's
tensor-parallel experts.)
"""

from __future__ import annotations

from pathlib import Path

from calib.sources.kernel_db_marlin import DISTRIBUTION, interpolate_tokens
from sim.errors import CbsimError

KERNEL = "flashinfer-mxfp8"
SOURCE_ENGINE = "sglang"
KERNEL_SOURCE = "sglang_flashinfer_trtllm_moe"
MXFP8_DTYPE = "w4a8_mxfp4_mxfp8"
MS = 1e-3


def refusal(spec, engine: str) -> str | None:
    """Why ``--moe-kernel flashinfer-mxfp8`` cannot price this model in this engine, or None."""
    if engine != "vllm":
        return (f"--moe-kernel {KERNEL} prices vLLM's FlashInfer MXFP4 x MXFP8 MoE kernel "
                f"(VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1); this table is for {engine}; drop --moe-kernel, "
                "or use --engine vllm")
    if getattr(spec, "expert_quantization", None) != "mxfp4":
        what = getattr(spec, "expert_quantization", None) or ("bf16/fp8" if getattr(spec, "num_experts", 0) else "no")
        return f"--moe-kernel {KERNEL} prices MXFP4 experts (gpt-oss); {spec.name!r} has {what} experts: drop --moe-kernel"
    return None


def mxfp8_rows(gpu: str, engine: str, spec, *, moe_tp: int, moe_ep: int, dtype: str = MXFP8_DTYPE):
    """:class:`FlashInferMoeRows` of the database's system for ``gpu`` (its current SGLang version's rows),
    or the one-line refusal. ``dtype`` ``w4a16_mxfp4`` gives the operator's bf16-activation rows (the
    check against vLLM's own)."""
    from aiconfigurator_core.sdk.perf_database import resolve_query_version

    from calib.sources.kernel_db import aic_system, system_data_dir

    why = refusal(spec, engine)
    if why:
        raise CbsimError(why)
    system = aic_system(gpu)
    try:
        version = resolve_query_version(system, SOURCE_ENGINE, "current")
    except ValueError:
        version = None
    path = system_data_dir(system) / "moe" / SOURCE_ENGINE / (version or "-") / "moe_perf.parquet"
    return FlashInferMoeRows(path, spec, moe_tp=moe_tp, moe_ep=moe_ep, system=system, dtype=dtype)


class FlashInferMoeRows:
    """The database's rows of FlashInfer's TRT-LLM-gen MXFP4 MoE for one model's shape at one layout."""

    def __init__(self, path: Path, spec, *, moe_tp: int, moe_ep: int, system: str, dtype: str = MXFP8_DTYPE) -> None:
        import pyarrow.parquet as pq

        why = refusal(spec, "vllm")
        if why:
            raise CbsimError(why)
        shape = (spec.hidden_size, spec.moe_intermediate_size or spec.intermediate_size, spec.num_experts,
                 spec.num_experts_per_tok)
        where = (f"{SOURCE_ENGINE} {path.parent.name} on {system}, hidden {shape[0]}, intermediate {shape[1]}, "
                 f"{shape[2]} experts, top {shape[3]}, at moe_tp {moe_tp}, moe_ep {moe_ep}, {DISTRIBUTION}")
        rows = pq.read_table(path).to_pylist() if path.is_file() else []
        points: dict[int, list[float]] = {}
        for r in rows:
            if (r.get("kernel_source") == KERNEL_SOURCE and r.get("moe_dtype") == dtype
                    and (int(r["hidden_size"]), int(r["inter_size"]), int(r["num_experts"]), int(r["topk"])) == shape
                    and int(r["moe_tp_size"]) == moe_tp and int(r["moe_ep_size"]) == moe_ep
                    and r.get("distribution") == DISTRIBUTION):
                points.setdefault(int(r["num_tokens"]), []).append(float(r["latency"]))
        if not points:
            raise CbsimError(f"--moe-kernel {KERNEL}: the kernel database has no {dtype} rows of FlashInfer's "
                             f"TRT-LLM-gen MoE ({KERNEL_SOURCE}) for {where}; drop --moe-kernel (the database's own "
                             "rows), or pick a Blackwell GPU / layout it measured")
        self.tokens = sorted(points)
        self.latency_ms = [sum(points[t]) / len(points[t]) for t in self.tokens]
        self.dtype = dtype
        self.source = f"{path.parent.name} moe_perf.parquet, {KERNEL_SOURCE} {dtype} rows ({where})"

    def seconds(self, tokens: float) -> float:
        """One layer's routed experts at ``tokens`` tokens, as measured (linear between rows)."""
        if tokens <= 0:
            return 0.0
        return interpolate_tokens(self.tokens, self.latency_ms, tokens) * MS

    def describe(self) -> str:
        return ("routed experts on FlashInfer's TRT-LLM-gen MXFP4 MoE with MXFP8 activations (--moe-kernel "
                f"{KERNEL}: vLLM's VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1), borrowed from another engine's rows "
                "because the database times vLLM's experts only with bf16 activations: per layer the database's "
                f"{self.source}, as measured: the same FlashInfer call (trtllm_fp4_block_scale_moe after "
                "mxfp8_quantize) under SGLang, whose bf16-activation rows of it are vLLM's own within 7 % (TP 1-8, "
                "1-20,000 tokens on the B200); the TensorRT-LLM w4a8_mxfp4_mxfp8 rows (its own copy of these "
                "kernels) exist at moe_tp 1 only; calib/sources/kernel_db_fi_mxfp8.py. aic_agreement compares "
                "with AIConfigurator's own predictor, which prices the database's vLLM bf16-activation rows")
