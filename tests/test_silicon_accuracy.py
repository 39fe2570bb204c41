"""bench/silicon_accuracy.py's bookkeeping: which corpus rows it prices and why it skips the others,
and the group statistics it prints (the replay itself is the bench's job, not a test's)."""

from __future__ import annotations

import math

import pytest

from tests.helpers import require_aic


@pytest.fixture(autouse=True)
def _corpus_installed():
    """The corpus ships with the optional extra cbsim[gpu-data]: skipped without it, failed on CI."""
    require_aic()


def _row(**kw):
    from bench.silicon_accuracy import Row

    base = dict(id="r", engine="vllm", version="0.12.0", model="meta-llama/Llama-3.1-70B", system="h200_sxm",
                precision="fp8", tp=2, isl=1024, osl=128, concurrency=8, ttft_ms=100.0, tpot_ms=10.0)
    base.update(kw)
    return Row(**base)


def test_rows_are_priced_or_skipped_with_a_reason():
    from bench.silicon_accuracy import classify

    rows = {"ok": _row(), "engine": _row(engine="tgi"), "gpu": _row(system="mi300x"),
            "fp4": _row(precision="fp4"), "model": _row(model="zhipuai/GLM-5"), "blank": _row(precision="",
                                                                                            model="Qwen/Qwen3-32B"),
            "block": _row(model="Qwen/Qwen3-235B-A22B-FP8", tp=4)}
    classify(list(rows.values()))
    assert rows["ok"].skip == "" and rows["ok"].policy == "vllm-v1" and rows["ok"].gpu == "h200"
    assert rows["ok"].config.endswith("meta-llama--Meta-Llama-3.1-70B_config.json")  # the renamed repository
    assert rows["ok"].fp8_scaling == "tensor"
    assert "no cbsim policy" in rows["engine"].skip
    assert "GPU mi300x" in rows["gpu"].skip
    assert rows["fp4"].skip == "precision fp4: cbsim prices bf16 and fp8"
    assert rows["model"].skip.startswith("model zhipuai/GLM-5")
    assert rows["blank"].skip == "" and rows["blank"].precision == "bf16"  # the checkpoint's own dtype
    assert rows["block"].fp8_scaling == "block"  # its config.json has weight_block_size


def test_trtllm_1_0_rows_price_nccl_all_reduces_and_nothing_else_does():
    """--allreduce auto: the TensorRT-LLM 1.0 collection's rows at TP > 1 (docs/trtllm.md); an explicit
    choice applies to every row, and the kernel is part of the table's cache key."""
    from bench.silicon_accuracy import allreduce_of, classify

    trt = dict(engine="trtllm", model="Qwen/Qwen3-32B", system="h100_sxm")
    rows = {"1.0": _row(version="1.0.0rc3", **trt), "tp1": _row(version="1.0.0rc3", tp=1, **trt),
            "1.2": _row(version="1.2.0rc6.post1", **trt), "1.10": _row(version="1.10.0", **trt),
            "vllm": _row()}
    classify(list(rows.values()))
    assert {k: r.allreduce for k, r in rows.items()} == {"1.0": "nccl", "tp1": "custom", "1.2": "custom",
                                                          "1.10": "custom", "vllm": "custom"}
    assert rows["1.0"].table_key[-1] == "nccl" and rows["1.2"].table_key[-1] == "custom"
    assert allreduce_of(rows["vllm"], "nccl") == "nccl" and allreduce_of(rows["1.0"], "custom") == "custom"


def test_layouts_cbsim_does_not_model_are_skipped_from_the_csv_row():
    from types import SimpleNamespace

    from bench.silicon_accuracy import _layout_skip

    def csv(**kw):
        base = dict(mode="agg", pp_size=1.0, attention_dp_size=float("nan"), moe_ep_size=1.0,
                    moe_tp_size=float("nan"))
        base.update(kw)
        return SimpleNamespace(**base)

    assert _layout_skip(csv(), _row()) == ""
    assert "disaggregated" in _layout_skip(csv(mode="disagg"), _row())
    assert "pipeline parallel 2" in _layout_skip(csv(pp_size=2.0), _row())
    # 64 "tp" ranks with the experts 8-way TP x 8-way EP (TRT-LLM's tp_size 64 rows): not one replica
    assert _layout_skip(csv(moe_tp_size=8.0, moe_ep_size=8.0), _row(tp=64)) == (
        "experts both tensor- (8) and expert-parallel (8): not modelled")
    assert "not on the attention's GPUs" in _layout_skip(csv(moe_tp_size=4.0, moe_ep_size=2.0), _row(tp=4))
    # the H200 vLLM Qwen3-235B rows at tp 1 with moe_tp 2: 235B of fp8 weights on 2 GPUs, not one
    assert "moe_tp 2 x moe_ep 1 != tp 1" in _layout_skip(csv(moe_tp_size=2.0), _row(tp=1))


def test_expert_and_attention_data_parallel_layouts_map_to_one_replica():
    """Issue #30: tp attention GPUs per rank, attention_dp ranks, the experts over the same tp x dp GPUs
    expert-parallel (moe_ep = tp x dp) or tensor-parallel (moe_tp = tp x dp, or blank)."""
    from types import SimpleNamespace

    from bench.silicon_accuracy import _layout_skip

    def csv(dp, mtp, ep):
        return SimpleNamespace(mode="agg", pp_size=1.0, attention_dp_size=dp, moe_tp_size=mtp, moe_ep_size=ep)

    cases = [((8.0, 1.0, 8.0), 1, "tp1 dp8 ep8", 8, True), ((1.0, 1.0, 8.0), 8, "tp8 ep8", 1, True),
             ((1.0, 8.0, 1.0), 8, "tp8", 1, False), ((4.0, float("nan"), 1.0), 1, "tp1 dp4", 4, False)]
    for layout, tp, words, dp, ep in cases:
        row = _row(tp=tp)
        assert _layout_skip(csv(*layout), row) == ""
        assert (row.layout, row.data_parallel, row.expert_parallel) == (words, dp, ep)


