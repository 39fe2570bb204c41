"""Tables whose MXFP4 experts run on vLLM's Marlin kernel (calib/sources/kernel_db_marlin.py,
``--moe-kernel marlin``): refused where it does not apply, priced from the database's own Marlin MXFP4
rows at the same tokens per expert, and chosen by the corpus bench for the InferenceMAX rows whose
launch scripts set VLLM_MXFP4_USE_MARLIN=1."""

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


def test_the_option_is_refused_where_it_does_not_apply():
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_marlin import check_moe_kernel, refusal
    from calib.sources.kernel_db_moe import Layout, MoeKernelDb

    with pytest.raises(CbsimError, match=r"--moe-kernel 'marlinn' is not one of database, marlin, flashinfer-mxfp8 \(did you mean"):
        check_moe_kernel("marlinn")
    with pytest.raises(CbsimError, match="^--moe-kernel marlin prices vLLM's Marlin MXFP4 MoE kernel .*for sglang; "
                                         "drop --moe-kernel, or use --engine vllm$"):
        gpt_oss_moe_db("h200", Layout(8), "marlin", engine="sglang")
    with pytest.raises(CbsimError, match=r"MXFP4 experts \(gpt-oss\); 'llama-3-8b' has no experts: drop --moe-kernel$"):
        MoeKernelDb(resolve_model("llama-3-8b"), "h200", Layout(), moe_kernel="marlin")
    # a typo in another option is named as that, not as a Marlin refusal
    with pytest.raises(CbsimError, match=r"^--engine 'vllmm' is not one of .*did you mean 'vllm'"):
        gpt_oss_moe_db("h200", Layout(8), "marlin", engine="vllmm")
    with pytest.raises(CbsimError, match="tensor_parallel=3 does not divide its 64 attention heads"):
        gpt_oss_moe_db("h200", Layout(3), "marlin")
    assert "has bf16/fp8 experts" in refusal(resolve_model("deepseek-ai/DeepSeek-V3").spec, "vllm")
    # the A100's vLLM 0.14.0 rows have no Marlin MXFP4 MoE measurement at all
    with pytest.raises(CbsimError, match="^--moe-kernel marlin: the kernel database has no Marlin MXFP4 MoE rows "
                                         "for vLLM 0.14.0 on a100_sxm at moe_tp 8, moe_ep 1"):
        gpt_oss_moe_db("a100-80gb", Layout(8), "marlin")
    assert gpt_oss_moe_db("h200", Layout(8)).marlin is None  # the default prices the database's own rows


def test_the_cli_writes_a_marlin_table_and_refuses_the_flag_elsewhere(tmp_path, capsys):
    """``cbsim calibrate --from-kernel-db --moe-kernel marlin``: one error line without --from-kernel-db,
    for a --draft, and for a model or engine it does not apply to; the table's command records it."""
    import json

    from tests.helpers import run_cli

    code, _, err = run_cli(capsys, "calibrate", "--model", "tiny", "--moe-kernel", "marlin", "--out", tmp_path / "x")
    assert code == 2 and "--moe-kernel goes with --from-kernel-db" in err and "Traceback" not in err
    require_aic()
    db = ("calibrate", "--from-kernel-db", "--gpu", "h200", "--model")
    code, _, err = run_cli(capsys, *db, OSS, "--draft", "eagle", "--moe-kernel", "marlin", "--out", tmp_path / "x")
    assert code == 2 and "drop it for --draft" in err
    code, _, err = run_cli(capsys, *db, "llama-3-8b", "--moe-kernel", "marlin", "--out", tmp_path / "x")
    assert code == 2 and "'llama-3-8b' has no experts" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, *db, OSS, "--engine", "trtllm", "--moe-kernel", "marlin", "--out", tmp_path / "x")
    assert code == 2 and "this table is for trtllm" in err
    out = tmp_path / "t"
    code, _, err = run_cli(capsys, *db, OSS, "--tp", "8", "--moe-kernel", "marlin", "--max-num-batched-tokens", "1024",
                           "--max-model-len", "2048", "--max-num-seqs", "16", "--out", out)
    assert code == 0, err
    prov = json.loads((out / "metadata.json").read_text())["provenance"]
    assert "--moe-kernel marlin" in prov["command"] and "VLLM_MXFP4_USE_MARLIN=1" in prov["modelled"]["moe kernel"]


