"""One verdict and its spread: ``plan`` and ``capacity`` judge every load at several workload seeds
and pass it only when every seed passes (sim.planning.probe.judge_seeds).

The scenario below sits at the edge on purpose: one replica of Orca at 33 req/s meets p99 TTFT
0.5 s with seed 1 and misses it with seed 2 (steady p99 TTFT about 0.29 s and 0.67 s)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sim.errors import CbsimError
from sim.planning.capacity import capacity
from sim.planning.plan import plan
from sim.planning.probe import judge, judge_seeds, saturated_rate
from sim.scenario.schema import load_scenario
from tests.helpers import small_scenario

EDGE = small_scenario(seed=1, num_requests=80, policies=[{"name": "orca"}])
RATE = 33.0


def cli(*args):
    from sim.cli.main import app

    return CliRunner().invoke(app, list(args), terminal_width=250)


def test_the_edge_load_passes_with_one_seed_and_fails_with_the_next():
    scn = load_scenario(EDGE)
    sat, _ = saturated_rate(scn, "orca")
    over = [f"workload.arrival.rate={RATE!r}"]
    single = [judge(scn, "orca", [*over, f"seed={s}"], RATE, sat).met for s in (1, 2, 3)]
    assert single == [True, False, True]
    v = judge_seeds(scn, "orca", over, RATE, sat, seeds=3)
    assert v.met is False, "a load passes only when every seed passes"
    # the first seed that fails ends the probe: seed 3 cannot change the verdict
    assert [row[:2] for row in v.spread["per_seed"]] == [[1, True], [2, False]]
    values = [row[2] for row in v.spread["per_seed"]]
    assert v.spread["metric"] == "ttft_s" and v.spread["min"] == min(values) and v.spread["max"] == max(values)
    assert v.spread["min"] < 0.5 < v.spread["max"]
    first_two = [judge(scn, "orca", [*over, f"seed={s}"], RATE, sat) for s in (1, 2)]
    assert v.runs == sum(x.runs for x in first_two), "the judged seeds' runs are counted, no more"
    assert v.summary == first_two[1].summary, "the verdict is the failing seed's"
    # one seed is the single judge, unchanged
    assert judge_seeds(scn, "orca", over, RATE, sat, seeds=1).met is True


def test_plan_fails_a_count_that_one_seed_fails():
    one = plan(EDGE, RATE, workers=1)["orca"]
    three = plan(EDGE, RATE, workers=1, seeds=3)["orca"]
    assert one.replicas == 1 and three.replicas == 2
    assert dict(three.probes)[1] is False
    assert three.seeds == 3 and len(three.spread["per_seed"]) == 3 and all(r[1] for r in three.spread["per_seed"])
    assert three.per_replica_rps == RATE / 2


def test_capacity_with_seeds_is_no_higher_than_any_single_seed():
    three = capacity(EDGE, workers=1, seeds=3, tolerance=0.05)["orca"]
    assert three.rate_rps < RATE, "seed 2 already misses at 33 req/s"
    for s in (1, 2, 3):
        alone = capacity(EDGE, [f"seed={s}"], workers=1, tolerance=0.05)["orca"]
        assert three.rate_rps <= alone.rate_rps * 1.05 + 1e-9
    assert three.spread is not None and all(row[1] for row in three.spread["per_seed"])


def test_plan_cli_prints_the_spread_and_the_replicas_line(tmp_path):
    path = tmp_path / "edge.yaml"
    path.write_text(load_scenario(EDGE).to_yaml())
    r = cli("plan", str(path), "--target-rate", str(RATE), "--seeds", "3", "--json", str(tmp_path / "p.json"))
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "p.json").read_text())["policies"]["orca"]
    assert got["replicas"] == 2 and got["seeds"] == 3
    text = " ".join(r.output.split())
    lo, hi = got["spread"]["min"] * 1e3, got["spread"]["max"] * 1e3  # TPOT binds at 2 replicas: ms
    assert got["spread"]["metric"] == "tpot_s"
    assert f"orca: 2 replica(s) judged at 16.5 req/s each; spread p99 TPOT {lo:.3g}-{hi:.3g} ms over seeds 1-3" in text
    assert "every count judged at seeds 1-3 and met only when every seed met" in text
    assert "round-robin gives each replica every n-th arrival" in text
    assert "16.5" in text  # the per-replica rate judged


def test_bad_seed_counts_are_refused_in_one_line():
    for bad in (0, 101):
        with pytest.raises(CbsimError, match=r"^--seeds must be a whole number of workload seeds from 1 to 100"):
            plan(EDGE, RATE, seeds=bad)


def test_spare_workers_for_the_seeds_change_no_verdict():
    """With a seed pool (sim.planning.seed_pool: a one-policy search's spare cores), seeds 2, 3
    of a load whose first seed met run in a worker: the same verdicts, spreads and run counts."""
    from sim.planning.seed_pool import seed_workers

    scn = load_scenario(EDGE)
    sat, _ = saturated_rate(scn, "orca")
    loads = (RATE, 20.0)  # one where seed 2 fails, one where every seed meets
    alone = [judge_seeds(scn, "orca", [f"workload.arrival.rate={r!r}"], r, sat, seeds=3) for r in loads]
    with seed_workers(1):
        pooled = [judge_seeds(scn, "orca", [f"workload.arrival.rate={r!r}"], r, sat, seeds=3) for r in loads]
    assert [v.met for v in alone] == [False, True]
    for a, b in zip(alone, pooled):
        assert (a.met, a.stable, a.sizes, a.runs, a.spread) == (b.met, b.stable, b.sizes, b.runs, b.spread)
        assert a.summary == b.summary
