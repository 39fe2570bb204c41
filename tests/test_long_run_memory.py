"""A long run's per-request memory (issue 33): a large workload of own content kept as columns
(sim.workload.spec_columns), each request's record made when it arrives and written to the
recorder's table when it ends (sim.metrics.request_table). None of it may change a result: the
frames and summaries equal those of the list of specs and the records kept to the end."""

from __future__ import annotations

import gc

import numpy as np
import pandas as pd
import pytest

import sim.runner as runner
from sim.engine import Simulation
from sim.metrics.requests import RequestRecord
from sim.scenario.resolved import resolve
from sim.scenario.schema import load_scenario
from sim.workload import spec_columns
from sim.workload.synthetic import build_workload
from tests.helpers import overload_scenario, small_scenario

POLICIES = [{"name": "vllm-v1"}, {"name": "vllm-v0", "preemption": "swap"}, {"name": "orca"}]


def _pressure(**extra) -> dict:
    """Preemptions (broken token runs), a horizon before the last arrival (requests never
    arriving, others unfinished) and three policies on one workload."""
    return overload_scenario("pressure", 400, 6.0, POLICIES, horizon_s=45.0) | extra


def _columns(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(spec_columns, "COLUMNS_FROM", 0 if on else 10**12)


def test_the_columns_give_the_specs_of_the_list(monkeypatch):
    scn = load_scenario(small_scenario(num_requests=300))
    _columns(monkeypatch, False)
    listed = build_workload(scn)
    _columns(monkeypatch, True)
    cols = build_workload(scn)
    assert isinstance(cols, spec_columns.SpecColumns) and type(listed) is list
    assert len(cols) == len(listed) == 300
    assert list(cols) == listed and cols == listed  # iteration (in chunks) and equality
    assert [cols[i] for i in range(300)] == listed and cols[-1] == listed[-1]
    assert cols[10:20] == listed[10:20] and cols.ids() == [s.id for s in listed]
    with pytest.raises(IndexError):
        cols[300]


@pytest.mark.parametrize("fallback", [False, True])
def test_the_spec_maker_makes_the_dataclass_spec(monkeypatch, fallback):
    """spec_maker's specs (set slot by slot) equal, hash and stay frozen as RequestSpec's own; with
    defaults other than it writes down (RequestSpec changed) it is the plain constructor."""
    import dataclasses

    from sim.workload.request_spec import RequestSpec

    if fallback:
        monkeypatch.setitem(spec_columns._DEFAULTS, "client", -2)
    make = spec_columns.spec_maker()
    for cut in ("", "prompt clipped"):
        made, built = make("r000007", 1.25, 300, 40, 512, cut), RequestSpec("r000007", 1.25, 300, 40, 512, cut=cut)
        assert type(made) is RequestSpec and made == built and hash(made) == hash(built)
        assert dataclasses.astuple(made) == dataclasses.astuple(built)
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.arrival_s = 2.0


@pytest.mark.parametrize("columns,flush", [(False, None), (True, None), (True, 7)])
def test_a_run_gives_the_same_frames_with_or_without_its_records_kept(monkeypatch, columns, flush):
    """``sim.run`` (compact: records made on arrival and let go at their end; the workload as
    columns or a list) against a Simulation that keeps every record, policy by policy. ``flush``:
    the compact run's table writes its pending rows every 7 ended requests, during the run (the
    records kept are written at the end, in one flush)."""
    from sim.metrics import request_table

    _columns(monkeypatch, columns)
    if flush:
        monkeypatch.setattr(request_table, "_FLUSH_ROWS", flush)
    res = runner.run(_pressure())
    monkeypatch.setattr(request_table, "_FLUSH_ROWS", 10**9)
    scn = load_scenario(_pressure())
    dep = resolve(scn)
    specs = build_workload(scn)
    unfinished = broken = 0
    for entry in scn.policies:
        label = entry.label or entry.name
        knobs = runner.policy_knobs(scn, entry)
        limits = dep.limits_for(entry.name, knobs)
        sim = Simulation(
            specs,
            [(runner.make_policy(entry.name, limits, **knobs), dep.latency())],
            limits.max_model_len,
            horizon_s=scn.horizon_s,
        )
        rec = sim.run()
        kept_requests, kept_steps = rec.requests_frame(), rec.steps_frame()
        ours = res.requests[res.requests["policy"] == label].drop(columns="policy").reset_index(drop=True)
        pd.testing.assert_frame_equal(ours, kept_requests)
        ours_steps = res.steps[res.steps["policy"] == label].drop(columns="policy").reset_index(drop=True)
        pd.testing.assert_frame_equal(ours_steps, kept_steps)
        assert res.summaries[label]["itl_s"] == rec.itl_stats()
        unfinished += int((kept_requests["state"] == "unfinished").sum())
        broken += sum(bool(r.runs) for r in rec.records)
    assert broken  # broken token runs: the table's closed runs are exercised
    assert unfinished and (res.requests["reason"] == "horizon reached").any()
    assert np.isnan(res.requests["admitted_s"]).any()  # never arrived, or never admitted


def test_a_compact_run_holds_only_the_requests_it_has_not_ended(monkeypatch):
    _columns(monkeypatch, True)
    scn = load_scenario(_pressure(policies=[{"name": "vllm-v1"}]))
    dep = resolve(scn)
    entry = scn.policies[0]
    limits = dep.limits_for(entry.name, runner.policy_knobs(scn, entry))
    specs = build_workload(scn)
    held = []
    sim = Simulation(
        specs,
        [(runner.make_policy(entry.name, limits), dep.latency())],
        limits.max_model_len,
        horizon_s=scn.horizon_s,
        compact=True,
    )
    real_end = sim.replicas[0]._end

    def end(rec, state, reason=""):
        real_end(rec, state, reason)
        arrived_not_ended = sim.replicas[0].submitted - (len(held) + 1)
        held.append(sum(r is not None for r in sim.records) - arrived_not_ended)

    sim.replicas[0]._end = end
    gc.collect()
    before = sum(type(o) is RequestRecord for o in gc.get_objects())
    rec = sim.run()
    frame = rec.requests_frame()
    # while it ran: the records held are the requests arrived and not ended, and the next two
    # arrivals' (the arrival clock reads one ahead: sim.engine.arrivals_on_the_clock's arrival_after_next)
    assert held and set(held) <= {0, 1, 2}
    gc.collect()
    live = sum(type(o) is RequestRecord for o in gc.get_objects()) - before
    assert live == int((frame["state"] == "unfinished").sum()) == sum(r is not None for r in rec.records)


def test_request_counts_are_int32_and_a_value_past_it_widens_its_column():
    from sim.metrics.recorder import Recorder
    from sim.workload.request_spec import RequestSpec

    rec = Recorder()
    for spec in (RequestSpec("a", 0.0, 5, 3, 7), RequestSpec("b", 1.0, 6, 4, 2**40)):
        rec.add_request(RequestRecord(spec))
    frame = rec.requests_frame()
    assert frame["max_tokens"].dtype == np.int64 and frame["max_tokens"].tolist() == [7, 2**40]
    assert frame["prompt_tokens"].dtype == np.int32 and frame["prompt_tokens"].tolist() == [5, 6]
    assert frame["arrival_s"].dtype == np.float64 and frame["id"].tolist() == ["a", "b"]


def test_the_run_reads_the_columns_as_it_reads_the_list(monkeypatch):
    """Where simulated time stops, the workload's cuts and its sends, from the arrays (no spec made)."""
    from sim.workload.closed_loop import send_plan

    raw = small_scenario(num_requests=300)
    raw["workload"]["prompt_tokens"] = {"dist": "uniform", "min": 8, "max": 400}  # some clipped to 255
    scn = load_scenario(raw)
    _columns(monkeypatch, False)
    listed = build_workload(scn)
    _columns(monkeypatch, True)
    cols = build_workload(scn)
    assert runner.time_limit(scn, cols) == runner.time_limit(scn, listed)
    cuts = runner.workload_cuts(cols)
    assert cuts == runner.workload_cuts(listed) and sum(cuts.values()) > 10
    assert send_plan(scn, cols) is None is send_plan(scn, listed)
