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
def test_kernel_db_table_predicts_the_rtx_pro_6000_run_within_10_percent(tmp_path):
    """The kernel-db table (aiconfigurator-core 0.12.0, vLLM 0.24.0 kernels, nothing fitted on the run)
    on the RTX PRO 6000 run. It missed by TTFT -19.9 % until FA2's mixed-step rule priced every decode
    beside a prefill chunk at one KV pass per query head (calib/sources/kernel_db.py,
    decode_attn_mixed_ops; issue 26): TTFT +6.6 %, TPOT +2.7 %, E2E +3.6 %; since the decode attention's DRAM
    floor streams at the database's own rate (KernelDb.kv_stream_rate) TTFT +5.0 %, TPOT +1.9 %, E2E +2.7 %."""
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
@pytest.mark.parametrize("bundle", ["rtxpro6000-llama-3.1-8b", "rtx4090-llama-3.1-8b"])
def test_fa2_mixed_decodes_cost_one_kv_pass_per_query_head_as_the_bundles_measured(bundle):
    """The evidence behind the mixed-step rule, from the kernels alone (never the served runs): in
    both LLMServingSim bundles, the attention of a 1,024-token chunk plus n decodes, less the chunk
    alone, is 3.3-4.7 passes of the decodes' KV cache at the GPU's datasheet DRAM bandwidth for 16-64
    decodes (4 query heads per KV head: the rule prices 4); and several times what the decodes cost alone."""
    import csv

    from calib.sources.kernel_db import KernelDb, resolve_model
    from sim.hardware.gpus import get_gpu

    gpu = {"rtxpro6000-llama-3.1-8b": "rtx-pro-6000", "rtx4090-llama-3.1-8b": "rtx-4090"}[bundle]
    with (run_dir(bundle) / "profile" / "tp1" / "attention.csv").open() as f:
        t = {(int(r["prefill_chunk"]), int(r["kv_prefill"]), int(r["n_decode"]), int(r["kv_decode"])):
             float(r["time_us"]) * 1e-6 for r in csv.DictReader(f)}
    # the bundle profiles one layer with 16 query and 4 KV heads: 4 KV heads x 128 x (K, V) x 2 bytes
    kv_bytes_per_token = 4 * 128 * 2 * 2
    bw = get_gpu(gpu).hbm_bandwidth
    for n, c in ((16, 2048), (16, 8192), (64, 2048), (64, 8192)):
        extra = t[(1024, 0, n, c)] - t[(1024, 0, 0, 0)]
        passes = extra / (n * c * kv_bytes_per_token / bw)
        assert 3.0 < passes < 5.0, (bundle, n, c, passes)
    if gpu == "rtx-pro-6000":  # the same rule in the composed table of the database's own GPU
        db = KernelDb(resolve_model("llama-3-8b"), gpu, tp=1)
        ops = db.decode_attn_mixed_ops(64, 2048)
        assert "kv_reread_per_query_head" in ops
        mixed = sum(op.seconds for op in ops.values())
        assert mixed == pytest.approx(4 * db.kv_reread_seconds(64, 2049), rel=1e-9)
        assert mixed > 3 * sum(op.seconds for op in db.decode_attn_ops(64, 2048).values())


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
