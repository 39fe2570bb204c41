"""Determinism: the same scenario and seed give byte-identical result files, run after run, in
another process (with another hash seed), and through a local-process sweep.

Why bytes and not "close enough": a result a user cannot reproduce exactly cannot be trusted
or diffed, and any drift (set iteration order, salted ``hash()``, a timestamp in a file's
metadata, a race between sweep workers) shows up first as a changed byte.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sim.runner import run
from sim.scenario.schema import load_scenario

REPO = Path(__file__).resolve().parents[1]
CBSIM = Path(sys.executable).parent / "cbsim"
FILES = ("summary.json", "requests.parquet", "steps.parquet", "scenario.yaml")
DATE = re.compile(rb"(19|20)\d\d-[01]\d-[0-3]\d")  # an ISO date

# prefix caching, swap, chunked prefill, priorities: the paths where order could leak in
MIXED = {
    "name": "determinism",
    "seed": 3,
    "model": "llama-3-8b",
    "hardware": {"gpu": "h100-sxm"},
    "latency": {"backend": "roofline"},
    "workload": {"num_requests": 150, "arrival": {"process": "gamma", "rate": 12.0, "cv": 2.0},
                 "prompt_tokens": {"dist": "lognormal", "mean": 600, "p99": 3000},
                 "output_tokens": {"dist": "lognormal", "mean": 150, "p99": 600},
                 "max_tokens": 1024, "prefix": {"num_groups": 4, "prefix_len": 256}},
    "engine": {"num_gpu_blocks": 900, "max_num_seqs": 32, "enable_prefix_caching": True},
    "policies": [{"name": "vllm-v1", "scheduling_policy": "priority"}, {"name": "vllm-v0", "preemption": "swap"},
                 {"name": "sarathi"}, {"name": "orca"}, {"name": "static", "batch_size": 8}],
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
}


def _bytes(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in FILES}


def _save(scenario, folder: Path) -> dict[str, bytes]:
    run(scenario).save(folder, plots=False)
    return _bytes(folder)


@pytest.mark.parametrize("scenario", [MIXED, REPO / "scenarios" / "compare_policies.yaml"], ids=["mixed", "compare"])
def test_same_scenario_same_bytes_run_after_run(tmp_path, scenario):
    first = _save(scenario, tmp_path / "a")
    second = _save(scenario, tmp_path / "b")
    for name in FILES:
        assert first[name] == second[name], f"{name} differs between two runs"


def test_a_different_seed_changes_the_results(tmp_path):
    """The test above could pass by ignoring the workload; a new seed must change the bytes."""
    a = _save(MIXED, tmp_path / "a")
    b = _save(load_scenario(MIXED, ["seed=4"]), tmp_path / "b")
    assert a["requests.parquet"] != b["requests.parquet"]


def test_parquet_and_json_hold_no_timestamps(tmp_path):
    files = _save(MIXED, tmp_path / "a")
    for name in ("requests.parquet", "steps.parquet"):
        meta = pq.read_metadata(tmp_path / "a" / name)
        kv = {k.decode(): v for k, v in (meta.metadata or {}).items()}
        assert set(kv) <= {"pandas", "ARROW:schema"}, kv.keys()
        assert not DATE.search(kv.get("pandas", b"")), "the pandas metadata holds a date"
        assert not DATE.search(meta.created_by.encode())
    summary = json.loads(files["summary.json"])
    assert set(summary) == {"policies", "meta"}
    assert not DATE.search(files["summary.json"])


def test_same_bytes_in_other_processes_with_other_hash_seeds(tmp_path):
    """Python salts str hashes per process: nothing may depend on them."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(load_scenario(MIXED).to_yaml())
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"out{seed}"
        proc = subprocess.run([str(CBSIM), "run", str(scenario), "--out", str(out), "--no-plots", "-q"],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        outs.append(_bytes(out))
    in_process = _save(scenario, tmp_path / "here")
    for name in FILES:
        assert outs[0][name] == outs[1][name], f"{name} differs between processes"
        if name == "summary.json":  # `cbsim run` adds the quickstart story's saturated block (sim.planning.story)
            cli = json.loads(outs[0][name])
            assert all("saturated" in s for s in cli["policies"].values())
            for s in cli["policies"].values():
                del s["saturated"]
            assert cli == json.loads(in_process[name]), "the CLI and sim.run() differ"
        else:
            assert outs[0][name] == in_process[name], f"{name} differs between the CLI and sim.run()"


def test_local_process_sweeps_give_identical_tables(tmp_path):
    sweep_mod = pytest.importorskip("sim.planning.sweep")
    points = sweep_mod.make_points(rates=[4.0, 12.0, 30.0])
    scenario = load_scenario(MIXED, ["workload.num_requests=60", "policies=[{name: vllm-v1}, {name: sarathi}]"])
    tables = []
    for name, workers in (("serial", 1), ("processes", 2), ("processes-again", 2)):
        out = tmp_path / name
        sweep_mod.sweep(scenario, points, out, workers=workers, plot=False)
        tables.append((out / "sweep.parquet").read_bytes())
    assert tables[0] == tables[1] == tables[2]
    # and each point equals a plain run at that rate
    table = pq.read_table(tmp_path / "serial" / "sweep.parquet").to_pandas()
    direct = run(scenario, ["workload.arrival.rate=12.0"]).summaries["sarathi"]
    row = table[(table["rate"] == 12.0) & (table["policy"] == "sarathi")].iloc[0]
    assert row["requests_finished"] == direct["requests_finished"]
    assert row["ttft_s.p99"] == direct["ttft_s"]["p99"]
