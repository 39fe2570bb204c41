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


def test_engines_prefix_reuse_prefill_first_and_tgi_caching_at_finish():
    """scenarios/engines.yaml: once the 8 system prompts are cached, SGLang computes each system
    prompt exactly once and every question (token-granular radix hits), vLLM V1 the same plus the
    8 tokens past each system prompt's last full 16-token block; TGI, which caches a prompt only
    when its request finishes, computes whole system prompts again for the requests arriving
    before the first of their group finished. TensorRT-LLM reuses whole 32-token blocks (31 of
    each system prompt, 8 tokens computed again) and, by skipping a request whose first new block
    another is computing in the same step, also computes each system prompt once. SGLang's
    prefill-first loop pauses the decodes, so its TPOT p50 is above vLLM V1's."""
    result = run(REPO / "scenarios/engines.yaml")
    req, steps = result.requests, result.steps
    assert set(result.summaries) == {"vllm-v1", "sglang", "tgi", "trtllm"}
    assert (req["state"] == "finished").all() and req["preemptions"].sum() == 0
    computed = {p: int(steps[steps.policy == p]["prefill_tokens"].sum()) for p in result.summaries}
    prompts = req[req.policy == "sglang"]["prompt_tokens"]
    groups, prefix = 8, 1000
    questions = int(prompts.sum()) - len(prompts) * prefix
    assert computed["sglang"] == questions + groups * prefix
    assert computed["vllm-v1"] == questions + groups * prefix + (len(prompts) - groups) * (prefix % 16)
    assert computed["vllm-v1"] <= 0.25 * prompts.sum()
    assert computed["trtllm"] == questions + groups * prefix + (len(prompts) - groups) * (prefix % 32)
    misses, rest = divmod(computed["tgi"] - questions, prefix)
    assert rest == 0 and misses > 2 * groups  # all or nothing of a system prompt, often nothing
    # prefill-only steps while requests were running: SGLang's alone (vLLM V1 and TGI mix them in)
    held = steps["running"] - steps["admitted"] + steps["finished"]
    pausing = steps[(steps["prefill_tokens"] > 0) & (steps["decode_tokens"] == 0) & (held > 0)]
    assert set(pausing["policy"]) == {"sglang"}
    tpot = {p: s["tpot_s"]["p50"] for p, s in result.summaries.items()}
    assert tpot["sglang"] > 1.1 * tpot["vllm-v1"]
    assert result.meta["sglang"]["latency"] == "table"


def test_engines_overloaded_tgi_refuses_with_429_where_the_others_queue():
    """At twice what one H200 serves, TGI refuses requests arriving while max_concurrent_requests
    (128) are queued or running, each rejected with its 429 reason; vLLM V1 queues them all."""
    result = run(REPO / "scenarios/engines.yaml", overrides=["workload.arrival.rate=60"],
                 policies=["vllm-v1", "tgi"])
    req = result.requests
    tgi, v1 = req[req.policy == "tgi"], req[req.policy == "vllm-v1"]
    assert (v1["state"] == "finished").all()
    rejected = tgi[tgi["state"] == "rejected"]
    assert len(rejected) > 0 and len(rejected) + (tgi["state"] == "finished").sum() == len(tgi)
    assert rejected["reason"].str.startswith("429 Too Many Requests").all()
    assert result.summaries["tgi"]["requests_rejected"] == len(rejected)
