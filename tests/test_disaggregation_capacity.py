"""`cbsim capacity` on a disaggregated layout (issue 19): the whole xPyD topology searched as one
unit by the same machinery as a colocated policy. Its answer is a true boundary (fresh steady-state
probes at rate × (1 ± tolerance) violate and meet), never above the topology's saturated
throughput (a burst through both pools), and shown as its own row and JSON entry."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sim.errors import CbsimError
from sim.planning.capacity import capacity, labels_of, search_capacity
from sim.planning.probe import is_disaggregated, judge, saturated_rate
from sim.runner import run
from sim.scenario.schema import load_scenario

# the tiny model on the nominal CPU with roofline step times (batch-dependent), milliseconds a run;
# colocated: 2 replicas of vllm-v1; disaggregated: 1P1D on as many GPUs
PD = {"name": "pd-capacity", "seed": 3, "model": "tiny", "hardware": {"gpu": "cpu"},
      "latency": {"backend": "roofline"},
      "workload": {"num_requests": 300, "arrival": {"process": "poisson", "rate": 50.0},
                   "prompt_tokens": {"dist": "uniform", "min": 64, "max": 512},
                   "output_tokens": {"dist": "uniform", "min": 8, "max": 48}},
      "engine": {"max_model_len": 1024, "max_num_seqs": 16, "max_num_batched_tokens": 512},
      "policies": [{"name": "vllm-v1", "label": "colocated"}],
      "replicas": {"count": 2, "router": "least-outstanding"},
      "slo": {"ttft_s": 0.5, "tpot_s": 0.02, "percentile": 99},
      "disaggregation": {"label": "pd", "transfer": {"bandwidth_gbps": 1.0, "latency_s": 0.001}}}
TOL = 0.05


def steady_met(scn, rate: float, saturated: float | None) -> bool:
    """A fresh probe outside the search: the steady-state verdict with its own probe sizing."""
    return judge(scn, "pd", [f"workload.arrival.rate={rate!r}"], rate, saturated).met


def test_capacity_of_the_disaggregated_topology_is_a_true_boundary(tmp_path):
    from sim.cli.main import app

    path, out = tmp_path / "pd.yaml", tmp_path / "cap.json"
    path.write_text(load_scenario(PD).to_yaml())
    # one seed: the boundary is checked below against single-seed probes
    r = CliRunner().invoke(app, ["capacity", str(path), "--policy", "pd", "--tolerance", str(TOL), "--seeds", "1",
                                 "--json", str(out)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "pd (disaggregated)" in r.output
    found = json.loads(out.read_text())["policies"]
    assert list(found) == ["pd"]
    res = found["pd"]
    rate = res["rate_rps"]
    assert f"{rate:.4g}" in r.output
    assert res["disaggregated"] is True and res["gpus"] == 2 and res["stable"] and res["monotone"]
    # the ceiling is the topology's own burst, and the answer stays below it
    scn = load_scenario(PD)
    topology, burst = saturated_rate(scn, "pd")
    one_replica, _ = saturated_rate(scn, "colocated")
    assert res["saturated_rps"] == topology and topology != one_replica and burst == 300
    assert rate < topology
    assert 0 < res["goodput_rps"] <= res["offered_rps"] + 1e-12
    assert res["achieved_rps"] == pytest.approx(res["offered_rps"], rel=0.05)  # it keeps up there
    # a true boundary: fresh steady-state probes at ±tolerance
    assert steady_met(scn, rate * (1 - TOL), topology) is True
    assert steady_met(scn, rate * (1 + TOL), topology) is False


def test_a_loose_slo_stops_the_topology_at_its_saturated_throughput():
    """TTFT ≤ 60 s and TPOT ≤ 1 s: short runs meet it at rates the topology cannot sustain; the
    capacity must still stop below the saturated throughput, which violates by rule."""
    loose = load_scenario(PD, ["slo.ttft_s=60", "slo.tpot_s=1.0"])
    res = search_capacity(loose, "pd", tolerance=TOL)
    assert res.disaggregated and res.saturated_rps == saturated_rate(loose, "pd")[0]
    assert res.rate_rps < res.saturated_rps <= res.violating_rate_rps
    assert dict(res.probes)[res.violating_rate_rps] is False
    # the trap avoided: a whole run of the scenario's own size at 1.5 × saturation "meets" the SLO
    over = run(loose, [f"workload.arrival.rate={1.5 * res.saturated_rps!r}"], policies=["pd"]).summaries["pd"]
    assert over["slo_met"] is True and over["throughput_rps"] < 1.5 * res.saturated_rps


def test_capacity_lists_the_disaggregated_entry_after_the_colocated_ones():
    scn = load_scenario(PD)
    assert labels_of(scn, None, disaggregated=True) == ["colocated", "pd"]
    assert labels_of(scn, None) == ["colocated"]  # plan's colocated search never gets a topology
    assert is_disaggregated(scn, "pd") and not is_disaggregated(scn, "colocated")
    with pytest.raises(CbsimError, match=r"did you mean 'pd'.*colocated, pd"):
        capacity(PD, policies=["pdd"])


def test_colocated_replicas_share_the_rate_under_the_saturation_rule(monkeypatch):
    """With replicas.count = 2 the ceiling is twice one replica's saturated throughput (each
    replica gets half the rate), so a capacity is not capped at one replica's."""
    import sim.planning.probe as probe_mod

    seen = []

    def fake_judge(scn, label, overrides, load, saturated, max_growth=None, start=None):
        rate = float(overrides[0].split("=")[1])
        seen.append((rate, load, saturated))
        if saturated is not None and load >= saturated:
            return probe_mod.Verdict(met=False, stable=True, saturated=True)
        steady = {"goodput_rps": rate, "offered_rps": rate, "achieved_rps": rate}
        summary = {"slo_met": True, "goodput_rps": rate, "throughput_rps": rate, "requests_total": 300,
                   "steady": steady}
        return probe_mod.Verdict(met=True, stable=True, saturated=False, sizes=[(300, True)], summary=summary)

    monkeypatch.setattr(probe_mod, "judge", fake_judge)
    monkeypatch.setattr(probe_mod, "saturated_rate", lambda scn, label, overrides=(): (30.0, 300))
    res = search_capacity(load_scenario(PD), "colocated", tolerance=0.02)
    assert res.saturated_rps == 60.0 and not res.disaggregated and res.gpus == 2
    assert 60.0 / 1.02 <= res.rate_rps < 60.0 <= res.violating_rate_rps
    assert all(sat == 60.0 for _, _, sat in seen)
