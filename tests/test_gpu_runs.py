"""cbsim's clock against real GPU runs it never saw (../shared/reference/gpu-runs/): two vLLM 0.19 serving
runs of Llama-3.1-8B (RTX 4090, RTX PRO 6000), predicted with a table built from published kernel
measurements only, nothing fitted on the runs. The same commands a user runs:

    cbsim calibrate --from-llmservingsim RUN/profile --out TABLE
    cbsim validate --against RUN --table TABLE [--gpu GPU]

Bound: TTFT mean, TPOT mean and E2E mean each within 10 % (issue 17). The RTX 4090 run fills its
KV cache (2,588 blocks) and preempts; the vllm-v1 policy on the run's own engine config (block 16,
token budget 2048, prefix caching, chunked prefill, async scheduling) must reproduce that.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import require_shared

pytestmark = pytest.mark.shared

BOUND = 0.10
RUNS = {  # run folder -> cbsim GPU id (the RTX PRO 6000 run does not record its device)
    "rtx4090-llama-3.1-8b": None,
    "rtxpro6000-llama-3.1-8b": "rtx-pro-6000",
}


def run_dir(name):
    return require_shared(f"gpu-runs/{name}")


@pytest.fixture(scope="module")
def bundle_results(tmp_path_factory):
    from calib.sources.llmservingsim import calibrate_from_bundle
    from sim.recorded.validate_against import validate_against

    out = {}
    for name, gpu in RUNS.items():
        folder = run_dir(name)
        table = tmp_path_factory.mktemp(name) / "table"
        calibrate_from_bundle(folder / "profile", table)
        out[name] = validate_against(folder, table, gpu)
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_bundle_table_predicts_the_run_within_10_percent(bundle_results, name):
    err = bundle_results[name]["error"]
    for key in ("ttft_mean", "tpot_mean", "e2e_mean"):
        assert abs(err[key]) <= BOUND, (name, key, err[key], bundle_results[name]["real"][key],
                                        bundle_results[name]["sim"][key])


def test_rtx4090_run_fills_its_kv_cache_and_preempts(bundle_results):
    res = bundle_results["rtx4090-llama-3.1-8b"]
    assert res["diagnostics"]["kv_blocks"] == 2587  # vLLM's 2,588 minus its null block
    assert res["sim"]["preemptions"] > 0
    assert res["assumed"] == []  # the run's resolved_config set every engine setting


def test_rtx_pro_6000_run_takes_vllms_defaults_and_computes_kv_from_memory(bundle_results):
    res = bundle_results["rtxpro6000-llama-3.1-8b"]
    notes = " ".join(res["assumed"])
    assert "enable_prefix_caching = True" in notes and "async_scheduling = True" in notes
    assert "num_gpu_blocks computed from GPU memory" in notes
    assert res["sim"]["preemptions"] == 0  # the cache never fills, as in the run


def test_bundle_table_records_what_was_modelled(tmp_path):
    import json

    from calib.sources.llmservingsim import calibrate_from_bundle

    table = tmp_path / "t"
    calibrate_from_bundle(run_dir("rtxpro6000-llama-3.1-8b") / "profile", table)
    meta = json.loads((table / "metadata.json").read_text())
    assert meta["source"] == "llmservingsim" and meta["engine"]["version"] == "0.19.0"
    assert meta["engine"]["measured_with"]["enforce_eager"] is True
    assert meta["decode_skew_alpha"] == pytest.approx(0.0543)
    modelled = " ".join(meta["fit"]["modelled"])
    assert "enforce_eager" in modelled and "engine_cpu" in modelled


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                    reason="the kernel database is the optional extra cbsim[gpu-data]")
@pytest.mark.xfail(strict=True, reason=(
    "kernel-db table (aiconfigurator-core 0.12.0, vLLM 0.24.0 kernels, nothing fitted) on the RTX PRO 6000 "
    "run: TTFT -19.9 %, TPOT -8.2 %, E2E -11.2 % (before the DRAM floor and the FA2 mixed-step term: -24.5 / "
    "-10.2 / -13.8 %). Still missing: decodes beside a prefill chunk cost 1.4-2.3x more in the bundle than "
    "FA2's unpacked-tile model gives (L2 re-reads of each KV head by its 4 query heads, empty query tiles: "
    "no database row measures either), and decode skew (the bundle's alpha 0.054 alone moves TTFT by 10 "
    "points; the database has one context per batch). Ablation: bench/ablate_tables.py (both terms from the "
    "bundle: +0.6 %), bench/compare_tables.py. The RTX "
    "4090 is not in the database."))
def test_kernel_db_table_predicts_the_rtx_pro_6000_run_within_10_percent(tmp_path):
    from calib.sources.kernel_db import build_table
    from sim.latency.table_format import write_table
    from sim.recorded.validate_against import validate_against

    comp = build_table("llama-3-8b", "rtx-pro-6000", tp=1, dtype="bf16", engine="vllm", engine_version=None,
                       block_size=16)
    table = write_table(tmp_path / "kdb", comp.table)
    res = validate_against(run_dir("rtxpro6000-llama-3.1-8b"), table, "rtx-pro-6000")
    for key in ("ttft_mean", "tpot_mean", "e2e_mean"):
        assert abs(res["error"][key]) <= BOUND, (key, res["error"][key])


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                    reason="the kernel database is the optional extra cbsim[gpu-data]")
def test_the_kernel_db_gap_is_the_two_terms_the_database_does_not_measure(tmp_path):
    """The evidence behind the strict xfail above (bench/ablate_tables.py): the kernel-db table with the
    bundle's mixed-step decodes and skew factor put in, and nothing else changed, predicts the run
    within 10 %; with neither it misses."""
    from bench.ablate_tables import swapped
    from calib.sources.kernel_db import build_table
    from calib.sources.llmservingsim import calibrate_from_bundle
    from sim.latency.table_format import write_table
    from sim.recorded.validate_against import validate_against

    folder = run_dir("rtxpro6000-llama-3.1-8b")
    kdb = build_table("llama-3-8b", "rtx-pro-6000", tp=1, dtype="bf16", engine="vllm", engine_version=None,
                      block_size=16).table
    bundle = calibrate_from_bundle(folder / "profile", tmp_path / "bundle")
    both = validate_against(folder, write_table(tmp_path / "both", swapped(kdb, bundle, ["decode_attn_mixed", "skew"])),
                            "rtx-pro-6000")["error"]
    alone = validate_against(folder, write_table(tmp_path / "kdb", kdb), "rtx-pro-6000")["error"]
    assert all(abs(both[k]) <= BOUND for k in ("ttft_mean", "tpot_mean", "e2e_mean")), both
    assert alone["ttft_mean"] < -BOUND, alone


def test_the_user_commands_print_and_write_every_figure(tmp_path):
    import json

    from typer.testing import CliRunner

    from sim.cli.main import app

    folder = run_dir("rtx4090-llama-3.1-8b")
    runner = CliRunner()
    res = runner.invoke(app, ["calibrate", "--from-llmservingsim", str(folder / "profile"), "--out",
                              str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    js = tmp_path / "v.json"
    res = runner.invoke(app, ["validate", "--against", str(folder), "--table", str(tmp_path / "t"), "--json", str(js)])
    assert res.exit_code == 0, res.output
    for label in ("TTFT p50", "TTFT p99", "TPOT p90", "E2E mean", "throughput"):
        assert label in res.output
    data = json.loads(js.read_text())
    assert {"ttft_mean", "tpot_mean", "e2e_mean", "e2e_p90", "throughput"} <= set(data["error"])


def test_bad_bundles_are_one_line_errors(tmp_path):
    import shutil

    from calib.sources.llmservingsim import read_bundle
    from sim.errors import CbsimError

    with pytest.raises(CbsimError, match="no meta.yaml"):
        read_bundle(tmp_path)
    bundle = tmp_path / "b"
    shutil.copytree(run_dir("rtx4090-llama-3.1-8b") / "profile", bundle)
    with pytest.raises(CbsimError, match="no tp2/ folder; this bundle was profiled at tp1"):
        read_bundle(bundle, tp=2)
    (bundle / "tp1" / "dense.csv").write_text("layer,tokens,time\nqkv_proj,1,3\n")
    with pytest.raises(CbsimError, match="dense.csv: the first line must be the header layer,tokens,time_us"):
        read_bundle(bundle)
    (bundle / "tp1" / "dense.csv").write_text("layer,tokens,time_us\nqkv_proj,1,3\n")
    with pytest.raises(CbsimError, match="no rows for operator"):
        read_bundle(bundle)