def test_deepseek_gpt_oss_and_kimi_rows_are_priced_as_their_checkpoints_ship():
    """MLA and 4-bit-expert rows take the kernel_db_moe path (their own table key, FlashMLA's blocks);
    gpt-oss's fp4 and Kimi-K2.5's int4 rows are the shipped MXFP4 / INT4 experts; a dense row keeps the
    dense path's key and scenario."""
    from bench.silicon_accuracy import MLA_BLOCK_SIZE, _scenario, classify, code_hash, scenario_of, table_dir

    rows = {"r1": _row(engine="sglang", model="deepseek-ai/DeepSeek-R1", tp=8),
            "ep": _row(engine="trtllm", model="deepseek-ai/DeepSeek-V3", tp=1, isl=8192, concurrency=64,
                       data_parallel=8, expert_parallel=True),
            "oss": _row(model="openai/gpt-oss-120b", precision="fp4", tp=2),
            "oss8": _row(engine="trtllm", model="openai/gpt-oss-120b", precision="fp8", tp=2),
            "kimi": _row(model="moonshotai/Kimi-K2.5", precision="int4", tp=8),
            "nvfp4": _row(engine="sglang", model="deepseek-ai/DeepSeek-R1", precision="fp4", tp=8),
            "dense_dp": _row(data_parallel=2), "dense": _row()}
    classify(list(rows.values()))
    r1, ep, oss = rows["r1"], rows["ep"], rows["oss"]
    assert r1.skip == "" and r1.moe_path and r1.mla and r1.config_name == "deepseek-ai/DeepSeek-V3"
    assert r1.table_key == ("h200", "deepseek-ai/DeepSeek-V3", 8, "fp8", "sglang", "block", "custom",
                            "moe", 1, False)
    assert oss.skip == "" and oss.precision == "bf16" and oss.moe_path and not oss.mla
    assert rows["kimi"].skip == "" and rows["kimi"].precision == "bf16" and rows["kimi"].mla
    assert rows["oss8"].skip == ("precision fp8: openai/gpt-oss-120b ships mxfp4 experts (priced as shipped, "
                                 "precision fp4)")
    assert rows["nvfp4"].skip == "precision fp4: cbsim prices bf16 and fp8"
    assert "dense model" in rows["dense_dp"].skip
    dense = rows["dense"]
    assert not dense.moe_path and len(dense.table_key) == 7  # the dense tables' key and cache, unchanged
    assert code_hash(moe=True) != code_hash()
    assert table_dir(ep.table_key, "d").name == "trtllm-h200-deepseek-ai--DeepSeek-V3-tp1-fp8-block-dp8-ep"
    hw = scenario_of(ep, "t", 4)
    assert hw["hardware"] == {"gpu": "h200", "tensor_parallel": 1, "count": 8, "data_parallel": 8,
                              "expert_parallel": True}
    assert hw["engine"]["block_size"] == MLA_BLOCK_SIZE
    assert hw["engine"]["max_num_batched_tokens"] == 8192 + 64  # one prompt beside the other clients
    assert "block_size" not in scenario_of(oss, "t", 4)["engine"]
    sc = scenario_of(dense, "t", 4)
    assert sc["engine"].pop("async_scheduling") is False  # vLLM 0.12.0 without the flag: vllm_async_scheduling
    assert sc == _scenario(dense, "t", 4)


def test_vllm_rows_schedule_asynchronously_as_their_servers_were_launched():
    """vLLM made async scheduling its default in 0.14 (PR #27614): a 0.12.0 server launched without
    --async-scheduling (AIConfigurator's gap-analysis rows) steps synchronously, GPU time plus the
    engine's CPU time; InferenceMAX's scripts set async-scheduling: true whatever the image; a row of
    0.14 or later, or of no stated version, keeps cbsim's default. ``--vllm-async always`` restores
    the default everywhere, and engines other than vLLM are left alone."""
    from bench.silicon_accuracy import parser, scenario_of, vllm_async_scheduling

    gap = _row(model="Qwen/Qwen3-32B", source="source_file=/x/aic-auto-gap-analysis/data/h100_sxm/vllm/0.12.0/q.csv")
    imax = _row(version="", isl=1024, osl=1024, source="source_file=2026-04-06.csv; model=Llama-3.1-70B")
    assert not vllm_async_scheduling(gap)
    assert scenario_of(gap, "t", 4)["engine"]["async_scheduling"] is False
    for row in (imax, _row(version="0.14.0"), _row(version="0.16.0"), _row(version=""),
                _row(version="0.12.0", isl=1024, osl=1024, source="source_file=2025-12-08.csv")):
        assert vllm_async_scheduling(row), row
        assert "async_scheduling" not in scenario_of(row, "t", 4)["engine"]
    assert not vllm_async_scheduling(_row(version="0.13.0")) and vllm_async_scheduling(_row(version="0.14.1"))
    gap.vllm_async = "always"
    assert vllm_async_scheduling(gap) and "async_scheduling" not in scenario_of(gap, "t", 4)["engine"]
    trt = _row(engine="trtllm", policy="trtllm", version="0.12.0")
    assert "async_scheduling" not in scenario_of(trt, "t", 4)["engine"]
    assert parser().parse_args([]).vllm_async == "version"
    assert parser().parse_args(["--vllm-async", "always"]).vllm_async == "always"


