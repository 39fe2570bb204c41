"""Tables whose MXFP4 experts run on vLLM's FlashInfer TRT-LLM-gen MoE with MXFP8 activations
(calib/sources/kernel_db_fi_mxfp8.py, ``--moe-kernel flashinfer-mxfp8``): the borrowing checked on the
database (the same FlashInfer operator's bf16 rows under SGLang are vLLM's own), priced from the SGLang
MXFP8 rows as measured, refused where it does not apply, and chosen by the corpus bench for the
InferenceMAX B200 rows whose launch scripts set VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1."""

from __future__ import annotations

import importlib.resources as res
from pathlib import Path

import pytest

from sim.errors import CbsimError
from tests.helpers import GPT_OSS as OSS
from tests.helpers import (
    gpt_oss_moe_db,
    inferencemax_gpt_oss_row,
    moe_build_kwargs,
    moe_per_layer_ms,
    require_aic,
)

KERNEL = "flashinfer-mxfp8"




def test_the_same_flashinfer_operator_times_the_same_under_sglang_as_under_vllm():
    """The premise of the borrowing: the database's SGLang rows of FlashInfer's TRT-LLM-gen MXFP4 MoE
    with bf16 activations price gpt-oss's experts as the database's vLLM rows of it do (what
    AIConfigurator's own operator gives the default table), within 7 % at TP 1-8 from 1 to 20,000
    tokens; the engine around the call does not show."""
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_fi_mxfp8 import mxfp8_rows
    from calib.sources.kernel_db_moe import Layout

    spec = resolve_model(OSS).spec
    for tp in (1, 2, 4, 8):
        vllm = gpt_oss_moe_db("b200", Layout(tp))
        sglang_bf16 = mxfp8_rows("b200", "vllm", spec, moe_tp=tp, moe_ep=1, dtype="w4a16_mxfp4")
        for tokens in (1, 3, 8, 50, 128, 700, 1024, 5000, 8192, 20000):
            ratio = sglang_bf16.seconds(tokens) * 1e3 / moe_per_layer_ms(vllm, tokens)
            assert 0.93 < ratio < 1.07, (tp, tokens, ratio)


def test_one_point_read_by_hand_from_the_mxfp8_rows():
    """B200, TP 2, 1,024 tokens: the SGLang 0.5.14 row of the FlashInfer operator with MXFP8 activations
    at gpt-oss's shape, as measured; 700 tokens linear between its two nearest rows. Everything but the
    routed experts is the database's table."""
    require_aic()
    import pandas as pd

    from calib.sources.kernel_db_moe import Layout

    path = (Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "b200_sxm" / "moe" / "sglang"
            / "0.5.14" / "moe_perf.parquet")
    df = pd.read_parquet(path)
    rows = df[(df.kernel_source == "sglang_flashinfer_trtllm_moe") & (df.moe_dtype == "w4a8_mxfp4_mxfp8")
              & (df.moe_tp_size == 2) & (df.moe_ep_size == 1) & (df.distribution == "power_law_1.2")
              & (df.hidden_size == 2880) & (df.num_experts == 128)].groupby("num_tokens").latency.mean()
    db = gpt_oss_moe_db("b200", Layout(2), KERNEL)
    assert moe_per_layer_ms(db, 1024) == pytest.approx(rows[1024], rel=1e-9)
    below = max(t for t in rows.index if t < 700)
    above = min(t for t in rows.index if t > 700)
    lo, hi = rows[below], rows[above]
    assert moe_per_layer_ms(db, 700) == pytest.approx(lo + (700 - below) / (above - below) * (hi - lo), rel=1e-9)
    assert db.linear_ops(1024)["moe"].source == f"silicon ({KERNEL})"
    base = gpt_oss_moe_db("b200", Layout(2))
    a, b = base.linear_ops(1024), db.linear_ops(1024)
    assert {k: v.seconds for k, v in a.items() if k != "moe"} == {k: v.seconds for k, v in b.items() if k != "moe"}


def test_mxfp8_activations_cost_less_than_bf16_most_at_prefill_sizes():
    """The MXFP8 form runs the GEMMs on FP8 tensor cores: 0.7-0.95x the bf16 rows' time at decode sizes
    (1-64 tokens), under 0.5x at 8,192 tokens on every TP degree (0.30-0.44x in the database)."""
    require_aic()
    from calib.sources.kernel_db_moe import Layout

    for tp in (1, 2, 4, 8):
        bf16, mxfp8 = gpt_oss_moe_db("b200", Layout(tp)), gpt_oss_moe_db("b200", Layout(tp), KERNEL)
        for tokens in (8, 16, 64):
            assert 0.65 < moe_per_layer_ms(mxfp8, tokens) / moe_per_layer_ms(bf16, tokens) < 0.95, (tp, tokens)
        assert moe_per_layer_ms(mxfp8, 8192) < 0.5 * moe_per_layer_ms(bf16, 8192), tp