def test_one_point_recomputed_by_hand_from_the_marlin_rows():
    """H200, TP 8, 1,024 tokens: gpt-oss's 4 of 128 experts are the Kimi-K3 rows' 16 of 896 at
    1,024 x (4/128)/(16/896) = 1,792 tokens (between the rows at 1,536 and 2,048), times the FLOP ratio
    of the two shapes as Marlin pads them: (4 x 3072 x 384) / (16 x 3584 x 384 x 1.75)."""
    require_aic()
    import pandas as pd

    from calib.sources.kernel_db_moe import Layout

    path = (Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "h200_sxm" / "moe" / "vllm"
            / "0.24.0" / "moe_perf.parquet")
    df = pd.read_parquet(path)
    rows = df[df.kernel_source.str.contains("marlin") & (df.moe_dtype == "w4a16_mxfp4") & (df.moe_tp_size == 8)
              & (df.moe_ep_size == 1) & (df.distribution == "power_law_1.2") & (df.hidden_size == 3584)
              ].set_index("num_tokens").latency
    lo, hi = rows[1536], rows[2048]
    source_ms = lo + (1792 - 1536) / (2048 - 1536) * (hi - lo)
    scale = (4 * 3072 * 384) / (16 * 3584 * 384 * 1.75)  # 2880/8 = 360 pads to 384, 2880 to 3072
    db = gpt_oss_moe_db("h200", Layout(8), "marlin")
    assert (db.marlin.ratio, db.marlin.shape) == (pytest.approx(1.75), (3584, 3072, 896, 16))
    assert db.marlin.scale == pytest.approx(scale, rel=1e-12)
    assert moe_per_layer_ms(db, 1024) == pytest.approx(scale * source_ms, rel=1e-9)
    assert db.linear_ops(1024)["moe"].source == "silicon (marlin)"
    # everything but the routed experts is the database's table
    base = gpt_oss_moe_db("h200", Layout(8))
    a, b = base.linear_ops(1024), db.linear_ops(1024)
    assert {k: v.seconds for k, v in a.items() if k != "moe"} == {k: v.seconds for k, v in b.items() if k != "moe"}


