"""bench/prefill_bounds.py: each prefill operator's hardware floor is its closed form, and the
kernel-db table's lone-prompt step (the operators the bench divides) is the simulator's own price,
with no operator below its floor (issues #26, #29)."""

from __future__ import annotations

import importlib.util

import pytest

from bench.prefill_bounds import op_floors
from sim.errors import CbsimError
from sim.hardware.gpus import get_gpu
from sim.hardware.models import get_model

needs_db = pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None,
    reason="kernel-db tables need the optional extra cbsim[gpu-data]",
)


def _llama8b():
    return get_model("meta-llama/Meta-Llama-3.1-8B")


def test_floors_are_the_closed_forms_for_llama_8b_at_tp2():
    spec, gpu = _llama8b(), get_gpu("h100-sxm")
    f = op_floors(spec, gpu, tp=2, tokens=1024, fp8=False)
    L, m, peak = 32, 1024, 989e12
    # QKV: 16 query heads + 2 x 4 KV heads of 128 on one GPU, K = 4096: compute-bound at M 1,024
    assert f["qkv_gemm"] == pytest.approx(L * 2 * m * (16 + 8) * 128 * 4096 / peak, rel=1e-12)
    assert f["ffn2_gemm"] == pytest.approx(L * 2 * m * 4096 * 7168 / peak, rel=1e-12)
    # causal attention: QK^T and PV over the lower triangle, 16 heads of 128
    assert f["attention"] == pytest.approx(L * 16 * 4 * 128 * (m * (m + 1) / 2) / peak, rel=1e-12)
    # each all-reduce moves M x hidden bf16 values once over NVLink (450 GB/s one way)
    assert f["ar_1"] == pytest.approx(L * m * 4096 * 2 / 450e9, rel=1e-12)
    # the LM head of one sequence reads its weight shard (64,128 x 4,096 bf16) at 3.35 TB/s
    assert f["logits_gemm"] == pytest.approx(64128 * 4096 * 2 / 3.35e12, rel=1e-12)


def test_fp8_uses_the_fp8_peak_and_tp1_has_no_allreduce():
    spec, gpu = _llama8b(), get_gpu("h100-sxm")
    bf16, fp8 = op_floors(spec, gpu, 1, 4096, False), op_floors(spec, gpu, 1, 4096, True)
    assert fp8["gate_ffn1_gemm"] == pytest.approx(bf16["gate_ffn1_gemm"] * 989 / 1979, rel=1e-12)
    assert bf16["ar_1"] == bf16["ar_2"] == 0.0


def test_moe_models_and_bad_sizes_are_refused():
    with pytest.raises(CbsimError, match="dense decoders"):
        op_floors(get_model("openai/gpt-oss-120b"), get_gpu("h100-sxm"), 1, 1024, False)
    with pytest.raises(CbsimError, match="positive"):
        op_floors(_llama8b(), get_gpu("h100-sxm"), 1, 0, False)


@needs_db
@pytest.mark.parametrize("tokens", [1024, 4096])
def test_the_bench_divides_the_tables_own_lone_prompt_step_and_none_is_below_its_floor(tokens):
    """The operators compare() reads add up to what the composed table prices for one prompt alone
    (linear at M = tokens, its context attention, one LM head): the bench judges the simulated clock,
    not a copy of it. And on the H100, Llama-3.1-8B bf16 at TP 2, every one is at or above its floor."""
    from bench.prefill_bounds import compare
    from calib.sources.kernel_db import KernelDb, build_table, resolve_model
    from sim.latency.table import TableLatency

    db = KernelDb(resolve_model("meta-llama/Meta-Llama-3.1-8B"), "h100-sxm", tp=2, dtype="bf16", engine="vllm")
    got = compare(db, tokens)
    table = build_table("meta-llama/Meta-Llama-3.1-8B", "h100-sxm", tp=2, dtype="bf16", engine="vllm")
    latency = TableLatency(table.table, db.spec, get_gpu("h100-sxm"), tensor_parallel=2, block_size=16)
    priced = latency._lin(tokens) + latency._pre(tokens, 0) + latency._seq(1)
    assert sum(t for t, _ in got.values()) == pytest.approx(priced, rel=1e-6)
    ratios = {op: t / f for op, (t, f) in got.items() if f > 0}
    assert {"qkv_gemm", "gate_ffn1_gemm", "attention", "ar_1", "add_norm_1", "logits_gemm"} <= set(ratios)
    assert min(ratios.values()) >= 1.0, ratios


def _line(group, osl, left_ms, tpot_ms=8.0, clients=8, where="inside"):
    return {"group": group, "layout": "tp1", "isl": 1024, "osl": osl, "clients": clients, "left_ms": left_ms,
            "tpot_ms": tpot_ms, "where": where}


