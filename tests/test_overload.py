"""Overload: arrivals far above capacity end at the horizon, or at the default simulated-time cap
when the scenario has none, with the backlog reported and memory bounded.

The default cap (sim.runner): last arrival + max(3600 s, arrival span). These tests use long
constant step times so the cap is reached in a few dozen steps.
"""

from __future__ import annotations

import io
import tracemalloc

import pytest
from rich.console import Console

from sim.cli.run import backlog_notes, comparison_table
from sim.runner import DEFAULT_DRAIN_S, run
from sim.scenario.schema import load_scenario
from sim.workload.synthetic import build_workload
from tests.helpers import overload_scenario

OVERLOAD = overload_scenario(
    "overload", num_requests=4000, rate=2000.0, horizon_s=20.0,
    policies=[{"name": "vllm-v1"}, {"name": "orca"}, {"name": "vllm-v0", "preemption": "swap"},
              {"name": "sarathi"}, {"name": "static", "batch_size": 8}])


def rendered(table) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(table)
    return console.export_text()


def _check_counts(s: dict) -> None:
    assert s["requests_finished"] + s["requests_rejected"] + s["requests_unfinished"] == s["requests_total"]
    assert sum(s["backlog"].values()) == s["requests_unfinished"]
    assert sum(s["unfinished_reasons"].values()) == s["requests_unfinished"]


def test_overload_ends_at_the_horizon_with_the_backlog_reported():
    result = run(OVERLOAD)
    for label, s in result.summaries.items():
        _check_counts(s)
        # the work is bounded by the horizon, not by the backlog: at most one step per 50 ms of it
        assert s["steps"] <= 20.0 / 0.05, (label, s["steps"])
        assert s["stopped"] == "horizon" and s["end_s"] == 20.0, label
        assert s["unfinished_reasons"] == {"horizon": s["requests_unfinished"], "time_cap": 0, "stuck": 0}
        assert s["backlog"]["queued"] > 3000, (label, s["backlog"])  # ~40 s of arrivals at 2000/s, few served
        assert s["backlog"]["not_arrived"] == 4000 - int((result.requests.query("policy == @label")["arrival_s"]
                                                         < 20.0).sum())
        steps = result.steps[result.steps["policy"] == label]
        assert len(steps) <= 20.0 / 0.05 + 1  # the clock, not the backlog, bounds the work
        assert (steps["start_s"] + steps["duration_s"] <= 20.0 + 1e-9).all()
    reasons = set(result.requests.loc[result.requests["state"] == "unfinished", "reason"])
    assert reasons == {"horizon reached"}


def test_overload_without_a_horizon_stops_at_the_default_time_cap():
    scn = load_scenario(OVERLOAD, ["horizon_s=null", "latency.step_s=100", "workload.num_requests=300",
                                   "policies=[{name: vllm-v1}, {name: orca}]"])
    specs = build_workload(scn)
    last, first = specs[-1].arrival_s, specs[0].arrival_s
    cap = last + max(DEFAULT_DRAIN_S, last - first)
    result = run(scn)
    for label, s in result.summaries.items():
        _check_counts(s)
        assert s["stopped"] == "time cap" and s["end_s"] == pytest.approx(cap), label
        assert s["requests_unfinished"] > 0 and s["backlog"]["not_arrived"] == 0
        assert s["unfinished_reasons"] == {"horizon": 0, "time_cap": s["requests_unfinished"], "stuck": 0}
        assert len(result.steps[result.steps["policy"] == label]) <= cap / 100 + 1
    reasons = set(result.requests.loc[result.requests["state"] == "unfinished", "reason"])
    assert reasons == {f"simulated-time cap of {cap:,.0f} s reached"}
    notes = backlog_notes(result)
    assert notes[0].startswith("vllm-v1: ") and f"default time cap ({cap:,.0f} s) was reached" in notes[0]
    assert notes[-1].startswith("(horizon_s is null, so simulated time stops at the last arrival + max(3600 s")
    table = rendered(comparison_table(result))
    assert "│ ended " in table and "│ backlog: queued / running / not arrived " in table
    assert f"time cap at {cap:,.0f} s" in table


def test_a_run_that_drains_reports_no_backlog():
    result = run(OVERLOAD, ["horizon_s=null", "workload.num_requests=40", "workload.arrival.rate=2"])
    for s in result.summaries.values():
        assert s["stopped"] == "drained" and s["end_s"] is None
        assert s["requests_unfinished"] == 0
        assert s["backlog"] == {"queued": 0, "running": 0, "not_arrived": 0}
        assert s["unfinished_reasons"] == {"horizon": 0, "time_cap": 0, "stuck": 0}
    assert backlog_notes(result) == []
    table = rendered(comparison_table(result))
    assert "│ ended " not in table and "backlog" not in table


def test_overload_memory_is_bounded_by_the_workload_not_the_backlog():
    """Peak Python memory of an overloaded run stays within a fixed budget, and a horizon four
    times longer (four times the steps, a larger backlog) does not multiply it."""
    peaks = []
    for horizon in (5.0, 20.0):
        tracemalloc.start()
        run(OVERLOAD, [f"horizon_s={horizon}", "policies=[{name: vllm-v1}]"])
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 200 * 2**20, peaks
    assert peaks[1] < 2 * peaks[0], peaks


def test_vllm_v1_priority_ties_can_livelock_and_the_cap_ends_it():
    """vLLM V1's priority policy preempts max(running, key=(priority, arrival)), the FIRST of
    tied requests in running order (reference/oracle/README.md). Two requests that arrive
    together and overflow the pool then preempt each other forever (with chunks of 1 token and
    no full-prompt admission gate). This is vLLM's own rule, kept for step-exact conformance; the
    default time cap ends the run, and the summary says so."""
    scn = {
        "name": "tie-livelock", "model": "tiny", "hardware": {"gpu": "cpu"},
        "latency": {"backend": "constant", "step_s": 10.0},
        "workload": {"requests": [
            {"arrival_s": 0.0, "prompt_tokens": 46, "output_tokens": 61},
            {"arrival_s": 0.0, "prompt_tokens": 51, "output_tokens": 114},
        ]},
        "engine": {"block_size": 4, "num_gpu_blocks": 16, "max_num_seqs": 4, "max_num_batched_tokens": 256,
                   "max_model_len": 256},
        "policies": [{"name": "vllm-v1", "scheduling_policy": "priority", "long_prefill_token_threshold": 1,
                      "scheduler_reserve_full_isl": False, "enable_chunked_prefill": False,
                      "enable_prefix_caching": False}],  # cached blocks would let the victim resume
    }
    s = run(scn).summaries["vllm-v1"]
    assert s["steps"] <= DEFAULT_DRAIN_S / 10.0  # the cap bounds the work: one 10 s step at a time
    assert s["stopped"] == "time cap" and s["end_s"] == DEFAULT_DRAIN_S
    assert s["requests_unfinished"] >= 1 and s["preemptions"] > 10
