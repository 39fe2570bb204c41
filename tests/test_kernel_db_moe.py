"""Kernel-database tables for MLA/MoE models in wide-EP and attention-DP layouts
(calib/sources/kernel_db_moe.py), and tables refusing a layout they were not made for (issue #27
item 6, sim/latency/table.py check_compatible)."""

from __future__ import annotations

import json

import pytest

from sim.errors import CbsimError
from sim.scenario.resolved import resolve
from sim.scenario.schema import load_scenario
from tests.helpers import require_aic

DSV3 = "deepseek-ai/DeepSeek-V3"
SGLANG = "0.5.14"  # the h200_sxm SGLang measurements in aiconfigurator-core 0.12.0


def _grids():
    from calib.sources.kernel_db import Grids

    return Grids(
        tokens=(1, 64, 512, 1024),
        sequences=(1, 8, 64),
        chunk_tokens=(64, 1024),
        context=(0, 1024),
        batch=(1, 8, 64),
        mean_context=(1, 1024),
    )


def _db(layout):
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import MoeKernelDb

    return MoeKernelDb(
        resolve_model(DSV3), "h200", layout, dtype="fp8", engine="sglang", engine_version=SGLANG
    )


@pytest.fixture(scope="module")
def dp8():
    require_aic()
    from calib.sources.kernel_db import compose
    from calib.sources.kernel_db_moe import Layout

    return compose(_db(Layout(1, 8, True)), _grids(), block_size=64)


def test_the_layout_is_what_aiconfigurator_compiles():
    from calib.sources.kernel_db_moe import Layout

    wide = Layout(tensor_parallel=1, data_parallel=8, expert_parallel=True)
    assert (wide.moe_ep, wide.moe_tp, wide.gpus) == (8, 1, 8)
    tp_moe = Layout(tensor_parallel=2, data_parallel=4)  # vLLM DP without EP: one 8-way TP group for the MoE
    assert (tp_moe.moe_ep, tp_moe.moe_tp) == (1, 8)
    assert wide.to_metadata() == {"data_parallel": 8, "expert_parallel": 8, "moe_tensor_parallel": 1}
    with pytest.raises(CbsimError, match="--data-parallel must be a positive integer"):
        Layout(1, 0)


def test_dispatch_and_combine_come_from_the_communication_rows(dp8):
    ops = dp8.ops["linear"][(1024,)]
    assert {"moe_pre_dispatch", "moe_post_dispatch", "moe", "mla_block"} - set(ops) == {"mla_block"}
    assert ops["moe_pre_dispatch"].source == "silicon" and ops["moe_pre_dispatch"].seconds > 0
    assert ops["moe"].source == "silicon"
    # MLA's block is attention: priced per chunk and context, never inside linear(T)
    assert (
        "mla_block" in dp8.ops["prefill_attn"][(1024, 1024)]
        and "mla_block" in dp8.ops["decode_attn"][(8, 1024)]
    )


def test_dp_ranks_step_together_their_moe_sees_every_ranks_tokens(dp8):
    """With 8 attention-DP ranks of T tokens each, the experts run 8·T tokens: the same expert-parallel
    MoE as a tensor-parallel-8 engine running 8·T tokens itself."""
    from calib.sources.kernel_db_moe import Layout

    tp8 = _db(Layout(8, 1, True))
    for t in (64, 128):
        assert dp8.db.linear_ops(t)["moe"].seconds == pytest.approx(
            tp8.linear_ops(8 * t)["moe"].seconds, rel=1e-9
        )


def test_mla_prefill_costs_more_over_a_cached_prefix(dp8):
    pf = dp8.ops["prefill_attn"]
    assert pf[(1024, 1024)]["mla_block"].seconds > pf[(1024, 0)]["mla_block"].seconds


def test_the_table_agrees_with_aiconfigurators_own_predictions(dp8):
    from calib.sources.kernel_db import agreement

    err = agreement(dp8)
    assert err["mean_abs_rel"] < 0.10, err


def _table_scenario(path, dp, ep, tp=1):
    return load_scenario(
        {
            "model": DSV3,
            "hardware": {
                "gpu": "h200",
                "tensor_parallel": tp,
                "data_parallel": dp,
                "expert_parallel": ep,
                "gpu_memory_utilization": 0.9,
            },
            "engine": {"block_size": 64, "max_model_len": 4096},
            "latency": {"backend": "table", "path": str(path)},
            "workload": {"num_requests": 1, "arrival": {"rate": 1.0}},
        }
    )


