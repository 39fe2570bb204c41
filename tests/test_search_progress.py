"""Search commands run independent probes in worker processes and say what they probe, without
changing a single verdict: the disaggregated plan is the same with one process or with workers,
and the progress reporter hears every run, named by its point and probe size."""

from __future__ import annotations

from sim.planning.progress import Reporter, point, probe, reporting
from tests.helpers import long_prompt_disagg_scenario

SCENARIO = long_prompt_disagg_scenario()


class Recorder(Reporter):
    def __init__(self):
        self.probes: list[str] = []
        self.bars: list[int] = []
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc):
        return False

    def probe(self, text):
        self.probes.append(text)

    def run_bar(self, total):
        self.bars.append(total)
        return None


def test_workers_give_the_plan_one_process_gives_and_every_run_is_named():
    from sim.planning.disagg_plan import plan_disaggregated

    heard = Recorder()
    alone = plan_disaggregated(SCENARIO, 6.0, max_instances=4, jobs=1, reporter=heard)
    pooled = plan_disaggregated(SCENARIO, 6.0, max_instances=4, jobs=2)
    assert alone.to_dict() == pooled.to_dict()  # layouts, verdicts, p99s, probe order, run count
    assert alone.best is not None and alone.runs > len(alone.probes)
    # one process: every simulation was announced (runs and bursts) and ticked a bar of its size
    assert heard.entered == 1 and len(heard.probes) == alone.runs == len(heard.bars)
    assert any(t.startswith("1P1D (TP 1/1) at 6 req/s: 320 requests") for t in heard.probes), heard.probes
    assert any("saturation burst of" in t for t in heard.probes)
    assert any(t.startswith("chunked colocated, 1 replica(s) of TP 1") for t in heard.probes)
    assert 320 in heard.bars and 2 * 320 in heard.bars


def test_nothing_is_reported_without_a_reporter_and_points_nest():
    assert probe("x") is False
    heard = Recorder()
    with reporting(heard):
        with point("outer"):
            with point("inner"):
                assert probe("run") is heard
            probe("again")
        probe("bare")
    assert probe("after") is False
    assert heard.probes == ["inner: run", "outer: again", "bare"]
