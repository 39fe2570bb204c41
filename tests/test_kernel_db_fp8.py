"""Per-tensor FP8 GEMMs in kernel-db tables: static or dynamic activation scales
(calib/sources/kernel_db.py ``fp8_activation_scales``).

The database's ``fp8`` GEMM rows time TensorRT-LLM's ``Linear`` without an ``input_scale``, so each
includes a dynamic quantization of its input (an amax pass, ``compute_scale``), which the database
measures on its own (``quantize/<engine>/<version>/computescale_perf.parquet``). A TensorRT-LLM
FP8 checkpoint carries static input scales, so its tables price AIConfigurator's ``fp8_static``
mode: the fp8 row less that measured ``compute_scale``, per GEMM and per layer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import require_aic

LAYERS, HIDDEN = 64, 5120  # Qwen3-32B


def test_activation_scales_follow_the_checkpoint_then_the_engine():
    from calib.sources.kernel_db import fp8_activation_scales

    assert fp8_activation_scales("trtllm", {}) == "static"  # ModelOpt checkpoints calibrate input_scale
    assert fp8_activation_scales("vllm", {}) == "dynamic"  # --quantization fp8 of a bf16 checkpoint
    assert fp8_activation_scales("sglang", {}) == "dynamic"
    assert fp8_activation_scales("vllm", {"quantization_config": {"activation_scheme": "static"}}) == "static"
    assert (
        fp8_activation_scales("trtllm", {"quantization_config": {"activation_scheme": "dynamic"}})
        == "dynamic"
    )
    # a ModelOpt checkpoint (NVIDIA's hf_quant_config.json) carries calibrated input scales, and vLLM's
    # ModelOptFp8LinearMethod uses them (act_quant_static=True): static in every engine
    modelopt = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}
    for engine in ("vllm", "sglang", "trtllm"):
        assert fp8_activation_scales(engine, modelopt) == "static"
    # compressed-tensors groups say it per group (Qwen/Qwen3-32B-FP8-Static-PerTensor: dynamic false)
    def groups(dynamic):
        return {"quantization_config": {"config_groups": {"group_0": {"input_activations": {"dynamic": dynamic}}}}}

    assert fp8_activation_scales("vllm", groups(False)) == "static"
    assert fp8_activation_scales("trtllm", groups(True)) == "dynamic"


def _compute_scale_ms(m: int, k: int) -> float:
    import importlib.resources as res

    import pandas as pd

    root = (
        Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "h100_sxm" / "quantize" / "trtllm"
    )
    rows = pd.read_parquet(root / "1.3.0rc20" / "computescale_perf.parquet")
    hit = rows[(rows.m == m) & (rows.k == k)]
    assert len(hit) == 1
    return float(hit.latency.iloc[0])


def test_trtllm_fp8_gemms_are_the_dynamic_rows_less_the_measured_compute_scale():
    """Qwen3-32B fp8 on one H100 in TensorRT-LLM: its QKV GEMM (input: the hidden state) at 8 tokens
    costs, summed over the 64 layers, the database's dynamic fp8 price less 64 x compute_scale(8, 5120);
    vLLM's table keeps the dynamic rows."""
    require_aic()
    from calib.sources.kernel_db import KernelDb, resolve_model

    src = resolve_model("Qwen/Qwen3-32B")
    static = KernelDb(src, "h100-sxm", tp=1, dtype="fp8", engine="trtllm")
    assert static.fp8_activations == "static" and static.compile_kwargs()["gemm_quant_mode"] == "fp8_static"

    class Dynamic(KernelDb):
        def compile_kwargs(self):
            return {**super().compile_kwargs(), "gemm_quant_mode": "fp8"}

    dynamic = Dynamic(src, "h100-sxm", tp=1, dtype="fp8", engine="trtllm")
    saved = dynamic.linear_ops(8)["qkv_gemm"].seconds - static.linear_ops(8)["qkv_gemm"].seconds
    assert saved * 1e3 == pytest.approx(LAYERS * _compute_scale_ms(8, HIDDEN), rel=0.01)
    assert 0.3e-3 < saved < 0.7e-3  # ~7 us a GEMM: 15 % of the QKV GEMM's 2.1 ms at 8 tokens

    vllm = KernelDb(src, "h100-sxm", tp=1, dtype="fp8", engine="vllm")
    assert vllm.fp8_activations == "dynamic" and vllm.compile_kwargs()["gemm_quant_mode"] == "fp8"


def test_nvidias_modelopt_fp8_llama_8b_prices_static_input_scales():
    """nvidia/Llama-3.1-8B-Instruct-FP8 (the corpus' H200 vLLM rows) resolves to the config cbsim
    ships: Llama-3.1-8B's shapes with ModelOpt's hf_quant_config.json, so its table is per-tensor FP8
    with static activation scales (vLLM's ModelOptFp8LinearMethod): AIConfigurator's fp8_static mode,
    each GEMM the dynamic row less its measured compute_scale, cheaper than the same shapes priced
    as ``--quantization fp8`` of the bf16 checkpoint (dynamic)."""
    require_aic()
    from calib.sources.kernel_db import KernelDb, resolve_model

    src = resolve_model("nvidia/Llama-3.1-8B-Instruct-FP8")
    base = resolve_model("meta-llama/Meta-Llama-3.1-8B")
    assert src.spec.quantization == "fp8" and src.origin.startswith("cbsim")
    for key in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
        assert getattr(src.spec, key) == getattr(base.spec, key)
    static = KernelDb(src, "h200", tp=1, dtype="fp8", engine="vllm")
    dynamic = KernelDb(base, "h200", tp=1, dtype="fp8", engine="vllm")
    assert (static.fp8_mode, static.fp8_activations) == ("fp8", "static")
    assert static.compile_kwargs()["gemm_quant_mode"] == "fp8_static"
    assert dynamic.fp8_activations == "dynamic"
    for tokens in (1, 40, 1024):
        s, d = static.linear_ops(tokens), dynamic.linear_ops(tokens)
        for gemm in ("qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm"):
            assert s[gemm].seconds < d[gemm].seconds, (tokens, gemm)
