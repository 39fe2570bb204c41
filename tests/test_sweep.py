"""Sweeps: rate and --vary parsing, one row per point and policy, resume after a rerun or an
interruption, the same table from one process or a pool, the CLI and its plot."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

import sim.planning.sweep as sweep_mod
from sim.errors import CbsimError
from sim.planning.sweep import (
    estimate_capacity,
    flatten,
    make_points,
    parse_rates,
    parse_vary,
    split_top_level,
    sweep,
)
from sim.runner import run
from sim.scenario.schema import load_scenario
from tests.helpers import small_scenario

# tiny model, one 10 ms step per iteration: a point simulates in milliseconds
SMALL = small_scenario(seed=1)


# --- parsing ---------------------------------------------------------------------------------
def test_rates_include_stop_and_are_float_safe():
    assert parse_rates("2:40:2") == [float(r) for r in range(2, 41, 2)]
    tenth = parse_rates("0.1:1:0.1")
    assert len(tenth) == 10 and tenth[-1] == 1.0 and tenth[2] == 0.3  # not 0.30000000000000004
    assert parse_rates("0.1:0.35:0.1") == [0.1, 0.2, 0.3]  # stop not on the grid: not passed
    assert parse_rates("3:3:1") == [3.0]
    assert parse_rates("2, 4,8") == [2.0, 4.0, 8.0]
    assert parse_rates("1e1") == [10.0]


@pytest.mark.parametrize("text, words", [
    ("2:40", "start:stop:step"),
    ("1:2:3:4", "start:stop:step"),
    ("a:4:1", "start 'a' is not a number"),
    ("2:40:0", "step must be positive"),
    ("2:40:-2", "step must be positive"),
    ("40:2:2", "below start"),
    ("0:4:2", "must be positive"),
    ("-1,2", "must be positive"),
    ("nan:4:1", "not a finite number"),
    ("1:inf:1", "not a finite number"),
    ("", "empty"),
    ("1:100000:0.001", "at most"),
    ("2,,4", "not a number"),
])
def test_bad_rates_are_clear_errors(text, words):
    with pytest.raises(CbsimError, match=words):
        parse_rates(text)


def test_vary_parsing_keeps_bracketed_values_whole():
    assert parse_vary("engine.max_num_batched_tokens=2048,4096, 8192") == (
        "engine.max_num_batched_tokens", ["2048", "4096", "8192"])
    assert parse_vary("workload.trace.window_s=[0, 600],[0, 60]")[1] == ["[0, 600]", "[0, 60]"]
    assert split_top_level("{a: 1, b: 2},3") == ["{a: 1, b: 2}", "3"]
    for bad, words in (("engine.max_num_seqs", "FIELD=V1"), ("=1,2", "FIELD=V1"), ("a=1,,2", "empty"),
                       ("a=1,1", "repeated")):
        with pytest.raises(CbsimError, match=words):
            parse_vary(bad)


def test_points_of_a_grid_cover_every_value_at_every_rate():
    pts = make_points([1.0, 2.0], ("engine.max_num_seqs", ["4", "8"]))
    assert [(p.value, p.rate) for p in pts] == [("4", 1.0), ("4", 2.0), ("8", 1.0), ("8", 2.0)]
    assert pts[1].overrides == ("engine.max_num_seqs=4", "workload.arrival.rate=2.0")
    with pytest.raises(CbsimError, match="--rates"):
        make_points(None, None)


def test_flatten_joins_nested_keys_with_dots():
    assert flatten({"a": 1, "b": {"c": 2, "d": {"e": None}}}) == {"a": 1, "b.c": 2, "b.d.e": None}


# --- running ---------------------------------------------------------------------------------
def test_one_row_per_point_and_policy_matching_single_runs(tmp_path):
    res = sweep(SMALL, make_points([4.0, 8.0, 16.0]), tmp_path, workers=1)
    t = res.table
    assert list(t["rate"]) == [4.0, 4.0, 8.0, 8.0, 16.0, 16.0]
    assert list(t["policy"]) == ["static", "orca"] * 3
    assert list(t["point"]) == [0, 0, 1, 1, 2, 2]
    assert {"ttft_s.p99", "tpot_s.p50", "utilization.kv", "goodput_rps", "slo_met"} <= set(t.columns)
    # each row is exactly the summary `cbsim run --set workload.arrival.rate=R` gives
    single = run(SMALL, ["workload.arrival.rate=8.0"])
    for label in ("static", "orca"):
        row = t[(t["rate"] == 8.0) & (t["policy"] == label)].iloc[0]
        for col, value in flatten(single.summaries[label]).items():
            assert row[col] == value or (value is None and pd.isna(row[col])), col
    assert res.ran == 3 and res.skipped == 0
    assert pd.read_parquet(tmp_path / "sweep.parquet").equals(t)
    assert (tmp_path / "latency_vs_load.png").stat().st_size > 10_000


def test_resume_skips_points_on_disk_and_reuses_them_exactly(tmp_path, monkeypatch):
    first = sweep(SMALL, make_points([4.0, 8.0]), tmp_path, workers=1, plot=False)
    calls = []
    real = sweep_mod.run_point

    def counting(scn, policies):
        calls.append(scn.workload.arrival.rate)
        return real(scn, policies)

    monkeypatch.setattr(sweep_mod, "run_point", counting)
    again = sweep(SMALL, make_points([4.0, 8.0, 12.0]), tmp_path, workers=1, plot=False)
    assert calls == [12.0] and again.ran == 1 and again.skipped == 2
    pd.testing.assert_frame_equal(again.table.iloc[:4].reset_index(drop=True), first.table)
    # a changed scenario changes every point's key: nothing stale is reused
    calls.clear()
    sweep(SMALL, make_points([4.0, 8.0]), tmp_path, overrides=["seed=2"], workers=1, plot=False)
    assert calls == [4.0, 8.0]


def test_an_interrupted_sweep_keeps_finished_points_and_no_partial_file(tmp_path, monkeypatch):
    real = sweep_mod.run_point

    def interrupted(scn, policies):
        if scn.workload.arrival.rate == 12.0:
            raise KeyboardInterrupt
        return real(scn, policies)

    monkeypatch.setattr(sweep_mod, "run_point", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sweep(SMALL, make_points([4.0, 8.0, 12.0, 16.0]), tmp_path, workers=1, plot=False)
    files = sorted(p.name for p in (tmp_path / "points").iterdir())
    assert len(files) == 2 and all(f.endswith(".parquet") for f in files)
    assert not (tmp_path / "sweep.parquet").exists()
    monkeypatch.setattr(sweep_mod, "run_point", real)
    done = sweep(SMALL, make_points([4.0, 8.0, 12.0, 16.0]), tmp_path, workers=1, plot=False)
    assert done.ran == 2 and done.skipped == 2
    fresh = sweep(SMALL, make_points([4.0, 8.0, 12.0, 16.0]), tmp_path / "fresh", workers=1, plot=False)
    pd.testing.assert_frame_equal(done.table, fresh.table)


def test_a_process_pool_gives_the_same_table_as_one_process(tmp_path):
    pts = make_points([4.0, 8.0, 12.0])
    one = sweep(SMALL, pts, tmp_path / "one", workers=1, plot=False).table
    pool = sweep(SMALL, pts, tmp_path / "pool", workers=2, plot=False).table
    pd.testing.assert_frame_equal(one, pool)


def test_vary_any_field_gets_its_own_typed_column(tmp_path):
    pts = make_points(None, parse_vary("engine.max_num_seqs=2,8"))
    t = sweep(SMALL, pts, tmp_path, workers=1).table
    assert list(t["engine.max_num_seqs"]) == [2, 2, 8, 8]
    assert t["rate"].eq(5.0).all()
    orca = t[t["policy"] == "orca"].set_index("engine.max_num_seqs")
    assert orca.loc[2, "max_running"] <= 2 < orca.loc[8, "max_running"]
    assert not (tmp_path / "latency_vs_load.png").exists()  # no rates: no latency-vs-load plot


def test_bad_points_fail_before_anything_runs(tmp_path):
    with pytest.raises(CbsimError, match="engine.max_num_seqs"):
        sweep(SMALL, make_points(None, parse_vary("engine.max_num_seqs=4,zero")), tmp_path, workers=1)
    assert not (tmp_path / "points").exists()
    written = {**SMALL, "workload": {"requests": [{"prompt_tokens": 4, "output_tokens": 2}]}}
    with pytest.raises(CbsimError, match="no arrival rate"):
        sweep(written, make_points([1.0]), tmp_path, workers=1)
    with pytest.raises(CbsimError, match="did you mean 'orca'"):
        sweep(SMALL, make_points([1.0]), tmp_path, policies=["orka"], workers=1)


def test_estimated_capacity_is_the_last_rate_before_the_first_violation():
    t = pd.DataFrame({"point": [0, 1, 2, 3], "rate": [1.0, 2.0, 3.0, 4.0], "policy": ["a"] * 4,
                      "key": list("wxyz"), "slo_met": [True, True, False, True]})
    assert estimate_capacity(t) == {"a": 2.0}


# --- the command -----------------------------------------------------------------------------
def cli(*args):
    from sim.cli.main import app

    return CliRunner().invoke(app, list(args))


def test_cli_writes_table_and_plot_and_resumes(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(load_scenario(SMALL).to_yaml())
    out = tmp_path / "out"
    r = cli("sweep", str(path), "--rates", "4:12:4", "--out", str(out), "--workers", "1", "-q")
    assert r.exit_code == 0, r.output
    assert "3 point(s) simulated, 0 already on disk" in r.output
    t = pd.read_parquet(out / "sweep.parquet")
    assert sorted(set(t["rate"])) == [4.0, 8.0, 12.0] and len(t) == 6
    assert (out / "latency_vs_load.png").exists()
    r = cli("sweep", str(path), "--rates", "4:16:4", "--out", str(out), "--workers", "1", "-q")
    assert "1 point(s) simulated, 3 already on disk" in r.output
    r = cli("sweep", str(path), "--rates", "4:2:1", "--out", str(out))
    assert isinstance(r.exception, CbsimError) and "below start" in str(r.exception)
