"""The shipped scenarios do what their comments promise, checked from the files a user gets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.runner import run

REPO = Path(__file__).resolve().parents[1]


def test_seed_toy_from_summary_json(tmp_path):
    """The seeds' worked example, asserted from the summary.json `cbsim run` writes."""
    out = tmp_path / "toy"
    proc = subprocess.run(
        [sys.executable, "-c", "from sim.cli.main import main; main()", "run", str(REPO / "scenarios/seed_toy.yaml"),
         "--out", str(out), "--no-plots", "--quiet"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())["policies"]
    assert summary["static"]["steps"] == 12
    assert summary["static"]["utilization"]["slots"] == pytest.approx(22 / 36)
    assert summary["orca"]["steps"] == 8
    assert summary["orca"]["utilization"]["slots"] == pytest.approx(22 / 24)
    assert {p: s["requests_finished"] for p, s in summary.items()} == {"static": 6, "orca": 6}


def test_paged_admits_more_than_contiguous_on_the_quickstart_workload():
    """Same chat workload, a KV pool small enough to bind: the contiguous max-length
    reservation (orca) wastes most of what it reserves and runs fewer requests at once than
    the paged pool (vllm-v1)."""
    result = run(
        REPO / "scenarios/quickstart.yaml",
        overrides=[
            "workload.num_requests=300", "workload.arrival.rate=20", "engine.num_gpu_blocks=6000",
            "policies=[{name: orca}, {name: vllm-v1}]",
        ],
    )
    orca, v1 = result.summaries["orca"], result.summaries["vllm-v1"]
    assert orca["kv_waste"] is not None and v1["kv_waste"] is not None
    assert orca["kv_waste"] > 0.5, "prompt + max_tokens reservations are mostly never written"
    assert v1["kv_waste"] < 0.05, "paged blocks waste at most the tail of each request's last block"
    assert orca["max_running"] < v1["max_running"]
    assert orca["mean_running"] < v1["mean_running"]


def test_memory_pressure_recompute_vs_swap():
    """Both preemption modes finish every request; swap pays PCIe time and recomputes nothing,
    recompute pays prefill tokens again and swaps nothing."""
    result = run(REPO / "scenarios/memory_pressure.yaml",
                 overrides=["workload.num_requests=120"], policies=["v0-recompute", "v0-swap"])
    req, steps = result.requests, result.steps
    for label in ("v0-recompute", "v0-swap"):
        s = result.summaries[label]
        assert s["requests_finished"] == 120, label
        assert s["preemptions"] > 0, label
    prompts = req[req.policy == "v0-swap"]["prompt_tokens"].sum()
    rec_steps, swap_steps = steps[steps.policy == "v0-recompute"], steps[steps.policy == "v0-swap"]
    # recompute: prompt + generated tokens of every victim are prefilled again
    assert rec_steps["prefill_tokens"].sum() > prompts
    assert rec_steps["swap_out_blocks"].sum() == 0 and rec_steps["swap_s"].sum() == 0
    # swap: every block swapped out comes back; each prompt is prefilled once; PCIe time is charged
    assert swap_steps["swap_out_blocks"].sum() > 0
    assert swap_steps["swap_out_blocks"].sum() == swap_steps["swap_in_blocks"].sum()
    assert swap_steps["prefill_tokens"].sum() == prompts
    charged = swap_steps["swap_s"]
    per_block = result.meta["v0-swap"]["swap_s_per_block"]
    moved = swap_steps["swap_out_blocks"] + swap_steps["swap_in_blocks"]
    assert charged.to_numpy() == pytest.approx((moved * per_block).to_numpy(), rel=1e-12)
    assert (swap_steps["duration_s"] > charged).all()


def test_dry_run_prints_the_resolved_scenario_and_workload_without_simulating(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "from sim.cli.main import main; main()", "run", str(REPO / "scenarios/quickstart.yaml"),
         "--dry-run", "--set", "workload.arrival.rate=12", "--out", str(tmp_path / "never")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    import yaml

    # the resolved YAML comes first, then a bare "workload" line heads the statistics
    scenario_text, _, stats = proc.stdout.partition("\nworkload\n")
    resolved = yaml.safe_load(scenario_text)
    assert resolved["workload"]["arrival"]["rate"] == 12
    assert resolved["engine"]["block_size"] == 16  # defaults are filled in
    assert "mean_rate_rps" in stats and "GPU blocks" in stats
    assert not (tmp_path / "never").exists()