def test_the_asynchronous_vllm_rows_admit_a_request_a_step_late_as_their_servers_did():
    """By default (``--vllm-async-admission on``) the vLLM rows whose server scheduled asynchronously
    run vllm-v1's async_admission; synchronous rows and other engines are left alone, and ``off``
    (``row.vllm_async_admission`` False) is cbsim's own default everywhere, the comparison."""
    from bench.silicon_accuracy import parser, scenario_of

    sync = _row(model="Qwen/Qwen3-32B", source="source_file=/x/aic-auto-gap-analysis/data/h100_sxm/vllm/0.12.0/q.csv",
                policy="vllm-v1")
    asyn = _row(version="0.14.0", policy="vllm-v1")
    trt = _row(engine="trtllm", policy="trtllm", version="1.2.0")
    assert scenario_of(asyn, "t", 4)["policies"][0] == {"name": "vllm-v1", "async_admission": True}
    assert "async_admission" not in scenario_of(sync, "t", 4)["policies"][0]
    assert "async_admission" not in scenario_of(trt, "t", 4)["policies"][0]
    for r in (sync, asyn, trt):
        r.vllm_async_admission = False
    assert all("async_admission" not in scenario_of(r, "t", 4)["policies"][0] for r in (sync, asyn, trt))
    assert parser().parse_args([]).vllm_async_admission == "on"
    assert parser().parse_args(["--vllm-async-admission", "off"]).vllm_async_admission == "off"


def test_group_statistics_are_median_and_p90_of_the_absolute_error():
    from bench.silicon_accuracy import Result, groups, quantile

    rs = [Result(f"r{i}", "g", 1.0, 1.0, ttft_err=e, tpot_err=-e) for i, e in enumerate((0.1, -0.2, 0.3, -0.4, 0.5))]
    g = groups(rs + [Result("bad", "g", 1.0, 1.0, error="refused")])["g"]
    assert g["rows"] == 5
    assert g["ttft"]["median_abs"] == pytest.approx(0.3) and g["ttft"]["median_signed"] == pytest.approx(0.1)
    assert g["ttft"]["p90_abs"] == pytest.approx(0.46)  # linear between the 4th and 5th of 5
    assert g["tpot"]["median_signed"] == pytest.approx(-0.1)
    assert math.isnan(quantile([], 0.5))


def test_markdown_prints_each_group_as_a_row_of_the_readmes_corpus_table():
    from bench.silicon_accuracy import Result, groups, markdown_table

    rs = [Result(f"r{i}", "h200_sxm sglang deepseek-ai/DeepSeek-R1", 1.0, 1.0, ttft_err=e, tpot_err=e / 10)
          for i, e in enumerate((-0.5, -0.4, 0.1))]
    rs.append(Result("b", "b200_sxm vllm openai/gpt-oss-120b", 1.0, 1.0, ttft_err=0.25, tpot_err=-0.02))
    lines = markdown_table(groups(rs)).splitlines()
    assert lines[0].startswith("| GPU | engine | model | rows |") and len(lines) == 4
    assert lines[2] == "| B200 | vLLM | gpt-oss-120b | 1 | 25.0 % (25.0 %) | +25.0 % | 2.0 % (2.0 %) | \u22122.0 % |"
    assert lines[3] == ("| H200 SXM | SGLang | DeepSeek-R1 | 3 | 40.0 % (48.0 %) | \u221240.0 % | "
                        "4.0 % (4.8 %) | \u22124.0 % |")


def test_groups_break_down_by_tp_degree():
    """Issue #29 bounds the errors per TP degree: the layout breakdown keeps each TP's rows apart."""
    from bench.silicon_accuracy import Result, groups

    rs = [Result("a", "g", 1.0, 1.0, "tp1", ttft_err=0.1, tpot_err=0.1),
          Result("b", "g", 1.0, 1.0, "tp1", ttft_err=0.3, tpot_err=-0.3),
          Result("c", "g", 1.0, 1.0, "tp8", ttft_err=-0.5, tpot_err=0.05)]
    by = groups(rs, by_layout=True)
    assert sorted(by) == ["g tp1", "g tp8"]
    assert by["g tp1"]["rows"] == 2 and by["g tp1"]["tpot"]["median_abs"] == pytest.approx(0.2)
    assert by["g tp8"]["ttft"]["median_signed"] == pytest.approx(-0.5)
    assert groups(rs)["g"]["rows"] == 3
    from bench.silicon_accuracy import Row

    assert Row(id="r", engine="trtllm", version="", model="m", system="s", precision="fp8", tp=4, isl=1, osl=1,
               concurrency=1, ttft_ms=1.0, tpot_ms=1.0).layout == "tp4"


def test_phase_means_count_only_the_requests_after_the_opening_wave_or_the_ramp():
    """``warm`` drops the first N sends (by send time, not id); ``spread`` drops every send before the ramp."""
    import pandas as pd

    from bench.silicon_accuracy import _means

    req = pd.DataFrame({"arrival_s": [0.3, 0.0, 0.1, 1.0, 2.0], "ttft_s": [0.3, 0.1, 0.2, 0.4, 0.6],
                        "tpot_s": [0.03, 0.01, 0.02, 0.04, 0.06]})
    assert _means(req) == pytest.approx((320.0, 32.0))
    assert _means(req, skip_first=2) == pytest.approx((1e3 * (0.3 + 0.4 + 0.6) / 3, 1e2 * (0.3 + 0.4 + 0.6) / 3))
    assert _means(req, after_s=1.0) == pytest.approx((500.0, 50.0))


