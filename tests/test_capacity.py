"""Capacity search and replica planning: the answer on scenarios/capacity.yaml is a true boundary
(checked by fresh runs at rate × (1 ± tolerance)), the search survives a non-monotone curve,
the plan's replica count is minimal, its cost follows the stated formula, and every misuse is a
clear error."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from sim.errors import CbsimError
from sim.planning.capacity import capacity, min_requests, search_capacity
from sim.planning.plan import plan
from sim.planning.sweep import execute
from sim.runner import run
from sim.scenario.schema import load_scenario
from tests.helpers import small_scenario

SMALL = small_scenario(seed=1, num_requests=80, policies=[{"name": "orca"}], cost_per_gpu_hour=2.0)


def cli(*args):
    from sim.cli.main import app

    return CliRunner().invoke(app, list(args), terminal_width=200)


def slo_met(scenario, label: str, rate: float, extra=()) -> bool:
    return run(scenario, [*extra, f"workload.arrival.rate={rate!r}"], policies=[label]).summaries[label]["slo_met"]


def steady_met(scenario, label: str, rate: float, saturated) -> bool:
    """A fresh probe outside the search: the steady-state verdict with its own probe sizing."""
    from sim.planning.probe import judge

    return judge(load_scenario(scenario), label, [f"workload.arrival.rate={rate!r}"], rate, saturated).met


def test_capacity_yaml_answer_is_a_true_boundary(repo, tmp_path):
    path = repo / "scenarios" / "capacity.yaml"
    # one seed: the boundary is checked below against single-seed probes
    r = cli("capacity", str(path), "--policy", "vllm-v1", "--tolerance", "0.05", "--seeds", "1",
            "--json", str(tmp_path / "cap.json"))
    assert r.exit_code == 0, r.output
    found = json.loads((tmp_path / "cap.json").read_text())["policies"]
    assert list(found) == ["vllm-v1"]
    tol = 0.05
    checks = []
    for label, res in found.items():
        rate = res["rate_rps"]
        assert f"{rate:.4g}" in r.output  # the table prints it
        assert res["tolerance"] == tol and res["runs"] >= len(res["probes"])
        assert res["monotone"] is True
        assert rate < res["saturated_rps"]
        assert 0 < res["goodput_rps"] <= res["offered_rps"] + 1e-12
        checks += [(path, label, rate * (1 + tol), res["saturated_rps"], False),
                   (path, label, rate * (1 - tol), res["saturated_rps"], True)]
    got = {}
    execute(steady_met, [c[:4] for c in checks], lambda i, met: got.__setitem__(i, met), workers=2)
    for i, (_, label, rate, _, expected) in enumerate(checks):
        assert got[i] is expected, f"{label} at {rate:.4g} req/s: met {got[i]}, expected {expected}"


def test_search_on_a_small_scenario_meets_its_guarantee():
    scn = load_scenario(SMALL)
    res = search_capacity(scn, "orca", tolerance=0.05)
    assert res.rate_rps < res.saturated_rps
    assert steady_met(scn, "orca", res.rate_rps, res.saturated_rps)
    assert not steady_met(scn, "orca", res.rate_rps * 1.05, res.saturated_rps)
    assert res.violating_rate_rps == res.rate_rps * 1.05
    met = dict(res.probes)
    assert met[res.rate_rps] and not met[res.violating_rate_rps] and met[res.rate_rps * 0.95]
    # bracketing doubles from the scenario's rate: its first probes are 5, 10, ...
    assert [r for r, _ in res.probes[:2]] == [5.0, 10.0]
    assert res.summary["steady"]["goodput_rps"] == res.goodput_rps


def fake_curve(monkeypatch, meets):
    import sim.planning.probe as probe_mod

    def judge(scn, label, overrides, load, saturated, max_growth=None, start=None):
        rate = float(overrides[0].split("=")[1])
        ok = meets(rate)
        steady = {"goodput_rps": rate, "offered_rps": rate, "achieved_rps": rate, "ttft_s": {"p99": 1.0},
                  "tpot_s": {"p99": 0.01}, "e2e_s": {"p99": 2.0}}
        summary = {"slo_met": ok, "goodput_rps": rate, "throughput_rps": rate, "requests_total": 100,
                   "requests_finished": 100, "ttft_s": {"p99": 1.0}, "tpot_s": {"p99": 0.01}, "e2e_s": {"p99": 2.0},
                   "steady": steady}
        return probe_mod.Verdict(met=ok, stable=True, saturated=False, sizes=[(100, ok)], summary=summary)

    monkeypatch.setattr(probe_mod, "judge", judge)
    monkeypatch.setattr(probe_mod, "saturated_rate", lambda scn, label, overrides=(): (None, 0))


def test_bisection_reaches_the_tolerance_on_a_known_curve(monkeypatch):
    fake_curve(monkeypatch, lambda r: r <= 7.3)
    res = search_capacity(load_scenario(SMALL), "orca", tolerance=0.01)
    assert 7.3 / 1.01 <= res.rate_rps <= 7.3 < res.rate_rps * 1.01
    assert res.runs <= 13  # probes + the saturation burst


def test_a_meeting_rate_above_the_bracket_moves_the_answer_up(monkeypatch):
    # met below 10 and again on (10.05, 10.6): the check at lo × 1.02 ≈ 10.09 meets, so the
    # search continues above it and ends at the second region's edge
    fake_curve(monkeypatch, lambda r: r < 10 or 10.05 < r < 10.6)
    res = search_capacity(load_scenario(SMALL), "orca", tolerance=0.02)
    assert 10.6 / 1.02 < res.rate_rps < 10.6 <= res.violating_rate_rps
    met = dict(res.probes)
    assert met[res.violating_rate_rps] is False and met[res.rate_rps * 0.98] is True
    assert any(10 <= r <= 10.05 * 1.02 and m for r, m in res.probes)  # the check that moved it
    assert res.monotone is True


def test_a_dip_just_below_the_answer_is_flagged(monkeypatch):
    fake_curve(monkeypatch, lambda r: r < 6 and not 5.75 < r < 5.85)
    res = search_capacity(load_scenario(SMALL), "orca", tolerance=0.02)
    assert 6 / 1.02 < res.rate_rps < 6 and 5.75 < res.rate_rps * 0.98 < 5.85
    assert res.monotone is False


def test_min_requests_closed_form():
    slo = load_scenario(SMALL).slo
    assert min_requests(slo, 20.0, 0.02) == math.ceil(0.5 * 20 * 1.02 / 0.02)
    assert min_requests(load_scenario({**SMALL, "slo": {"tpot_s": 0.1}}).slo, 20.0, 0.02) is None


def test_capacity_errors_name_the_fix(monkeypatch):
    with pytest.raises(CbsimError, match=r"capacity needs an SLO: add slo: \{ttft_s"):
        capacity({**SMALL, "slo": {"percentile": 99}})
    written = {**SMALL, "workload": {"requests": [{"prompt_tokens": 4, "output_tokens": 2}]}}
    with pytest.raises(CbsimError, match="written-out workload.requests"):
        capacity(written)
    with pytest.raises(CbsimError, match="between 0 and 1"):
        capacity(SMALL, tolerance=2)
    with pytest.raises(CbsimError, match="did you mean 'orca'"):
        capacity(SMALL, policies=["orka"])
    fake_curve(monkeypatch, lambda r: True)
    with pytest.raises(CbsimError, match="raise workload.num_requests"):
        search_capacity(load_scenario(SMALL), "orca")
    fake_curve(monkeypatch, lambda r: False)
    with pytest.raises(CbsimError, match="not met even at"):
        search_capacity(load_scenario(SMALL), "orca")


def test_cli_without_slo_is_one_clear_error(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(load_scenario({**SMALL, "slo": {}}).to_yaml())
    r = cli("capacity", str(path))
    assert isinstance(r.exception, CbsimError) and "capacity needs an SLO" in str(r.exception)


# --- plan ------------------------------------------------------------------------------------
def test_plan_finds_the_fewest_replicas_and_prices_them(tmp_path):
    scn = load_scenario(SMALL, ["replicas.router=least-outstanding", "workload.num_requests=120"])
    target = 60.0
    p = plan(scn, target, workers=1)["orca"]
    n = p.replicas
    assert n is not None and n > 1
    extra = ["replicas.router=least-outstanding", "workload.num_requests=120"]
    from sim.planning.probe import judge

    base = load_scenario(SMALL, [*extra, f"workload.arrival.rate={target!r}"])
    assert judge(base, "orca", [f"replicas.count={n}"], target / n, p.saturated_rps).met is True
    assert judge(base, "orca", [f"replicas.count={n - 1}"], target / (n - 1), p.saturated_rps).met is False
    assert dict(p.probes)[n] is True and dict(p.probes)[n - 1] is False
    assert p.summary["replicas"] == n
    # GPUs = replicas × hardware.count; money per million = GPUs × price / (3600 × rate) × 1e6
    assert p.gpus == n * scn.hardware.count and p.gpu_hours_per_hour == p.gpus
    assert p.cost_per_hour == pytest.approx(p.gpus * 2.0)
    assert p.cost_per_million_requests == pytest.approx(p.gpus * 2.0 / (3600 * target) * 1e6)


def test_plan_reports_when_max_replicas_is_not_enough():
    p = plan(SMALL, 60.0, max_replicas=1, workers=1)["orca"]
    assert p.replicas is None and p.gpus is None and p.probes[-1] == (1, False)


def test_plan_cli_prints_replicas_and_cost(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(load_scenario(SMALL, ["replicas.router=least-outstanding"]).to_yaml())
    r = cli("plan", str(path), "--target-rate", "60", "--seeds", "1", "--json", str(tmp_path / "plan.json"))
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "plan.json").read_text())["policies"]["orca"]
    assert f"{got['cost_per_million_requests']:,.2f}" in r.output
    assert "GPUs = replicas × hardware.count" in r.output
    r = cli("plan", str(path), "--target-rate", "0")
    assert isinstance(r.exception, CbsimError) and "--target-rate" in str(r.exception)


def test_plan_warns_when_each_replica_sees_too_few_requests(repo):
    from types import SimpleNamespace

    from sim.cli.plan import short_run_notes
    from sim.scenario.schema import load_scenario

    scn = load_scenario(repo / "scenarios/capacity.yaml", ["workload.num_requests=100"])
    notes = short_run_notes(scn, {"v1": SimpleNamespace(replicas=5)}, 20.0)
    assert len(notes) == 1 and "about 20 requests" in notes[0] and "num_requests" in notes[0]
    assert short_run_notes(scn, {"v1": SimpleNamespace(replicas=1)}, 20.0) == []
    scn = load_scenario(repo / "scenarios/capacity.yaml", ["workload.num_requests=2000"])
    assert short_run_notes(scn, {"v1": SimpleNamespace(replicas=5)}, 20.0) == []
