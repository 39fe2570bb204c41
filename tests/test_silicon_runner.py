"""bench/silicon_accuracy.py's runner: the order rows are taken in, the partial report that keeps every
finished row, and resuming it only under the same code and settings (issue 26, the whole corpus in one
run). What the rows' results are is the bench's job; here only that the runner neither loses nor
invents one."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import require_aic


def _row(rid, concurrency=8, osl=128):
    from bench.silicon_accuracy import Row

    return Row(id=rid, engine="vllm", version="", model="m", system="h200_sxm", precision="fp8", tp=1, isl=1024,
               osl=osl, concurrency=concurrency, ttft_ms=100.0, tpot_ms=10.0)


@pytest.fixture
def costs(tmp_path, monkeypatch):
    import bench.silicon_accuracy as sa

    monkeypatch.setattr(sa, "CACHE", tmp_path)
    monkeypatch.setattr(sa, "COSTS", tmp_path / "row_cpu_s.json")
    return sa


def test_rows_run_longest_first_by_their_last_measured_cpu_time(costs):
    """Unknown rows by decoded tokens (1 us each); a row measured before by its measured CPU seconds,
    scaled by the rounds asked; ties by id, so the order never depends on the input's."""
    sa = costs
    rows = [_row("a", 8, 127), _row("b", 512, 1999), _row("c", 4, 8191), _row("d", 8, 127)]
    assert [r.id for r in sa.longest_first(rows)] == ["b", "c", "a", "d"]  # 4.1, 0.13, 0.004 s
    assert sa.cost_estimate(rows[1]) == pytest.approx(512 * 4 * 2000 * 1e-6)
    res = [sa.Result(id="a", group="g", ttft_ms=1.0, tpot_ms=1.0, cpu_s=30.0),
           sa.Result(id="c", group="g", ttft_ms=1.0, tpot_ms=1.0, cpu_s=0.0)]  # not measured: not kept
    sa.remember_costs(res, rounds=8)  # 30 s at 8 rounds is 15 s at the default 4
    assert json.loads(sa.COSTS.read_text()) == {"a": 15.0}
    assert [r.id for r in sa.longest_first(rows)] == ["a", "b", "c", "d"]
    assert sa.cost_estimate(rows[0], rounds=2, known=sa.known_costs()) == pytest.approx(7.5)
    sa.COSTS.write_text("not json")  # a damaged file costs only the order
    assert sa.known_costs() == {} and [r.id for r in sa.longest_first(rows)] == ["b", "c", "a", "d"]


def _result(sa, rid, ttft=1.5):
    return sa.Result(id=rid, group="g", ttft_ms=1.0, tpot_ms=1.0, sim_ttft_ms=ttft, sim_tpot_ms=float("nan"),
                     ttft_err=ttft - 1.0, extra={"phases": {"random": {"ttft_err": ttft - 1.0}}})


@pytest.fixture
def digest(monkeypatch):
    """The code's digest fixed (computing it reads every module of sim/ and policies/)."""
    import bench.silicon_accuracy as sa

    monkeypatch.setattr(sa, "results_digest", lambda: "c0de")


def test_the_partial_report_keeps_every_finished_row_and_resumes_only_under_the_same_settings(tmp_path, digest):
    import bench.silicon_accuracy as sa

    out = tmp_path / "report.json"
    settings = {"rounds": 4, "send_gap_ms": 1.0, "phases": ["random"]}
    first = sa.Partial(out, settings, resume=False)
    first.add(_result(sa, "a"))
    first.add(_result(sa, "b", 2.0))
    # a crash: the file stays, its last line cut short
    part = sa.partial_path(out)
    part.write_text(part.read_text() + '{"id": "c", "gro')
    again = sa.Partial(out, settings, resume=True)
    assert sorted(again.done) == ["a", "b"]  # the cut line's row is simulated again
    assert again.done["b"].sim_ttft_ms == 2.0 and again.done["a"].extra["phases"]["random"]["ttft_err"] == 0.5
    assert again.done["a"].sim_tpot_ms != again.done["a"].sim_tpot_ms  # NaN survives the round trip
    again.add(_result(sa, "c"))
    again.close(finished=False)
    assert sorted(sa.Partial(out, settings, resume=True).done) == ["a", "b", "c"]
    other = dict(settings, rounds=8)
    assert sa.Partial(out, other, resume=True).done == {}  # other settings: nothing reused
    assert sa.Partial(out, settings, resume=True).done == {}  # ... and the partial was started afresh
    fresh = sa.Partial(out, settings, resume=False)
    assert fresh.done == {} and len(part.read_text().splitlines()) == 1  # without --resume: a new file