def test_random_and_spread_phases_place_the_first_sends_over_one_pilot_cycle(monkeypatch):
    """``random`` (the default) and ``spread`` run the row again with ``ramp_s`` = the pilot's mean E2E
    after its opening wave, ``start`` random or even, one round more, and count the sends after the
    ramp; ``wave`` is the pilot itself."""
    import pandas as pd

    import bench.silicon_accuracy as sa
    import sim

    seen = []

    def fake_run(scn):
        a = scn["workload"]["arrival"]
        seen.append(dict(a, n=scn["workload"]["num_requests"]))
        n = scn["workload"]["num_requests"]
        if a.get("start") is None:  # the pilot: the opening wave slow, the rest 2 s end to end
            arrival = [0.0] * 8 + [float(i) for i in range(8, n)]
            e2e = [9.0] * 8 + [2.0] * (n - 8)
            ttft = [0.5] * n
        else:
            arrival = [i * 0.1 for i in range(n)]
            e2e = [2.0] * n
            ttft = [0.1 if a["start"] == "random" else 0.05] * n
        frame = pd.DataFrame({"arrival_s": arrival, "e2e_s": e2e, "ttft_s": ttft, "tpot_s": [0.01] * n})
        return type("R", (), {"requests": frame})()

    monkeypatch.setattr(sim, "run", fake_run)
    row = _row(concurrency=8, ttft_ms=100.0, tpot_ms=10.0)
    res = sa.simulate((row, "table", 4, 1e-3, ["random", "spread", "wave"]))
    assert sa.PHASE == "random" and not res.error
    pilot = seen[0]
    rand, even = (next(a for a in seen if a.get("start") == k) for k in ("random", "even"))
    assert pilot.get("start") is None and pilot["ramp_s"] == pytest.approx(8e-3) and pilot["n"] == 32
    assert rand == dict(process="closed", concurrency=8, ramp_s=2.0, start="random", n=40)
    assert even["start"] == "even" and even["ramp_s"] == 2.0
    assert res.ttft_err == pytest.approx(0.0) and res.extra["phases"]["spread"]["ttft_err"] == pytest.approx(-0.5)
    assert res.extra["phases"]["wave"]["ttft_err"] == pytest.approx(4.0)


def test_opening_weighs_the_opening_wave_as_one_round_of_R_and_the_rest_at_the_diffused_steady_state(monkeypatch):
    """``opening``: the pilot's first N requests (by send time) are one round, the ``random`` run's
    steady means the other R - 1: (first + (R - 1) x steady) / R, for TTFT and TPOT alike."""
    import pandas as pd

    import bench.silicon_accuracy as sa
    import sim

    def fake_run(scn):
        a = scn["workload"]["arrival"]
        n = scn["workload"]["num_requests"]
        if a.get("start") is None:  # the pilot: its opening wave (sent first, listed last) 1 s TTFT
            arrival = [float(i) for i in range(8, n)] + [0.0] * 8
            ttft = [0.5] * (n - 8) + [1.0] * 8
            tpot = [0.03] * (n - 8) + [0.02] * 8
        else:
            arrival = [i * 0.1 for i in range(n)]
            ttft, tpot = [0.1] * n, [0.01] * n
        frame = pd.DataFrame({"arrival_s": arrival, "e2e_s": [2.0] * n, "ttft_s": ttft, "tpot_s": tpot})
        return type("R", (), {"requests": frame})()

    monkeypatch.setattr(sim, "run", fake_run)
    res = sa.simulate((_row(concurrency=8, ttft_ms=100.0, tpot_ms=10.0), "table", 4, 1e-3, ["opening"]))
    r = sa.OPENING_ROUNDS
    assert not res.error and r == 10
    assert res.extra["first_round"] == pytest.approx({"ttft_ms": 1000.0, "tpot_ms": 20.0})
    assert res.sim_ttft_ms == pytest.approx((1000.0 + (r - 1) * 100.0) / r)  # 190 ms
    assert res.sim_tpot_ms == pytest.approx((20.0 + (r - 1) * 10.0) / r)  # 11 ms
    assert sa.opening_means((1000.0, 20.0), (100.0, 10.0), 1) == pytest.approx((1000.0, 20.0))


def test_mtp_sensitivity_runs_the_rows_policy_with_the_mtp_layers_own_table():
    """``--mtp K:RATE`` (a sensitivity, never the row's result): the policy gets speculative.method mtp,
    the drafter's table is the MTP layer's in the row's own layout (its own cache folder)."""
    from bench.silicon_accuracy import classify, mtp_section, scenario_of, table_dir

    assert mtp_section(None) is None
    assert mtp_section("2:0.8") == {"method": "mtp", "num_speculative_tokens": 2, "acceptance": {"rate": 0.8}}
    for bad in ("2", "x:0.8", "0:0.5", "1:1.5"):
        with pytest.raises(SystemExit, match="--mtp"):
            mtp_section(bad)
    row = _row(engine="trtllm", model="deepseek-ai/DeepSeek-R1", tp=1, data_parallel=8, expert_parallel=True)
    classify([row])
    assert row.mtp_key == row.table_key + ("mtp",)
    assert table_dir(row.mtp_key, "d").name == table_dir(row.table_key, "d").name + "-mtp"
    spec = {**mtp_section("1:0.85"), "draft_table": "mtp-table"}
    sc = scenario_of(row, "t", 4, spec=spec)
    balance = {"attention_dp_enable_balance": True, "attention_dp_timeout_iters": 60,
               "attention_dp_batching_wait_iters": 0}
    assert sc["policies"] == [{"name": "trtllm", "speculative": spec, **balance}]
    assert scenario_of(row, "t", 4)["policies"] == [{"name": "trtllm", **balance}]