def test_a_table_refuses_a_layout_it_was_not_made_for(dp8, tmp_path):
    from calib.sources.kernel_db_moe import Layout
    from sim.latency.table_format import read_table, write_table

    dp8.table.metadata["parallel"] = Layout(1, 8, True).to_metadata()
    write_table(tmp_path / "wide", dp8.table)
    lat = resolve(_table_scenario(tmp_path / "wide", 8, True)).latency()  # made for it: accepted
    assert lat.model.is_mla
    with pytest.raises(CbsimError) as info:  # the same table for 16 DP ranks over 16 expert-parallel GPUs
        resolve(_table_scenario(tmp_path / "wide", 16, True)).latency()
    msg = str(info.value)
    assert (
        "made for data_parallel 8, experts over 8 expert-parallel GPUs, but the scenario runs data_parallel 16, "
        "experts over 16 expert-parallel GPUs"
        in msg
        and "\n" not in msg
    )
    assert (
        "--from-kernel-db --gpu GPU --model deepseek-ai/DeepSeek-V3 --tp 1 --data-parallel 16 --expert-parallel "
        "--out DIR" in msg
    )
    # a table without `parallel` metadata (every table made before) is the plain TP layout
    meta = json.loads((tmp_path / "wide" / "metadata.json").read_text())
    del meta["parallel"]
    (tmp_path / "wide" / "metadata.json").write_text(json.dumps(meta))
    assert "parallel" not in read_table(tmp_path / "wide").metadata
    with pytest.raises(CbsimError, match="made for data_parallel 1, experts TP-sharded, no all-to-all"):
        resolve(_table_scenario(tmp_path / "wide", 8, True)).latency()


def test_bad_parallel_metadata_is_one_error(dp8, tmp_path):
    from sim.latency.table_format import read_table, write_table

    write_table(tmp_path / "t", dp8.table)
    meta = json.loads((tmp_path / "t" / "metadata.json").read_text())
    meta["parallel"] = {"data_parallel": 0}
    (tmp_path / "t" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CbsimError, match="parallel.data_parallel must be a positive integer, got 0"):
        read_table(tmp_path / "t")


def test_cli_composes_a_wide_ep_table_and_says_its_layout(tmp_path):
    require_aic()
    from typer.testing import CliRunner

    from sim.cli.main import app

    out = tmp_path / "t"
    res = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--from-kernel-db",
            "--gpu",
            "h200",
            "--model",
            DSV3,
            "--engine",
            "sglang",
            "--tp",
            "1",
            "--data-parallel",
            "8",
            "--expert-parallel",
            "--max-num-batched-tokens",
            "2048",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "64",
            "--block-size",
            "64",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "data_parallel 8, expert_parallel 8" in " ".join(res.output.split())
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["parallel"] == {"data_parallel": 8, "expert_parallel": 8, "moe_tensor_parallel": 1}
    assert "mla_block" in meta["provenance"]["modelled"]
    res = CliRunner().invoke(
        app, ["calibrate", "--data-parallel", "2", "--model", "tiny", "--out", str(tmp_path / "x")]
    )
    assert "--data-parallel and --expert-parallel go with --from-kernel-db" in str(res.exception)


def test_layouts_a_model_cannot_have_are_one_error():
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import Layout, MoeKernelDb

    with pytest.raises(CbsimError, match="--expert-parallel needs a mixture-of-experts model"):
        MoeKernelDb(resolve_model("llama-3-8b"), "h200", Layout(1, 2, True))
    with pytest.raises(CbsimError, match="data-parallel ranks of a dense model .* are independent engines"):
        MoeKernelDb(resolve_model("llama-3-8b"), "h200", Layout(1, 2, False))
    with pytest.raises(CbsimError, match="do not divide its 256 experts"):
        MoeKernelDb(resolve_model(DSV3), "h200", Layout(1, 3, True))


def test_the_experts_share_of_linear_is_the_routed_operators(dp8):
    """Under attention DP, ``moe_group(T)`` is the part of linear(T) that runs over every rank's tokens:
    SGLang with expert-parallel experts runs its shared experts first (no overlap), so it is exactly
    AIConfigurator's routed operators at T (moe_pre_dispatch + moe + moe_post_dispatch, its moe
    priced at 8·T tokens), and the rest of linear(T) is the operators every rank runs on its own T."""
    from calib.sources.kernel_db_moe import ROUTED_OPS, add_moe_group

    add_moe_group(dp8)
    lin, group = dp8.table.components["linear"], dp8.table.components["moe_group"]
    assert lin.axes == group.axes and group.values[0] == 0.0
    for t, total, share in zip(lin.axes[0][1:], lin.values[1:], group.values[1:]):
        ops = dp8.ops["linear"][(int(t),)]
        assert share == pytest.approx(sum(ops[n].seconds for n in ROUTED_OPS), rel=1e-9)
        assert 0.5 * total < share < total  # the experts are most of a DeepSeek step's linear part


