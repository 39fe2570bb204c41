"""The SLO verdict a capacity search and a plan rest on: closed-form cases and a backlog."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from sim.metrics.summary import run_meets_slo
from sim.runner import run
from tests.helpers import overload_scenario


def frame(ttfts, states):
    return pd.DataFrame({"ttft_s": ttfts, "tpot_s": [0.01] * len(ttfts), "e2e_s": ttfts, "state": states})


SLO = SimpleNamespace(ttft_s=2.0, tpot_s=None, e2e_s=None, percentile=50)


def test_percentile_of_finished_requests_decides():
    assert run_meets_slo(frame([1.0, 1.5, 3.0], ["finished"] * 3), SLO) is True  # p50 = 1.5
    assert run_meets_slo(frame([1.0, 2.5, 3.0], ["finished"] * 3), SLO) is False  # p50 = 2.5


def test_unfinished_requests_count_as_infinitely_late():
    # p50 over [1, inf, inf, inf] falls between two infinities (NaN under linear interpolation)
    df = frame([1.0, float("nan"), float("nan"), float("nan")], ["finished"] + ["unfinished"] * 3)
    assert run_meets_slo(df, SLO) is False


def test_rejected_requests_are_left_out_but_a_run_that_finished_nothing_fails():
    assert run_meets_slo(frame([1.0, float("nan")], ["finished", "rejected"]), SLO) is True
    assert run_meets_slo(frame([float("nan")], ["rejected"]), SLO) is False


def test_an_overloaded_run_with_a_backlog_does_not_meet_the_slo():
    scn = overload_scenario("backlog", 400, 2000.0, [{"name": "vllm-v1"}], horizon_s=20.0)
    scn["slo"] = {"ttft_s": 2.0, "tpot_s": 0.1}
    s = run(scn).summaries["vllm-v1"]
    assert s["requests_unfinished"] > 300
    assert s["slo_met"] is False