def test_a_queue_of_m_slots_is_read_back_from_the_growth_with_the_output():
    """A closed loop of N clients with M running slots waits (N / M - 1) x E2E: a left that grows by
    (N / M - 1) x TPOT per output token gives M back; one that is flat in the output gives none."""
    from bench.prefill_bounds import left_lines

    n, m, tpot = 8, 6, 8.0
    queue = [_line("q", o, 40.0 + (n / m - 1) * tpot * o, tpot) for o in (128, 256, 512)]
    flat = [_line("f", o, 50.0, tpot, where="above") for o in (128, 256, 512)]
    lines = {ln["group"]: ln for ln in left_lines(queue + flat, None)}
    assert lines["q"]["slots"] == pytest.approx(m, rel=1e-9)
    assert lines["q"]["slope"] == pytest.approx((n / m - 1) * tpot, rel=1e-9)
    assert lines["f"]["slots"] is None and lines["f"]["where"] == (0, 0, 3)


def test_left_keeps_each_groups_lowest_client_count_or_the_one_asked():
    from bench.prefill_bounds import left_lines

    rows = [_line("g", 128, 10.0, clients=8), _line("g", 128, 99.0, clients=16), _line("h", 128, 5.0, clients=4)]
    assert {(ln["group"], ln["clients"]) for ln in left_lines(rows, None)} == {("g", 8), ("h", 4)}
    assert [ln["left"] for ln in left_lines(rows, 16)] == [{128: 99.0}]


def test_left_refuses_a_report_of_another_phase(tmp_path):
    import json

    from bench.prefill_bounds import left_over

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"phase": "random", "rows": []}))
    with pytest.raises(CbsimError, match="--phase opening"):
        left_over([path])


def test_slots_short_runs_k_requests_fewer_than_the_clients():
    """bench/silicon_accuracy.py --slots-short K: the sensitivity the TensorRT-LLM 8B rows' queue asks
    for sets the engine's running limit to clients - K (never below one), and nothing without it."""
    from bench.silicon_accuracy import Row, scenario_of

    row = Row(id="r", engine="trtllm", version="", model="m", system="h100_sxm", precision="", tp=1, isl=1024,
              osl=128, concurrency=8, ttft_ms=1.0, tpot_ms=1.0, gpu="h100-sxm", config="c", policy="trtllm")
    assert "max_num_seqs" not in scenario_of(row, "t", 4)["engine"]
    row.slots_short = 1
    assert scenario_of(row, "t", 4)["engine"]["max_num_seqs"] == 7
    row.slots_short = 20
    assert scenario_of(row, "t", 4)["engine"]["max_num_seqs"] == 1


def test_wave_lines_take_each_client_counts_median_over_the_output_lengths():
    """bench/prefill_bounds.py --waves: one line per group, layout and prompt length; per column and
    client count the median of the rows' ratios over the output lengths (the upper of two, as
    ``--left``); a column a report lacks (None) is left out of that row's medians, not counted as zero."""
    from bench.prefill_bounds import wave_lines

    def row(osl, clients, wave, warm, phase, isl=1024):
        return {"group": "g", "layout": "tp1", "isl": isl, "osl": osl, "clients": clients,
                "ratio": {"wave": wave, "warm": warm, "phase": phase}}

    rows = [row(128, 8, 0.9, 1.6, 3.0), row(256, 8, 1.1, None, 2.0), row(512, 8, 1.0, 1.8, 2.5),
            row(128, 16, 0.5, 1.7, 2.9), row(128, 8, 0.4, 0.3, 0.2, isl=4096)]
    lines = wave_lines(rows)
    assert [(ln["isl"], ln["ratio"]) for ln in lines] == [
        (1024, {"wave": {8: 1.0, 16: 0.5}, "warm": {8: 1.8, 16: 1.7}, "phase": {8: 2.5, 16: 2.9}}),
        (4096, {"wave": {8: 0.4}, "warm": {8: 0.3}, "phase": {8: 0.2}}),
    ]


@needs_db
def test_wave_ratios_divide_the_measured_ttft_by_each_simulated_one(tmp_path):
    """A report row's measured TTFT over its ``first_round``, ``warm_steady`` and own-phase TTFT, its
    lengths and clients read from the corpus by id; a row without a ``warm_steady`` gets None there."""
    import json

    import bench.silicon_accuracy as sa
    from bench.prefill_bounds import wave_ratios

    meta = next(r for r in sa.read_rows() if r.id.endswith("_1024x128_c8_tp1_epnone_1") and r.engine == "trtllm")
    rows = [{"id": meta.id, "group": "g", "layout": "tp1", "ttft_ms": 300.0, "sim_ttft_ms": 100.0,
             "extra": {"first_round": {"ttft_ms": 300.0}, "warm_steady": {"ttft_ms": 150.0}}},
            {"id": meta.id, "group": "g", "layout": "tp1", "ttft_ms": 300.0, "sim_ttft_ms": 120.0,
             "extra": {"first_round": {"ttft_ms": 250.0}}},
            {"id": "not-in-the-corpus", "group": "g", "ttft_ms": 1.0, "sim_ttft_ms": 1.0}]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"phase": "random", "rows": rows}))
    got = wave_ratios([path])
    assert [(r["isl"], r["osl"], r["clients"], r["ratio"]) for r in got] == [
        (1024, 128, 8, {"wave": 1.0, "warm": 2.0, "phase": 3.0}),
        (1024, 128, 8, {"wave": 1.2, "warm": None, "phase": 2.5}),
    ]