def test_trtllm_attention_dp_rows_run_the_adp_balance_the_corpus_runs_set():
    """InferenceMAX's TensorRT-LLM scripts set attention_dp_config {enable_balance: true,
    timeout_iters: 60, batching_wait_iters: 0} with attention DP; nothing else gets it."""
    from bench.silicon_accuracy import TRTLLM_ADP_BALANCE, scenario_of

    dp = _row(engine="trtllm", policy="trtllm", model="deepseek-ai/DeepSeek-R1", tp=1, data_parallel=8,
              expert_parallel=True)
    assert scenario_of(dp, "t", 4)["policies"] == [{"name": "trtllm", **TRTLLM_ADP_BALANCE}]
    assert TRTLLM_ADP_BALANCE == {"attention_dp_enable_balance": True, "attention_dp_timeout_iters": 60,
                                  "attention_dp_batching_wait_iters": 0}
    tp = _row(engine="trtllm", policy="trtllm", model="deepseek-ai/DeepSeek-R1", tp=8, expert_parallel=True)
    assert scenario_of(tp, "t", 4)["policies"] == [{"name": "trtllm"}]
    vllm_dp = _row(policy="vllm-v1", model="deepseek-ai/DeepSeek-R1", tp=1, data_parallel=8, expert_parallel=True)
    assert "attention_dp_enable_balance" not in scenario_of(vllm_dp, "t", 4)["policies"][0]


def test_the_clients_concurrency_is_the_data_sources_or_every_dp_ranks_batch():
    """Under attention DP the corpus' batch_size is per rank: the client ran silicon_concurrency."""
    from types import SimpleNamespace

    from bench.silicon_accuracy import _concurrency

    src = "db-dump/2026-04-27; config_id=1; silicon_concurrency=256; measured=2026-03-25"
    def csv(source, dp):
        return SimpleNamespace(silicon_data_source=source, batch_size=32.0, attention_dp_size=dp)

    assert _concurrency(csv(src, 8.0)) == 256
    assert _concurrency(csv("db-dump", 8.0)) == 256
    assert _concurrency(SimpleNamespace(silicon_data_source=float("nan"), batch_size=16.0,
                                        attention_dp_size=float("nan"))) == 16


def test_a_dense_rows_moe_fields_do_not_skip_it():
    """The corpus fills moe_tp_size 1 / moe_ep_size 1 (or 0) on dense rows at any TP: no layout check."""
    from types import SimpleNamespace

    from bench.silicon_accuracy import _layout_skip

    for mtp, ep in ((1.0, 1.0), (0.0, 0.0), (float("nan"), float("nan"))):
        row = _row(tp=4)
        csv = SimpleNamespace(mode="agg", pp_size=1.0, attention_dp_size=1.0, moe_tp_size=mtp, moe_ep_size=ep)
        assert _layout_skip(csv, row) == "" and row.layout == "tp4" and not row.expert_parallel


def test_aic_config_serves_the_gap_analysis_rows_with_aiconfigurators_agg_rule():
    """--aic-config: max_batch_size 512 below 512 clients (else twice them), max_num_tokens =
    max_batch_size + ISL + 1500 rounded up to 32 (trtllm.rule), block reuse and chunking off,
    free fraction 0.7; only on TensorRT-LLM rows of the aic-auto-gap-analysis collection.
    --no-overlap turns the overlap scheduler off on TensorRT-LLM rows."""
    from bench.silicon_accuracy import aic_trtllm_engine, read_rows, scenario_of

    row = _row(engine="trtllm", policy="trtllm", isl=1024, concurrency=8, aic_config=True,
               source="source_file=/x/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/Qwen_Qwen3-32B.csv")
    assert aic_trtllm_engine(row) == {"max_num_seqs": 512, "max_num_batched_tokens": 3040}  # 3036 -> 3040
    assert aic_trtllm_engine(_row(isl=4096, concurrency=512)) == {"max_num_seqs": 1024,
                                                                  "max_num_batched_tokens": 6624}
    sc = scenario_of(row, "t", 4)
    assert sc["engine"]["max_num_seqs"] == 512 and sc["engine"]["max_num_batched_tokens"] == 3040
    assert sc["policies"] == [{"name": "trtllm", "enable_block_reuse": False, "enable_chunked_prefill": False,
                               "free_gpu_memory_fraction": 0.7}]
    other = _row(engine="trtllm", policy="trtllm", isl=1024, concurrency=8, aic_config=True, source="db-dump/x")
    assert scenario_of(other, "t", 4)["engine"]["max_num_batched_tokens"] == 8192
    assert scenario_of(other, "t", 4)["policies"] == [{"name": "trtllm"}]
    plain = _row(engine="trtllm", policy="trtllm", no_overlap=True)
    assert scenario_of(plain, "t", 4)["policies"] == [{"name": "trtllm", "disable_overlap_scheduler": True}]
    rows = [r for r in read_rows() if r.engine == "trtllm" and r.system == "h100_sxm"
            and r.model in ("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct")]
    assert len(rows) == 357 and all("aic-auto-gap-analysis" in r.source for r in rows)


