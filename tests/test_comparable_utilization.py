"""Utilization figures that mean the same thing for every policy (issue #20): the batch against the
most sequences KV memory holds for this workload, and the share of memory holding written tokens;
at saturation they tell the quickstart's story (static idles, Orca fragments, vLLM V1 fills
memory). Also the progress bar's count, which must survive an 80-column terminal."""

from __future__ import annotations

import io

import numpy as np
import pytest

from sim.metrics.summary import memory_sequences, weighted_mean
from sim.runner import run

FIXED = {
    "name": "fixed-lengths", "seed": 1, "model": "tiny", "hardware": {"gpu": "cpu"},
    "latency": {"backend": "constant", "step_s": 0.01},
    "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 40.0},
                 "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 50},
                 "max_tokens": 50},
    "engine": {"block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 512,
               "num_gpu_blocks": 64},
    "policies": [{"name": "static", "batch_size": 4}, {"name": "orca"}, {"name": "vllm-v1"}],
}


@pytest.fixture(scope="module")
def fixed():
    return run(FIXED)


def test_memory_sequences_is_the_pool_over_the_mean_running_footprint(fixed):
    # 64 blocks x 16 tokens; each request holds its 100-token prompt + half its 50 outputs on average
    for label in fixed.labels:
        assert fixed.summaries[label]["memory_sequences"] == pytest.approx(64 * 16 / (100 + 25))
    reqs = fixed.requests[fixed.requests["policy"] == "orca"]
    assert memory_sequences(reqs, 1250) == pytest.approx(10.0) and memory_sequences(reqs, None) is None


def test_batch_vs_memory_and_kv_written_from_the_steps(fixed):
    for label in fixed.labels:
        s, steps = fixed.summaries[label], fixed.steps[fixed.steps["policy"] == label]
        util = s["utilization"]
        assert util["batch_vs_memory"] == pytest.approx(s["mean_batch"] / s["memory_sequences"])
        written = weighted_mean(steps["kv_used_tokens"] / (64 * 16), steps["duration_s"])
        assert util["kv_written"] == pytest.approx(written)
        # written tokens never exceed the blocks held: kv (blocks held, reserved included) bounds it
        assert 0 < util["kv_written"] <= util["kv"] + 1e-12
        assert {"slots", "token_budget", "kv", "mfu", "mbu"} <= set(util)  # the old keys stay
    # the slot shares divide by 4 and by 8: only the memory yardstick is common to all three
    assert fixed.meta["static"]["max_slots"] != fixed.meta["orca"]["max_slots"]
    assert len({s["memory_sequences"] for s in fixed.summaries.values()}) == 1


def test_at_saturation_only_paging_fills_memory(repo, tmp_path):
    """`cbsim run` on the quickstart stores each policy's saturated figures in summary.json and
    draws capacity.png from them. At saturation static's batch is a few % of what memory holds,
    Orca's is cut by its reservations, vLLM V1's fills memory (and its written share with it)."""
    import json

    from typer.testing import CliRunner

    from sim.cli.main import app

    out = tmp_path / "q"
    r = CliRunner().invoke(app, ["run", str(repo / "scenarios" / "quickstart.yaml"), "--set",
                                 "workload.num_requests=300", "--out", str(out), "-q"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "batch vs memory" in r.output and (out / "capacity.png").exists()
    blocks = {k: s["saturated"] for k, s in json.loads((out / "summary.json").read_text())["policies"].items()}
    bvm = {k: b["batch_vs_memory"] for k, b in blocks.items()}
    print("batch vs memory at saturation:", {k: round(v, 3) for k, v in bvm.items()})
    assert bvm["static"] < 0.1 < bvm["orca"] < 0.5 < 0.85 < bvm["vllm-v1"] <= 1.1
    assert blocks["vllm-v1"]["kv_written"] > 0.85 and blocks["orca"]["kv_waste"] > 0.5
    assert blocks["static"]["vs_static"] == 1.0 and blocks["vllm-v1"]["vs_static"] > 2
    for b in blocks.values():
        lo, hi = b["window_s"]
        assert 0 < lo < hi and b["rps"] > 0 and 0 < b["mfu"] < 1


def test_the_progress_count_is_whole_at_80_columns():
    from rich.console import Console

    from sim.runner import _RichProgress

    bar = _RichProgress(6000)
    with bar:
        bar.progress.update(bar.task, description="simulating vllm-v1 (policy 3 of 3)", completed=4000)
        console = Console(width=80, file=io.StringIO(), record=True, force_terminal=True)
        console.print(bar.progress.make_tasks_table(bar.progress.tasks))
    text = console.export_text()
    assert "4000/6000" in text and "requests" in text, text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_default_lengths_follow_the_azure_conversation_trace():
    """The default is the trace's quantiles: its median (129 output tokens, which no lognormal with
    the trace's mean and p99 gives: that one's median is 186), mean and p99."""
    from sim.scenario.schema import load_scenario
    from sim.workload.distributions import lognormal_params
    from sim.workload.synthetic import build_workload

    scn = load_scenario({"name": "d", "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                         "engine": {"max_model_len": 16384}, "workload": {"num_requests": 40000}})
    assert scn.workload.output_tokens.dist == scn.workload.prompt_tokens.dist == "azure-conv"
    specs = build_workload(scn)
    out = np.array([s.output_tokens for s in specs])
    prompt = np.array([s.prompt_tokens for s in specs])
    # the trace (shared/reference/traces/README.md): output 211 / 129 / 601, prompt 1155 / 1020 / 4142
    assert abs(np.median(out) - 129) <= 3 and abs(out.mean() - 211) <= 211 * 0.02
    assert abs(np.percentile(out, 99) - 601) <= 15
    assert abs(np.median(prompt) - 1020) <= 10 and abs(prompt.mean() - 1155) <= 1155 * 0.02
    assert abs(np.percentile(prompt, 99) - 4142) <= 60
    mu, _ = lognormal_params(211, 601)
    assert np.exp(mu) > 170  # the old default's median (186 in closed form), far from the trace's


def test_mfu_counts_the_lm_head_once_per_sequence_on_every_backend():
    """A prefill step of 2 chunks of 512 tokens: the table and constant backends count the same
    FLOPs as the roofline (the LM head at one row per sequence, not per token; issue 26), so MFU
    means the same on every backend; the per-token count was 7.5 % higher on Llama-3-8B."""
    from policies.base import StepPlan
    from sim.hardware.gpus import get_gpu
    from sim.hardware.models import get_model
    from sim.latency.base import step_shape
    from sim.latency.constant import ConstantLatency
    from sim.latency.roofline import RooflineLatency

    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    plan = StepPlan()
    plan.num_new_tokens, plan.context, plan.scheduled = [512, 512], [0, 0], [None, None]
    shape = step_shape(plan)
    roof = RooflineLatency(model, gpu, 1, 16).price(shape, plan)[1]
    const = ConstantLatency(0.01, model, gpu, 1, 16).price(shape, plan)[1]
    assert const == pytest.approx(roof, rel=1e-6)
    per_token = model.flops_per_token(1) * shape.num_tokens + (const - model.layer_flops_per_token(1)
                                                               * shape.num_tokens - 2 * model.lm_head_flops(1))
    assert per_token / const - 1 > 0.07
