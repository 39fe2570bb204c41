"""A copied scenario still runs (issue 28, item 4): every shipped scenario, copied alone into an empty
folder and run from another working directory, resolves everything it names (shipped tables by name,
models by id) without the repository beside it; and a shipped table by name is the same table as by path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sim.errors import ScenarioError
from sim.runner import run
from sim.scenario.schema import load_scenario

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("src", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_a_copy_of_every_shipped_scenario_runs_in_an_empty_folder(src, tmp_path, monkeypatch):
    copy = tmp_path / "mine" / src.name
    copy.parent.mkdir()
    shutil.copy(src, copy)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # neither the repository nor the scenario's folder is the working dir
    scn = load_scenario(copy)
    if scn.workload.requests is not None:
        small = []
    elif getattr(scn.workload, "sessions", None) is not None:  # sessions say what is sent: fewer of them
        small = ["workload.sessions.count=4"]
    else:
        small = ["workload.num_requests=12"]
    result = run(copy, overrides=small)
    for label in result.labels:
        s = result.summaries[label]
        assert s["requests_finished"] + s["requests_rejected"] + s["requests_unfinished"] == len(
            result.requests[result.requests["policy"] == label])
        assert s["requests_finished"] > 0


def test_shipped_scenarios_name_their_tables():
    for src in SCENARIOS:
        assert "../calib/tables" not in src.read_text(), f"{src.name}: name the shipped table (latency.name)"


def test_a_table_by_name_prices_as_the_same_table_by_path():
    base = {"model": "llama-3-8b", "hardware": {"gpu": "h200"},
            "workload": {"num_requests": 30, "arrival": {"rate": 5.0}}, "policies": [{"name": "vllm-v1"}]}
    by_name = run({**base, "latency": {"backend": "table", "name": "kernel-db-llama-3-8b-h200-tp1"}})
    by_path = run({**base, "latency": {"backend": "table",
                                       "path": str(REPO / "calib/tables/kernel-db-llama-3-8b-h200-tp1")}})
    assert by_name.steps["duration_s"].tolist() == by_path.steps["duration_s"].tolist()
    saved = load_scenario(by_name.scenario.to_dict())  # the saved scenario.yaml keeps the name
    assert saved.latency.name == "kernel-db-llama-3-8b-h200-tp1" and saved.latency.path is None


@pytest.mark.parametrize("latency, message", [
    ({"backend": "table", "name": "kernel-db-llama-3-8b-h200"},
     r"latency\.name: 'kernel-db-llama-3-8b-h200' is not a shipped latency table \(did you mean "
     r"'kernel-db-llama-3-8b-h200-tp1'\?\).*cbsim tables"),
    ({"backend": "table", "name": "kernel-db-llama-3-8b-h200-tp1", "path": "x"}, r"latency\.name: give either"),
    ({"backend": "roofline", "name": "kernel-db-llama-3-8b-h200-tp1"}, r"latency\.name: only used by backend"),
])
def test_bad_table_names_are_refused_naming_the_field(latency, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario({"latency": latency})


def test_cbsim_tables_lists_every_shipped_folder(capsys):
    import json

    from sim.cli.tables import tables_cmd

    tables_cmd(json_=True)
    facts = json.loads(capsys.readouterr().out)
    folders = sorted(p.name for p in (REPO / "calib/tables").iterdir() if (p / "metadata.json").is_file())
    assert [f["name"] for f in facts] == folders
    h200 = next(f for f in facts if f["name"] == "kernel-db-llama-3-70b-h200-tp2")
    assert (h200["tensor_parallel"], h200["dtype"], h200["engine"], h200["engine_version"]) == (2, "bf16", "vllm",
                                                                                              "0.24.0")
    assert 0 < h200["heldout_mean_abs_rel"] < 0.05
    assert os.path.samefile(h200["path"], REPO / "calib/tables/kernel-db-llama-3-70b-h200-tp2")