def test_marlin_costs_more_than_the_triton_rows_at_prefill_sizes_and_less_at_decode():
    """At prefill sizes Marlin's bf16 tensor-core path runs at ~100-230 TFLOPS where the Triton kernel
    the database times gpt-oss with is 1.2-2.2x faster; at decode sizes (4-64 tokens) the transferred
    rate is below the Triton rows (vLLM PR #27523 measured Marlin faster at batch 8 on Hopper) and still
    above reading the active experts' weights from DRAM once, and above the floor."""
    require_aic()
    from calib.sources.kernel_db_moe import Layout

    bandwidth = {"h200": 4.8e12, "h100-sxm": 3.35e12}
    for gpu in ("h200", "h100-sxm"):
        for tp in (1, 8):
            triton, marlin = gpt_oss_moe_db(gpu, Layout(tp)), gpt_oss_moe_db(gpu, Layout(tp), "marlin")
            for tokens in (1024, 4096, 8192):
                assert moe_per_layer_ms(marlin, tokens) > 1.1 * moe_per_layer_ms(triton, tokens), (gpu, tp, tokens)
            assert moe_per_layer_ms(marlin, 8192) > 1.7 * moe_per_layer_ms(triton, 8192)
            inter = -(-(2880 // tp) // 128) * 128
            expert_bytes = 3 * 3072 * inter * (0.5 + 1 / 32)  # FP4 values plus one e8m0 scale per 32
            for tokens in (1, 4, 16, 64):
                if tokens > 1:
                    assert moe_per_layer_ms(marlin, tokens) < moe_per_layer_ms(triton, tokens), (gpu, tp, tokens)
                active = 128 * (1 - (1 - 4 / 128) ** tokens)  # distinct experts under uniform routing
                assert moe_per_layer_ms(marlin, tokens) > active * expert_bytes / bandwidth[gpu] * 1e3
                assert moe_per_layer_ms(marlin, tokens) >= marlin.marlin.floor_ms


def test_no_layer_costs_less_than_the_cheapest_marlin_layer_the_database_measured():
    """The FLOP ratio would scale the source rows' fixed cost too (10 us a layer at 1 token, TP 8, on the
    H200); the floor is the cheapest Marlin MoE row on the GPU, any shape and format: Kimi-K2's INT4
    experts at TP 8, 1 token (40 us), where the Kimi-K3 MXFP4 rows never go under 59 us."""
    require_aic()
    import pandas as pd

    from calib.sources.kernel_db_moe import Layout

    path = (Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "h200_sxm" / "moe" / "vllm"
            / "0.24.0" / "moe_perf.parquet")
    df = pd.read_parquet(path)
    marlin = df[df.kernel_source.str.contains("marlin")]
    cheapest = marlin.loc[marlin.latency.idxmin()]
    assert (cheapest.moe_dtype, cheapest.num_tokens, cheapest.moe_tp_size) == ("int4_wo", 1, 8)
    assert marlin[marlin.moe_dtype == "w4a16_mxfp4"].latency.min() > 0.059
    db = gpt_oss_moe_db("h200", Layout(8), "marlin")
    assert db.marlin.floor_ms == cheapest.latency
    unfloored = db.marlin.scale * db.marlin.latency_ms[0] * 1.75  # ~ the transfer at 1 token (rows 1, 2)
    assert unfloored < 0.5 * cheapest.latency
    assert moe_per_layer_ms(db, 1) == pytest.approx(cheapest.latency, rel=1e-12)
    assert moe_per_layer_ms(db, 256) > 3 * cheapest.latency  # the floor leaves the throughput regime alone


def test_the_models_own_marlin_rows_are_priced_as_the_database_prices_them():
    """On the L40S vLLM has no Triton MXFP4 kernel and the database times gpt-oss's experts with Marlin
    itself: the option then reads those rows as measured, and lands on AIConfigurator's own operator
    (its layer count, token distribution and interpolation between rows), at measured token counts and
    between them, tensor- or expert-parallel, and under attention data parallelism."""
    require_aic()
    from calib.sources.kernel_db_moe import Layout

    # attention DP: the experts see every rank's tokens (T x D), as AIConfigurator prices them
    for layout in (Layout(4), Layout(8, 1, True), Layout(1, 8, True)):
        base, mine = gpt_oss_moe_db("l40s", layout), gpt_oss_moe_db("l40s", layout, "marlin")
        assert (mine.marlin.ratio, mine.marlin.scale) == (1.0, 1.0)
        for tokens in (1, 16, 100, 1024, 3000, 8192):
            assert mine.linear_ops(tokens)["moe"].seconds == pytest.approx(base.linear_ops(tokens)["moe"].seconds,
                                                                            rel=1e-6)


def test_the_table_says_which_kernel_and_how(tmp_path):
    require_aic()
    from calib.sources import kernel_db_moe
    from sim.cli.calibrate import kernel_db_command

    comp = kernel_db_moe.build_table(OSS, "h200", kernel_db_moe.Layout(8), moe_kernel="marlin",
                                     max_num_batched_tokens=1024, max_model_len=2048, max_num_seqs=16)
    prov = comp.table.metadata["provenance"]
    note = prov["modelled"]["moe kernel"]
    assert "VLLM_MXFP4_USE_MARLIN=1" in note and "hidden 3584, intermediate 3072, 896 experts, top 16" in note
    assert prov["operator_sources"]["moe"] == ["silicon (marlin)"]
    common = dict(tp=8, dtype=None, engine="vllm", engine_version=None, block_size=16, limits={}, data_parallel=1,
                  expert_parallel=False, draft=None, draft_vocab_size=None, allreduce="custom")
    assert "--moe-kernel marlin" in kernel_db_command(Path("t"), model=OSS, gpu="h200", moe_kernel="marlin",
                                                      **common)
    assert "--moe-kernel" not in kernel_db_command(Path("t"), model=OSS, gpu="h200", **common)


def _row(**kw):
    return inferencemax_gpt_oss_row("0.18.0", **{"system": "h200_sxm", "tp": 8, **kw})


def test_the_bench_runs_marlin_where_the_launch_script_set_it(monkeypatch):
    """InferenceMAX's vLLM gpt-oss rows on H100/H200 from vLLM 0.13 on (its PR #327 added
    VLLM_MXFP4_USE_MARLIN=1 with that image) get Marlin tables, their own cache folder; older images,
    other engines, GPUs, sources and ``--moe-kernel database`` keep the database's rows."""
    require_aic()
    import bench.silicon_accuracy as sa

    rows = {"h200": _row(), "h100": _row(system="h100_sxm", version="0.13.0"),
            "old": _row(system="h100_sxm", version="0.11.2"), "blank": _row(version=""),
            "b200": _row(system="b200_sxm", version="0.15.1"), "trt": _row(engine="trtllm", version="1.2.0rc2"),
            "aic": _row(source="db-dump/2026-04-27; config_id=3"), "len": _row(isl=4000, osl=1000)}
    sa.classify(list(rows.values()))
    kernels = {k: r.moe_kernel for k, r in rows.items()}
    # (the B200's rows run FlashInfer's MXFP8 kernel: tests/test_kernel_db_fi_mxfp8.py)
    assert kernels == {"h200": "marlin", "h100": "marlin", "old": "database", "blank": "database",
                       "b200": "flashinfer-mxfp8", "trt": "database", "aic": "database", "len": "database"}
    key = rows["h200"].table_key
    assert key[-4:] == ("moe", 1, False, "marlin") and sa.key_moe_kernel(key) == "marlin"
    assert sa.moe_part(key) == (1, False, False)
    assert sa.table_dir(key, "d").name == "vllm-h200-openai--gpt-oss-120b-tp8-bf16-dp1-marlin"
    assert rows["trt"].table_key[-1] is False and sa.key_moe_kernel(rows["trt"].table_key) == "database"
    off = _row()
    sa.classify([off], moe_kernel="database")
    assert off.moe_kernel == "database" and off.table_key == key[:-1]
    # the table is built with that kernel
    assert moe_build_kwargs(monkeypatch, key)["moe_kernel"] == "marlin"
    assert moe_build_kwargs(monkeypatch, off.table_key)["moe_kernel"] == "database"