def test_inferencemax_lengths_are_bench_servings_uniform_draw_over_0_8_L_to_L():
    """bench_serving's random dataset (--random-range-ratio 0.8, --seed 0): np.random.seed(0), a
    zero-length prefix draw, then randint(int(0.8 L), L + 1) for every prompt and every output, in
    that order: uniform integers over [0.8 L, L] (both ends included), mean 0.9 L, reproducible."""
    import numpy as np

    from bench.silicon_accuracy import inferencemax_lengths

    n = 40_000
    prompts, outputs = inferencemax_lengths(1024, 8192, n)
    assert (prompts.min(), prompts.max()) == (819, 1024)  # int(819.2) and L itself
    assert (outputs.min(), outputs.max()) == (6553, 8192)
    # closed form: the mean of the integers lo..hi is (lo + hi) / 2; the sample mean's standard error
    # is (hi - lo + 1) / sqrt(12 n) (0.30 and 2.4 tokens here), so 5 of them bound the draw
    for xs, lo, hi in ((prompts, 819, 1024), (outputs, 6553, 8192)):
        assert abs(xs.mean() - (lo + hi) / 2) < 5 * (hi - lo + 1) / math.sqrt(12 * n)
        assert len(np.unique(xs)) == hi - lo + 1  # every length in the range is drawn
    # the client's own call sequence on numpy's global generator gives the same requests
    np.random.seed(0)
    np.random.randint(0, 128_000, size=0)
    assert (np.random.randint(819, 1025, size=n) == prompts).all()
    assert (np.random.randint(6553, 8193, size=n) == outputs).all()
    again = inferencemax_lengths(1024, 8192, n)
    assert (again[0] == prompts).all() and (again[1] == outputs).all()
    assert not (inferencemax_lengths(1024, 8192, n, seed=1)[0] == prompts).all()


def test_inferencemax_rows_are_the_dated_csv_rows_at_its_three_lengths():
    from bench.silicon_accuracy import is_inferencemax, read_rows

    dated = "source_file=2026-03-25.csv; model=GPT-OSS-120B; silicon_concurrency=4; image=vllm/vllm-openai:v0.18.0"
    assert is_inferencemax(_row(source=dated, isl=1024, osl=8192))
    assert is_inferencemax(_row(source=dated, isl=8192, osl=1024))
    assert not is_inferencemax(_row(source=dated, isl=4000, osl=1000))  # not one of its lengths
    assert not is_inferencemax(_row(source="db-dump/2026-04-27; config_id=81; silicon_concurrency=4",
                                    isl=1024, osl=1024))  # AIConfigurator's own runs
    assert not is_inferencemax(_row(source="/x/aic-auto-gap-analysis/data/h100_sxm/vllm/0.12.0/q.csv",
                                    isl=1024, osl=1024))
    rows = read_rows()
    h200_70b = [r for r in rows if r.system == "h200_sxm" and r.engine == "vllm" and "70B" in r.model
                and r.skip == ""]
    assert len(h200_70b) == 60 and all(is_inferencemax(r) for r in h200_70b)
    # the H200 SGLang DeepSeek-V3 rows (config 81 of AIConfigurator's database dump) are not InferenceMAX's
    sglang_v3 = [r for r in rows if r.system == "h200_sxm" and r.engine == "sglang" and r.model.endswith("V3")
                 and not r.skip]
    assert len(sglang_v3) == 15 and not any(is_inferencemax(r) for r in sglang_v3)


