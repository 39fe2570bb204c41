"""The quickstart tells what the seeds teach: on one GPU and workload, continuous batching serves
several times the requests of static batching, and `cbsim run` prints that ratio and its reasons."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from sim.planning import story
from sim.runner import run
from sim.scenario.schema import load_scenario


def test_quickstart_prints_a_capacity_ratio_of_vllm_v1_over_static_above_2(repo, tmp_path):
    from sim.cli.main import app

    r = CliRunner().invoke(app, ["run", str(repo / "scenarios" / "quickstart.yaml"), "--out", str(tmp_path / "q"),
                                 "--no-plots", "-q"], terminal_width=200)
    assert r.exit_code == 0, r.output
    m = re.search(r"continuous batching serves ([\d.]+)x the requests of static batching", r.output)
    assert m, r.output
    ratios = dict(re.findall(r"(\S+) [\d.]+ \(([\d.]+)x static\)", r.output))
    print("capacity ratio vllm-v1 / static:", ratios["vllm-v1"], "orca / static:", ratios["orca"])
    assert float(ratios["vllm-v1"]) > 2 and float(ratios["orca"]) > 1
    assert "idle slots" in r.output and "fragmentation" in r.output
    assert "steady state: offered / achieved" in r.output


def test_the_story_numbers_are_the_saturated_throughputs():
    scn = load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=300"])
    assert story.applies(scn)
    sat = story.saturated_rates(scn)
    assert sat["vllm-v1"] / sat["static"] > 2
    result = run(scn)
    lines = story.story(result, sat)
    assert f"{sat['vllm-v1'] / sat['static']:.1f}x" in lines[0]
    # static falls behind at the quickstart's load: it achieves about its saturated throughput
    st = result.summaries["static"]["steady"]
    assert st["achieved_rps"] is None or st["achieved_rps"] < st["offered_rps"]
