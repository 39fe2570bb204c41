"""Kernel-db tables of an FP8 KV cache (``cbsim calibrate --from-kernel-db --kv-cache-dtype fp8``,
``calib.sources.kernel_db.with_kv_cache_dtype``): the attention rows the database measured for that KV
dtype, the flag recorded in the table's command, and one error line where it does not apply; the
corpus bench prices a row's table with the KV dtype its launch script set."""

from __future__ import annotations

import json

import numpy as np

from tests.helpers import require_aic, run_cli

LIMITS = ("--max-num-batched-tokens", "2048", "--max-model-len", "4096", "--max-num-seqs", "64")


def _calibrate(capsys, out, *extra):
    return run_cli(capsys, "calibrate", "--from-kernel-db", "--gpu", "h200", "--model", "llama-3-8b", *LIMITS,
                   *extra, "--out", out)


def test_an_fp8_kv_table_prices_the_databases_fp8_attention_rows_and_records_the_flag(tmp_path, capsys):
    require_aic()
    from sim.latency.table_format import read_table

    code, _, err = _calibrate(capsys, tmp_path / "bf16")
    assert code == 0, err
    code, _, err = _calibrate(capsys, tmp_path / "fp8", "--kv-cache-dtype", "fp8")
    assert code == 0, err
    bf16, fp8 = read_table(tmp_path / "bf16"), read_table(tmp_path / "fp8")
    for name in ("linear", "per_seq"):  # no GEMM reads the KV cache
        np.testing.assert_array_equal(bf16.components[name].values, fp8.components[name].values)
    # the database's FP8-KV decode kernel: dearer at small batches and contexts (its dequantization),
    # cheaper where reading the KV cache dominates (half the bytes); measured rows, not a scaling
    ratio = fp8.components["decode_attn"].values / bf16.components["decode_attn"].values
    assert ratio.min() < 0.8 and ratio.max() > 1.05
    big = fp8.components["decode_attn"].values[-1, -1] / bf16.components["decode_attn"].values[-1, -1]
    assert big < 0.8, big  # the most sequences at the longest context
    assert not np.allclose(fp8.components["prefill_attn"].values, bf16.components["prefill_attn"].values)
    meta = json.loads((tmp_path / "fp8" / "metadata.json").read_text())
    assert "--kv-cache-dtype fp8" in meta["provenance"]["command"]
    assert meta["model"]["kv_cache_dtype"] == "fp8"
    assert "--kv-cache-dtype" not in json.loads((tmp_path / "bf16" / "metadata.json").read_text())[
        "provenance"]["command"]


def test_the_flag_is_one_error_line_where_it_does_not_apply(tmp_path, capsys):
    require_aic()
    code, _, err = run_cli(capsys, "calibrate", "--model", "tiny", "--kv-cache-dtype", "fp8", "--out", tmp_path / "a")
    assert code == 2 and "--kv-cache-dtype goes with --from-kernel-db" in err and "Traceback" not in err
    code, _, err = _calibrate(capsys, tmp_path / "b", "--kv-cache-dtype", "fp4")
    assert code == 2 and "--kv-cache-dtype 'fp4': give auto (the model's dtype) or fp8" in err
    code, _, err = _calibrate(capsys, tmp_path / "c", "--kv-cache-dtype", "fp8", "--draft", "eagle")
    assert code == 2 and "--kv-cache-dtype fp8 prices the target's attention; drop it for --draft" in err
    assert "Traceback" not in err


def test_the_bench_prices_the_kv_dtype_of_the_launch_script_it_replays():
    """InferenceMAX's Llama-3.1-70B scripts set kv-cache-dtype fp8: those rows' dense tables are
    fp8-KV tables (their own key and cache folder) under InferenceMAX's client, and not under the
    fixed-length client (whose scenario keeps the model's KV dtype); other rows are unchanged."""
    from bench.silicon_accuracy import Row, classify, key_kv, moe_part, table_dir

    def row(**kw):
        base = dict(id="r", engine="vllm", version="", model="meta-llama/Llama-3.1-70B", system="h200_sxm",
                    precision="fp8", tp=2, isl=1024, osl=1024, concurrency=8, ttft_ms=100.0, tpot_ms=10.0,
                    source="source_file=2026-04-06.csv; model=Llama-3.1-70B")
        base.update(kw)
        return Row(**base)

    imax, fixed, other = row(), row(client="fixed"), row(model="Qwen/Qwen3-32B", source="x")
    r1 = row(engine="trtllm", model="deepseek-ai/DeepSeek-R1", tp=8, isl=8192, concurrency=64)  # dsr1_fp8_h200_trt.sh
    sgl = row(engine="sglang", model="deepseek-ai/DeepSeek-R1", tp=8)  # dsr1_fp8_h200.sh: the model's KV dtype
    classify([imax, fixed, other, r1, sgl])
    assert imax.table_kv == "fp8" and imax.table_key[7:] == ("kv-fp8",)
    assert table_dir(imax.table_key, "d").name.endswith("-kvfp8") and moe_part(imax.table_key) is None
    assert fixed.table_kv is None and len(fixed.table_key) == 7
    assert other.table_kv is None and len(other.table_key) == 7
    # an MLA / MoE table: the KV dtype between the dense part and the layout, which still parses
    assert r1.moe_path and r1.table_kv == "fp8" and r1.table_key[7:] == ("kv-fp8", "moe", 1, False)
    assert moe_part(r1.table_key) == (1, False, False) and key_kv(r1.table_key) == "fp8"
    assert table_dir(r1.table_key, "d").name == "trtllm-h200-deepseek-ai--DeepSeek-V3-tp8-fp8-block-dp1-kvfp8"
    assert sgl.table_kv is None and moe_part(sgl.table_key) == (1, False, False) and key_kv(sgl.table_key) is None


def test_attention_runs_in_the_kv_caches_precision_not_the_checkpoints():
    """An FP8 checkpoint (Qwen3-235B-A22B-FP8's quantization_config) with a bf16 KV cache runs bf16
    attention; unset, AIConfigurator infers FP8 context attention from the checkpoint, a pairing with
    no rows in SGLang's H200 database (the corpus' 24 SGLang rows of this model were refused for it)."""
    require_aic()
    from calib.sources.kernel_db import KernelDb, resolve_model, with_kv_cache_dtype

    src = resolve_model("Qwen/Qwen3-235B-A22B-FP8")
    db = KernelDb(src, "h200", tp=4, dtype="fp8", engine="sglang")
    assert db.compile_kwargs()["fmha_quant_mode"] == "bfloat16" == db.compile_kwargs()["kvcache_quant_mode"]
    assert sum(op.seconds for op in db.prefill_attn_ops(2048, 0).values()) > 0
    fp8 = KernelDb(with_kv_cache_dtype(src, "fp8"), "h200", tp=4, dtype="fp8", engine="vllm")
    assert "fmha_quant_mode" not in fp8.compile_kwargs()  # an FP8 cache: the database's own lane (vLLM: bf16)