def test_a_trtllm_dp_table_carries_the_experts_share_within_linear(tmp_path):
    """TensorRT-LLM overlaps the shared experts with the routed ones (up to 1024 tokens: linear(T) holds
    the slower group): the share is linear(T) less the per-rank operators, never negative, never above
    linear(T); the table folder keeps it and the table backend reads it back."""
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import ROUTED_OPS, Layout, compose_source
    from sim.latency.table_format import read_table, write_table

    comp = compose_source(resolve_model(DSV3), "h200", Layout(1, 8, True), dtype="fp8", engine="trtllm",
                          block_size=64, max_num_batched_tokens=2048, max_model_len=2048, max_num_seqs=8)
    lin, group = comp.table.components["linear"], comp.table.components["moe_group"]
    assert group.values[0] == 0.0
    for t, total, share in zip(lin.axes[0][1:], lin.values[1:], group.values[1:]):
        own = sum(op.seconds for n, op in comp.db.context_linear_ops(int(t)).items() if n not in ROUTED_OPS)
        assert share == pytest.approx(total - own, rel=1e-9) and 0 < share < total
    # at 4 tokens a rank the routed group (the experts over 32 tokens) outlasts the shared experts
    assert group.values[list(lin.axes[0]).index(4.0)] > 0.8 * lin.values[list(lin.axes[0]).index(4.0)]
    assert "moe_group" in json.dumps(comp.table.metadata["provenance"])
    back = read_table(write_table(tmp_path / "t", comp.table))
    assert list(back.components["moe_group"].values) == pytest.approx(list(group.values))
    # a table without attention DP has no such term: its groups are single engines
    tp8 = compose_source(resolve_model(DSV3), "h200", Layout(8, 1, True), dtype="fp8", engine="trtllm",
                         block_size=64, max_num_batched_tokens=2048, max_model_len=2048, max_num_seqs=8)
    assert "moe_group" not in tp8.table.components


def _moe_row(engine: str, version: str, tokens: int, ep: int) -> float:
    """The database's own ``moe`` row (ms) of DeepSeek-V3's experts (7168 x 2048, 256 experts, top 8,
    FP8 block scales, power law 1.01 as AIConfigurator routes DeepSeek) at ``tokens`` tokens, EP ``ep``."""
    import importlib.resources as res

    import pyarrow.parquet as pq

    path = res.files("aiconfigurator_core") / "systems" / "data" / "h200_sxm" / "moe" / engine / version
    rows = pq.read_table(str(path / "moe_perf.parquet")).to_pylist()
    hit = [r["latency"] for r in rows if (r["hidden_size"], r["inter_size"], r["num_experts"], r["topk"]) ==
           (7168, 2048, 256, 8) and r["moe_dtype"] == "fp8_block" and r["num_tokens"] == tokens
           and (r["moe_tp_size"], r["moe_ep_size"]) == (1, ep) and r["distribution"] == "power_law_1.01"]
    assert len(hit) == 1, hit
    return hit[0]