def test_inferencemax_scenario_sends_conc_x_10_drawn_requests_with_the_scripts_server_flags():
    from bench.silicon_accuracy import inferencemax_lengths, inferencemax_scenario

    vllm = _row(policy="vllm-v1", concurrency=16, isl=1024, osl=1024, config="c.json", gpu="h200")
    sc = inferencemax_scenario(vllm, "t", 0.001)
    wl = sc["workload"]
    assert wl["num_requests"] == 160 and wl["arrival"]["concurrency"] == 16 and wl["arrival"]["ramp_s"] == 0.016
    assert "prompt_tokens" not in wl and "output_tokens" not in wl and wl["max_tokens"] == 1024
    lines = open(wl["trace"]["path"], encoding="utf-8").read().split()
    assert lines[0] == "arrival_s,prompt_tokens,output_tokens" and len(lines) == 161
    prompts, outputs = inferencemax_lengths(1024, 1024, 160)
    assert lines[1:] == [f"0,{p},{o}" for p, o in zip(prompts, outputs)]
    assert sc["engine"] | {"max_model_len": 0} == {"max_model_len": 0, "max_num_seqs": 16, "max_num_batched_tokens": 8192,
                                                    "enable_prefix_caching": False, "kv_cache_dtype": "fp8",
                                                    "async_scheduling": True}
    assert sc["hardware"]["gpu_memory_utilization"] == 0.9
    vllm.slots_short = 1  # --slots-short acts over the scripts' max_num_seqs = CONC, not under it
    assert inferencemax_scenario(vllm, "t", 0.001)["engine"]["max_num_seqs"] == 15
    oss = inferencemax_scenario(_row(policy="vllm-v1", model="openai/gpt-oss-120b", config="c.json"), "t", 0.0)
    assert "kv_cache_dtype" not in oss["engine"]  # the H100/H200 gpt-oss scripts keep the model's KV dtype
    b200 = inferencemax_scenario(_row(policy="vllm-v1", model="openai/gpt-oss-120b", system="b200_sxm", gpu="b200",
                                      config="c.json"), "t", 0.0)
    assert b200["engine"]["kv_cache_dtype"] == "fp8" and b200["engine"]["max_num_seqs"] == 512  # gptoss_fp4_b200.sh
    sgl = inferencemax_scenario(_row(engine="sglang", policy="sglang", model="deepseek-ai/DeepSeek-R1", tp=8,
                                     isl=8192, osl=1024, config="c.json"), "t", 0.0)
    assert sgl["policies"][0] == {"name": "sglang", "disable_radix_cache": True, "max_running_requests": 256,
                                  "chunked_prefill_size": 32768, "max_prefill_tokens": 32768,
                                  "mem_fraction_static": 0.82}
    for conc, interval in ((8, 10), (16, 30)):  # dsr1_fp8_b200.sh: polls every 30 iterations from 16 clients
        b200_sgl = inferencemax_scenario(_row(engine="sglang", policy="sglang", model="deepseek-ai/DeepSeek-R1",
                                              tp=8, isl=8192, osl=1024, concurrency=conc, system="b200_sxm",
                                              gpu="b200", config="c.json"), "t", 0.0)
        assert b200_sgl["policies"][0] == sgl["policies"][0] | {"scheduler_recv_interval": interval}
        assert b200_sgl["engine"]["kv_cache_dtype"] == "fp8"
    assert "kv_cache_dtype" not in sgl["engine"]
    tp4 = inferencemax_scenario(_row(engine="sglang", policy="sglang", model="deepseek-ai/DeepSeek-R1", tp=4,
                                     isl=8192, osl=1024, concurrency=32, system="b200_sxm", gpu="b200",
                                     config="c.json"), "t", 0.0)["policies"][0]
    assert tp4 == {"name": "sglang", "disable_radix_cache": True, "max_running_requests": 32,
                   "chunked_prefill_size": 8192, "max_prefill_tokens": 8192, "mem_fraction_static": 0.95,
                   "scheduler_recv_interval": 10}
    trt = inferencemax_scenario(_row(engine="trtllm", policy="trtllm", model="deepseek-ai/DeepSeek-R1", tp=8,
                                     isl=8192, osl=1024, concurrency=256, config="c.json"), "t", 0.0)
    assert trt["engine"]["max_num_batched_tokens"] == (256 + 8192 + 127) // 64 * 64 == 8512
    assert trt["engine"]["kv_cache_dtype"] == "fp8"
    assert trt["policies"][0] == {"name": "trtllm", "free_gpu_memory_fraction": 0.75, "enable_block_reuse": False}
    # dsr1_fp8_b200_trt.sh (TensorRT-LLM 1.2): fraction by lengths and clients, delay batching on 1k/1k at 64-255
    for (isl, osl, conc, tp), frac, waits in (((1024, 1024, 64, 8), 0.8, True), ((1024, 1024, 256, 8), 0.7, False),
                                              ((1024, 8192, 128, 8), 0.8, False), ((8192, 1024, 8, 4), 0.75, False)):
        b200 = inferencemax_scenario(_row(engine="trtllm", policy="trtllm", model="deepseek-ai/DeepSeek-R1",
                                          version="1.2.0rc6.post3", system="b200_sxm", gpu="b200", tp=tp, isl=isl,
                                          osl=osl, concurrency=conc, config="c.json"), "t", 0.0)["policies"][0]
        assert b200["free_gpu_memory_fraction"] == frac
        assert ("batch_wait_timeout_iters" in b200) == waits
        if waits:
            assert (b200["batch_wait_timeout_iters"], b200["batch_wait_max_tokens_ratio"]) == (40, 0.8)
    old = inferencemax_scenario(_row(engine="trtllm", policy="trtllm", model="deepseek-ai/DeepSeek-R1",
                                     version="1.1.0rc2.post2", system="b200_sxm", gpu="b200", tp=8, isl=1024,
                                     osl=1024, concurrency=64, config="c.json"), "t", 0.0)["policies"][0]
    assert old == trt["policies"][0]  # rows before the script moved to 1.2 keep the H200 script's flags
    # 70b_fp8_{h200,b200}_trt_slurm.sh: FP8 KV, no block reuse; delay batching on 1k/1k below TP 8
    for system, tp, isl, waits in (("h200_sxm", 2, 1024, True), ("h200_sxm", 8, 1024, False),
                                   ("b200_sxm", 4, 8192, False)):
        sc = inferencemax_scenario(_row(engine="trtllm", policy="trtllm", system=system, tp=tp, isl=isl, osl=1024,
                                        concurrency=16, config="c.json"), "t", 0.0)
        knobs = sc["policies"][0]
        assert knobs["enable_block_reuse"] is False and sc["engine"]["kv_cache_dtype"] == "fp8"
        assert (knobs.get("batch_wait_timeout_iters"), knobs.get("batch_wait_max_tokens_ratio")) == \
            ((20, 0.9) if waits else (None, None))
        assert sc["engine"]["max_num_batched_tokens"] == (16384 if system == "b200_sxm" else max(8192, isl + 16))
    # gptoss_fp4_h200_trt.sh: --max_batch_size CONC --max_num_tokens 20000, fraction 0.85, no block reuse;
    # the B200 rows (another script) keep the bench's budget of max(8192, prompt + clients)
    oss = inferencemax_scenario(_row(engine="trtllm", policy="trtllm", model="openai/gpt-oss-120b", tp=1, isl=8192,
                                     osl=1024, concurrency=32, config="c.json"), "t", 0.0)
    assert (oss["engine"]["max_num_seqs"], oss["engine"]["max_num_batched_tokens"]) == (32, 20000)
    assert oss["policies"][0] == {"name": "trtllm", "free_gpu_memory_fraction": 0.85, "enable_block_reuse": False}
    b200_oss = inferencemax_scenario(_row(engine="trtllm", policy="trtllm", model="openai/gpt-oss-120b", tp=1,
                                          isl=8192, osl=1024, concurrency=32, system="b200_sxm", gpu="b200",
                                          config="c.json"), "t", 0.0)
    assert b200_oss["engine"]["max_num_batched_tokens"] == 8192 + 32 and b200_oss["policies"][0] == {"name": "trtllm"}


