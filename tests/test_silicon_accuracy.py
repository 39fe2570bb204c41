"""bench/silicon_accuracy.py's bookkeeping: which corpus rows it prices and why it skips the others,
and the group statistics it prints (the replay itself is the bench's job, not a test's)."""

from __future__ import annotations

import importlib.util
import math

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                                reason="the corpus ships with the optional extra cbsim[gpu-data]")


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
        base = dict(mode="agg", pp_size=1.0, attention_dp_size=float("nan"), moe_ep_size=1.0)
        base.update(kw)
        return SimpleNamespace(**base)

    assert _layout_skip(csv(), _row()) == ""
    assert "disaggregated" in _layout_skip(csv(mode="disagg"), _row())
    assert "pipeline parallel 2" in _layout_skip(csv(pp_size=2.0), _row())
    assert _layout_skip(csv(attention_dp_size=4.0), _row()) == "attention data parallel 4"
    assert _layout_skip(csv(moe_ep_size=8.0), _row()) == "expert parallel 8"


def test_group_statistics_are_median_and_p90_of_the_absolute_error():
    from bench.silicon_accuracy import Result, groups, quantile

    rs = [Result(f"r{i}", "g", 1.0, 1.0, ttft_err=e, tpot_err=-e) for i, e in enumerate((0.1, -0.2, 0.3, -0.4, 0.5))]
    g = groups(rs + [Result("bad", "g", 1.0, 1.0, error="refused")])["g"]
    assert g["rows"] == 5
    assert g["ttft"]["median_abs"] == pytest.approx(0.3) and g["ttft"]["median_signed"] == pytest.approx(0.1)
    assert g["ttft"]["p90_abs"] == pytest.approx(0.46)  # linear between the 4th and 5th of 5
    assert g["tpot"]["median_signed"] == pytest.approx(-0.1)
    assert math.isnan(quantile([], 0.5))


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