def test_the_first_dense_layers_run_a_dense_ffn_not_the_moe_block():
    """DeepSeek-V3's first 3 of 61 layers have a dense FFN (first_k_dense_replace); AIConfigurator's
    DeepSeek model prices the MoE block over all 61. The routed experts are the database's moe row
    times 58 layers, every MoE-block operator 58/61 of AIConfigurator's, and the 3 dense FFNs (gate/up
    7168 -> 2 x 18432 / tp, down 18432 / tp -> 7168) cost at least their weights streamed from HBM."""
    require_aic()
    from calib.sources.kernel_db import KernelDb, resolve_model
    from calib.sources.kernel_db_moe import MOE_BLOCK_OPS, Layout, MoeKernelDb

    for layout, mlp_tp in ((Layout(8, 1, True), 8), (Layout(1, 8, True), 1)):
        db = MoeKernelDb(resolve_model(DSV3), "h200", layout, dtype="fp8", engine="trtllm")
        assert (db.dense_layers, db.dense_mlp_tp()) == (3, mlp_tp)
        t = 64 if layout.data_parallel == 1 else 8  # the experts see 64 tokens either way
        ops, aic = db.context_linear_ops(t), KernelDb.linear_ops(db, t)
        assert ops["moe"].seconds == pytest.approx(58 * _moe_row("trtllm", db.engine_version, 64, 8) * 1e-3, rel=2e-3)
        for name in set(aic) & set(MOE_BLOCK_OPS):
            assert ops[name].seconds == pytest.approx(aic[name].seconds * 58 / 61, rel=1e-12)
        bw = float(db.gpu_spec["mem_bw"])  # bytes/s; FP8 weights: 1 byte each
        floor = 3 * 7168 * 18432 // mlp_tp / bw
        assert ops["dense_gate_up_gemm"].seconds > 2 * floor and ops["dense_ffn2_gemm"].seconds > floor
        assert ops["dense_gate_up_gemm"].source == "silicon"
        # the overlapped (generation) list at the same tokens gets the same correction
        gen = db.linear_ops(t)
        aic_gen = db._ops(db.handle.evaluate_generation_ops(db._gen_linear, batch_size=t, s=1))
        assert gen["moe_overlap"].seconds == pytest.approx(aic_gen["moe_overlap"].seconds * 58 / 61, rel=1e-12)
        assert gen["dense_ffn2_gemm"].seconds > floor
    # gpt-oss has no dense layers: nothing changes
    oss = MoeKernelDb(resolve_model("openai/gpt-oss-120b"), "h200", Layout(1, 1, False), engine="vllm")
    assert oss.dense_layers == 0 and oss.context_linear_ops(64) == KernelDb.linear_ops(oss, 64)


def test_trtllm_runs_mxfp4_experts_with_mxfp8_activations_on_blackwell(monkeypatch):
    """TensorRT-LLM quantizes gpt-oss's MoE activations to MXFP8 on Blackwell (its gpt_oss README's
    support matrix), so a B200 TensorRT-LLM table prices the database's ``w4a8_mxfp4_mxfp8`` rows;
    Hopper, and the other engines, keep the checkpoint's bf16 activations (``w4a16_mxfp4``)."""
    require_aic()
    from calib.sources import kernel_db_moe
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import Layout, MoeKernelDb

    oss = resolve_model("openai/gpt-oss-120b")

    def mode(gpu, engine):
        return MoeKernelDb(oss, gpu, Layout(), engine=engine).compile_kwargs()["moe_quant_mode"]

    assert mode("b200", "trtllm") == "w4a8_mxfp4_mxfp8"
    assert mode("h200", "trtllm") == "w4a16_mxfp4"
    assert mode("b200", "vllm") == "w4a16_mxfp4"

    def experts_s(db, tokens):
        return sum(op.seconds for name, op in db.linear_ops(tokens).items() if "moe" in name)

    mxfp8 = MoeKernelDb(oss, "b200", Layout(), engine="trtllm")
    monkeypatch.setattr(kernel_db_moe, "_is_blackwell", lambda system: False)
    bf16 = MoeKernelDb(oss, "b200", Layout(), engine="trtllm")
    assert bf16.compile_kwargs()["moe_quant_mode"] == "w4a16_mxfp4"
    # the database's own rows: the MXFP8 kernels are several times faster from decode to prefill sizes
    for tokens in (4, 256, 4096):
        assert experts_s(mxfp8, tokens) < 0.6 * experts_s(bf16, tokens), tokens


def test_a_table_of_mxfp8_experts_says_so_in_its_provenance():
    """The table prices other rows than the checkpoint's label names (and than AIConfigurator's own
    predictor, so its agreement cannot show it): its metadata says which."""
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import Layout, compose_source

    oss = resolve_model("openai/gpt-oss-120b")
    kw = dict(max_num_batched_tokens=512, max_model_len=1024, max_num_seqs=8)
    notes = json.dumps(compose_source(oss, "b200", Layout(), engine="trtllm", **kw).table.metadata["provenance"])
    assert "w4a8_mxfp4_mxfp8" in notes and "MXFP8 activations" in notes
    hopper = json.dumps(compose_source(oss, "h200", Layout(), engine="trtllm", **kw).table.metadata["provenance"])
    assert "w4a8_mxfp4_mxfp8" not in hopper


def test_a_gpu_whose_data_lacks_a_table_is_one_error_naming_the_remedy():
    """The A100's vLLM rows have no sliding-window context attention: gpt-oss cannot be priced
    there, and the command says so in one line instead of a traceback from the database."""
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import Layout, MoeKernelDb

    with pytest.raises(CbsimError, match=r"a100_sxm in vllm .*context attention data missing.*choose another --gpu"):
        MoeKernelDb(resolve_model("openai/gpt-oss-120b"), "a100-80gb", Layout(), engine="vllm")