def _fake_runs(monkeypatch, seen):
    """``sim.run`` stood in for: the fixed-length runs answer 100 ms TTFT, 10 ms TPOT; a trace run
    (InferenceMAX's client) answers its own requests' lengths from the trace, 50 ms TTFT, 5 ms TPOT."""
    import pandas as pd

    import sim

    def fake_run(scn):
        wl = scn["workload"]
        seen.append(scn)
        n = wl["num_requests"]
        if "trace" in wl:
            trace = pd.read_csv(wl["trace"]["path"])
            frame = pd.DataFrame({"arrival_s": [0.0] * len(trace), "e2e_s": [2.0] * len(trace),
                                  "ttft_s": [0.05] * len(trace), "tpot_s": [0.005] * len(trace),
                                  "prompt_tokens": trace["prompt_tokens"], "output_tokens": trace["output_tokens"]})
        else:
            frame = pd.DataFrame({"arrival_s": [i * 0.1 for i in range(n)], "e2e_s": [2.0] * n,
                                  "ttft_s": [0.1] * n, "tpot_s": [0.01] * n})
        return type("R", (), {"requests": frame})()

    monkeypatch.setattr(sim, "run", fake_run)


def test_inferencemax_rows_replay_its_client_by_default_and_other_rows_do_not(monkeypatch):
    """By default (``--client inferencemax``) a row InferenceMAX measured is its client's replay: CONC x 10
    requests, every one counted, lengths uniform over [0.8 L, L]; the fixed-length ``random`` result runs
    beside it. A row of another source, and any row under ``--client fixed``, is the ``random`` result."""
    import bench.silicon_accuracy as sa

    assert sa.CLIENT == "inferencemax" and sa.parser().parse_args([]).client == "inferencemax"
    assert sa.parser().parse_args(["--client", "fixed"]).client == "fixed"
    dated = "source_file=2026-03-25.csv; silicon_concurrency=8; image=vllm/vllm-openai:v0.18.0"
    imax = _row(source=dated, isl=1024, osl=8192, concurrency=8, policy="vllm-v1", config="c.json", gpu="h200")
    assert imax.client == sa.CLIENT and sa.is_inferencemax(imax)

    seen: list = []
    _fake_runs(monkeypatch, seen)
    res = sa.simulate((imax, "table", 4, 1e-3, ["random"]))
    traced = [s for s in seen if "trace" in s["workload"]]
    assert not res.error and len(seen) == 3 and len(traced) == 1  # pilot, random, InferenceMAX's client
    assert traced[0]["workload"]["num_requests"] == 80 and traced[0]["workload"]["arrival"]["concurrency"] == 8
    lengths = res.extra["lengths"]
    assert res.extra["client"] == "inferencemax" and lengths["requests"] == 80  # 8 clients x 10, all counted
    prompts, outputs = sa.inferencemax_lengths(1024, 8192, 80)
    assert lengths["prompt_mean"] == pytest.approx(prompts.mean()) and 819 <= prompts.min() <= prompts.max() <= 1024
    assert lengths["output_mean"] == pytest.approx(outputs.mean()) and 6553 <= outputs.min() <= outputs.max() <= 8192
    assert (res.sim_ttft_ms, res.sim_tpot_ms) == pytest.approx((50.0, 5.0))  # the replay is the row's result
    assert res.ttft_err == pytest.approx(-0.5) and res.tpot_err == pytest.approx(-0.5)
    assert res.extra["phases"]["random"]["ttft_err"] == pytest.approx(0.0)  # the fixed-length one beside it

    for row in (_row(source="db-dump/2026-04-27; config_id=81; silicon_concurrency=8", isl=1024, osl=1024),
                _row(source=dated, isl=1024, osl=8192, client="fixed")):
        seen.clear()
        res = sa.simulate((row, "table", 4, 1e-3, ["random"]))
        assert not res.error and len(seen) == 2 and not any("trace" in s["workload"] for s in seen)
        assert "client" not in res.extra and set(res.extra["phases"]) == {"random"}
        assert seen[1]["workload"]["prompt_tokens"] == {"dist": "fixed", "value": row.isl}
        assert (res.sim_ttft_ms, res.sim_tpot_ms) == pytest.approx((100.0, 10.0)) and res.ttft_err == pytest.approx(0.0)


def test_an_inferencemax_row_is_priced_as_its_server_ran_when_the_fixed_length_comparison_cannot_run(monkeypatch):
    # the B200 SGLang DeepSeek-R1 TP 4 rows: weights fit only at the script's --mem-fraction-static 0.95,
    # so the comparison at the bench's defaults is refused while the row's own replay runs
    import bench.silicon_accuracy as sa
    import sim
    from sim.errors import CbsimError

    seen: list = []
    _fake_runs(monkeypatch, seen)
    traced_run = sim.run

    def refuse_fixed(scn):
        if "trace" not in scn["workload"]:
            raise CbsimError("KV pool is empty")
        return traced_run(scn)

    monkeypatch.setattr(sim, "run", refuse_fixed)
    dated = "source_file=2026-04-06.csv; model=DeepSeek-R1; silicon_concurrency=8"
    imax = _row(source=dated, isl=8192, osl=1024, concurrency=8, policy="vllm-v1", config="c.json", gpu="h200")
    res = sa.simulate((imax, "table", 4, 1e-3, ["random"]))
    assert not res.error and res.extra["fixed_error"] == "KV pool is empty"
    assert set(res.extra["phases"]) == {"inferencemax"} and res.ttft_err == pytest.approx(-0.5)
    sa.print_clients([res], "random")  # a row without the comparison is left out of its column
    other = sa.simulate((_row(source="db-dump/2026-04-27; silicon_concurrency=8"), "table", 4, 1e-3, ["random"]))
    assert other.error == "KV pool is empty"  # a row priced by the fixed-length loop itself is refused