def test_the_option_is_refused_where_it_does_not_apply():
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import Layout, MoeKernelDb

    with pytest.raises(CbsimError, match=f"^--moe-kernel {KERNEL} prices vLLM's FlashInfer MXFP4 x MXFP8 MoE kernel "
                                         r"\(VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1\); this table is for trtllm"):
        gpt_oss_moe_db("b200", Layout(1), KERNEL, engine="trtllm")
    with pytest.raises(CbsimError, match=r"MXFP4 experts \(gpt-oss\); 'llama-3-8b' has no experts: drop --moe-kernel$"):
        MoeKernelDb(resolve_model("llama-3-8b"), "b200", Layout(), moe_kernel=KERNEL)
    # Hopper has no such rows (no MXFP8 tensor-core path): one line naming the remedy
    with pytest.raises(CbsimError, match=f"^--moe-kernel {KERNEL}: the kernel database has no w4a8_mxfp4_mxfp8 rows "
                                         r"of FlashInfer's TRT-LLM-gen MoE .*on h200_sxm.*drop --moe-kernel"):
        gpt_oss_moe_db("h200", Layout(8), KERNEL)
    assert gpt_oss_moe_db("b200", Layout(8)).mxfp8 is None  # the default prices the database's own rows


def test_the_table_says_which_kernel_and_where_its_rows_come_from():
    require_aic()
    from calib.sources import kernel_db_moe

    comp = kernel_db_moe.build_table(OSS, "b200", kernel_db_moe.Layout(4), moe_kernel=KERNEL,
                                     max_num_batched_tokens=1024, max_model_len=2048, max_num_seqs=16)
    prov = comp.table.metadata["provenance"]
    note = prov["modelled"]["moe kernel"]
    assert "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1" in note and "sglang_flashinfer_trtllm_moe w4a8_mxfp4_mxfp8" in note
    assert "moe_tp 4, moe_ep 1" in note
    assert prov["operator_sources"]["moe"] == [f"silicon ({KERNEL})"]


def _row(**kw):
    return inferencemax_gpt_oss_row("0.15.1", **{"system": "b200_sxm", "tp": 2, **kw})


def test_the_bench_runs_mxfp8_experts_where_the_b200_launch_script_set_it(monkeypatch):
    """InferenceMAX's vLLM gpt-oss rows on the B200 (every version: the flag is in every B200 script
    read, the first runs' included) get FlashInfer MXFP8 tables, their own cache folder; TensorRT-LLM,
    other GPUs, other sources and ``--moe-kernel database`` keep their kernels."""
    require_aic()
    import bench.silicon_accuracy as sa

    rows = {"b200": _row(), "blank": _row(version=""), "trt": _row(engine="trtllm", version="1.2.0rc2"),
            "h200": _row(system="h200_sxm", version="0.18.0"),
            "aic": _row(source="db-dump/2026-04-27; config_id=3")}
    sa.classify(list(rows.values()))
    assert {k: r.moe_kernel for k, r in rows.items()} == {
        "b200": KERNEL, "blank": KERNEL, "trt": "database", "h200": "marlin", "aic": "database"}
    key = rows["b200"].table_key
    assert key[-4:] == ("moe", 1, False, KERNEL) and sa.key_moe_kernel(key) == KERNEL
    assert sa.moe_part(key) == (1, False, False)
    # the B200 scripts also set kv-cache-dtype fp8 (tests/test_kernel_db_kv_dtype.py)
    assert sa.key_kv(key) == "fp8"
    assert sa.table_dir(key, "d").name == f"vllm-b200-openai--gpt-oss-120b-tp2-bf16-dp1-{KERNEL}-kvfp8"
    off = _row()
    sa.classify([off], moe_kernel="database")
    assert off.moe_kernel == "database" and off.table_key == key[:-1]
    built = moe_build_kwargs(monkeypatch, key)
    assert built["moe_kernel"] == KERNEL and built["kv_cache_dtype"] == "fp8"
    assert moe_build_kwargs(monkeypatch, off.table_key)["moe_kernel"] == "database"
