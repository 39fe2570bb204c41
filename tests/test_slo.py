"""The SLO verdict a capacity search and a plan rest on: closed-form cases and a backlog."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from sim.metrics.summary import run_meets_slo
from sim.runner import run
from tests.helpers import overload_scenario


def frame(ttfts, states, refused=None):
    return pd.DataFrame({"ttft_s": ttfts, "tpot_s": [0.01] * len(ttfts), "e2e_s": ttfts, "state": states,
                         "refused": refused if refused is not None else [False] * len(ttfts)})


SLO = SimpleNamespace(ttft_s=2.0, tpot_s=None, e2e_s=None, percentile=50)


def test_percentile_of_finished_requests_decides():
    assert run_meets_slo(frame([1.0, 1.5, 3.0], ["finished"] * 3), SLO) is True  # p50 = 1.5
    assert run_meets_slo(frame([1.0, 2.5, 3.0], ["finished"] * 3), SLO) is False  # p50 = 2.5


def test_unfinished_requests_count_as_infinitely_late():
    # p50 over [1, inf, inf, inf] falls between two infinities (NaN under linear interpolation)
    df = frame([1.0, float("nan"), float("nan"), float("nan")], ["finished"] + ["unfinished"] * 3)
    assert run_meets_slo(df, SLO) is False


def test_invalid_requests_are_left_out_but_a_run_that_finished_nothing_fails():
    assert run_meets_slo(frame([1.0, float("nan")], ["finished", "rejected"]), SLO) is True
    assert run_meets_slo(frame([float("nan")], ["rejected"]), SLO) is False


def test_refused_requests_count_as_infinitely_late():
    # two finished at 1 s, two refused (429): p50 over [1, 1, inf, inf] is NaN -> missed;
    # the same two left out as invalid would pass
    ttft, states = [1.0, 1.0, float("nan"), float("nan")], ["finished"] * 2 + ["rejected"] * 2
    assert run_meets_slo(frame(ttft, states, [False, False, True, True]), SLO) is False
    assert run_meets_slo(frame(ttft, states), SLO) is True
    # one refusal in four: p50 of [1, 1, 1, inf] = 1 s -> met
    assert run_meets_slo(frame([1.0] * 3 + [float("nan")], ["finished"] * 3 + ["rejected"],
                               [False] * 3 + [True]), SLO) is True


def tgi_overload(rate: float = 20.0, n: int = 2000) -> dict:
    """TGI with max_concurrent_requests 8 under far more traffic than it serves: it answers 429
    (long enough for a steady window of 10 turnovers)."""
    scn = overload_scenario("tgi-429", n, rate, [{"name": "tgi", "max_concurrent_requests": 8}],
                            horizon_s=400.0)
    scn["slo"] = {"ttft_s": 30.0, "tpot_s": 1.0}
    return scn


def test_a_tgi_run_overloaded_into_429s_misses_the_slo():
    s = run(tgi_overload()).summaries["tgi"]
    assert s["requests_refused"] > 100 and s["requests_invalid"] == 0
    assert s["requests_rejected"] == s["requests_refused"]
    # the requests it served were served fast enough: only the refusals make it miss
    assert s["ttft_s"]["p99"] < 30.0 and s["tpot_s"]["p99"] < 1.0
    assert s["slo_met"] is False
    assert not s["steady"]["too_short"] and s["steady"]["refused"] > 100
    assert s["steady"]["slo_met"] is False


def test_an_overloaded_run_with_a_backlog_does_not_meet_the_slo():
    scn = overload_scenario("backlog", 400, 2000.0, [{"name": "vllm-v1"}], horizon_s=20.0)
    scn["slo"] = {"ttft_s": 2.0, "tpot_s": 0.1}
    s = run(scn).summaries["vllm-v1"]
    assert s["requests_unfinished"] > 300
    assert s["slo_met"] is False


# --- the same refusals in capacity, plan and sweep ---------------------------------------------
def tgi_edge() -> dict:
    """TGI that refuses past 4 concurrent requests (429), on the small scenario: the requests it
    serves meet p99 TTFT 2 s and TPOT 0.1 s at any rate; only the refusals can make it miss. At 4
    req/s under 1 % of the steady window is refused, at 8 req/s about 5 %."""
    from tests.helpers import small_scenario

    return small_scenario(seed=1, num_requests=200, policies=[{"name": "tgi", "max_concurrent_requests": 4}],
                          slo={"ttft_s": 2.0, "tpot_s": 0.1})


def test_capacity_and_plan_count_429s_as_missing_the_slo():
    from sim.planning.capacity import capacity
    from sim.planning.plan import plan

    # without refusals in the verdict TGI would meet the SLO at every rate (a burst has no
    # saturated throughput to bound it: it refuses all but four); with them the capacity is finite
    cap = capacity(tgi_edge(), workers=1, tolerance=0.05)["tgi"]
    assert 4.0 <= cap.rate_rps < 8.0
    assert cap.summary["steady"]["refused"] <= 0.01 * cap.summary["steady"]["requests_in_window"]
    # one replica at 16 req/s refuses about a third of the requests it is sent: missed, so more replicas
    one = run(tgi_edge(), ["workload.arrival.rate=16.0"]).summaries["tgi"]
    assert one["requests_refused"] > 0.2 * one["requests_total"]
    assert one["ttft_s"]["p99"] < 2.0 and one["tpot_s"]["p99"] < 0.1 and one["slo_met"] is False
    p = plan(tgi_edge(), 16.0, workers=1)["tgi"]
    assert p.replicas is not None and p.replicas >= 2 and dict(p.probes)[1] is False


def test_a_sweep_marks_the_rates_where_tgi_refused_as_missing(tmp_path):
    from sim.planning.sweep import make_points, sweep, verdicts

    res = sweep(tgi_edge(), make_points([1.0, 8.0]), tmp_path / "sw", workers=1, plot=True)
    table = res.table.sort_values("rate").reset_index(drop=True)
    assert list(verdicts(table)) == [True, False]
    # 200 requests: the steady window is too short, so the whole run's verdict is the sweep's
    assert table.loc[0, "requests_refused"] == 0 and table.loc[1, "requests_refused"] > 0
    assert table.loc[1, "ttft_s.p99"] < 2.0 and table.loc[1, "tpot_s.p99"] < 0.1, "the refusals decide"
    assert res.plot is not None and res.plot.exists()