def test_a_finished_report_is_resumed_under_the_same_code_and_settings_and_its_partial_removed(tmp_path, digest):
    import bench.silicon_accuracy as sa

    out = tmp_path / "report.json"
    settings = {"rounds": 4, "send_gap_ms": 1.0, "phases": ["random"]}
    p = sa.Partial(out, settings, resume=False)
    out.write_text(json.dumps({"resume": p.header, "rows": [vars(_result(sa, "a"))]}, default=str))
    p.close(finished=True)
    assert not sa.partial_path(out).exists()
    assert sorted(sa.Partial(out, settings, resume=True).done) == ["a"]
    sa.partial_path(out).unlink()  # (that resume started a partial with the row in it)
    stale = dict(p.header, code="000000000000")
    out.write_text(json.dumps({"resume": stale, "rows": [vars(_result(sa, "a"))]}, default=str))
    assert sa.Partial(out, settings, resume=True).done == {}  # other code: simulated again


def test_run_rows_hands_every_result_over_as_it_lands(monkeypatch):
    import bench.silicon_accuracy as sa

    monkeypatch.setattr(sa, "simulate", lambda w: _result(sa, w[0].id))
    seen = []
    rows = [_row(f"r{i}") for i in range(5)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        got = sa.run_rows(pool, [(r, "t", 4, 1e-3, ["random"]) for r in rows], seen.append, show_progress=False)
    assert sorted(r.id for r in got) == [r.id for r in rows] and [r.id for r in seen] == [r.id for r in got]


def test_resume_without_a_report_is_refused_in_one_line():
    import bench.silicon_accuracy as sa

    with pytest.raises(SystemExit, match="--resume takes the rows of an earlier --json report"):
        sa.main(["--resume"])


def test_the_code_digest_follows_the_code_not_its_comments_or_docstrings(tmp_path, monkeypatch):
    import bench.silicon_accuracy as sa

    for d in ("bench", "sim", "policies", "calib/sources"):
        (tmp_path / d).mkdir(parents=True)
    src = tmp_path / "sim" / "engine.py"
    src.write_text('"""The engine."""\n\ndef step(d):\n    """A step."""\n    return d + 1  # the next\n')
    (tmp_path / "bench" / "silicon_accuracy.py").write_text("ROUNDS = 4\n")
    monkeypatch.setattr(sa, "ROOT", tmp_path)
    before = sa.results_digest()
    src.write_text('"""The engine, said otherwise."""\n\ndef step(d):\n    """Two lines\n    now."""\n'
                   "    return d + 1\n")
    assert sa.results_digest() == before
    src.write_text('def step(d):\n    return d + 2\n')
    assert sa.results_digest() != before


def test_two_bench_processes_building_one_table_both_get_it(tmp_path, monkeypatch):
    """Two bench runs sharing bench/.cache may compose the same table at once: the one that
    finishes second finds the folder already there (rename fails with "Directory not empty") and
    must return that table, not crash, and leave no temporary folder behind."""
    require_aic()  # the table is composed from the kernel database (cbsim[gpu-data])
    import bench.silicon_accuracy as sa
    from bench.silicon_accuracy import Row, build_one, classify

    monkeypatch.setattr(sa, "CACHE", tmp_path)
    row = Row(id="r", engine="vllm", version="0.12.0", model="nvidia/Llama-3.1-8B-Instruct-FP8", system="h200_sxm",
              precision="fp8", tp=8, isl=1000, osl=100, concurrency=8, ttft_ms=1.0, tpot_ms=1.0)
    classify([row])
    assert not row.skip, row.skip
    first = build_one((row.table_key, "d"))
    assert first[1] and not first[2], first
    out = sa.table_dir(row.table_key, "d")
    (out / "metadata.json").rename(out / "metadata.moved")  # this process did not see the first's table
    (out / "metadata.moved").with_name("keep").write_text("first")  # the folder is not empty
    second = build_one((row.table_key, "d"))
    assert second == first
    assert (out / "keep").read_text() == "first"  # the first process's table is the one kept
    assert sorted(p.name for p in tmp_path.joinpath("d").iterdir()) == [out.name]
