"""Recompute preemption costs time, not utilization (issue 20): the tokens a preempted request
computes again are counted once, in ``recomputed_tokens``, and left out of the FLOPs MFU counts.

Closed forms on a pool too small for its load (prefix caching off, every request finishing, every
prompt shorter than the token budget, so a preempted request has always emitted a token):

- every prefill token is a prompt token computed for the first time, a recomputed one, or the last
  token a preempted request emitted (its KV is first written by the re-prefill), so
  ``sum(steps.prefill_tokens) == sum(prompt_tokens) + recomputed_tokens + preemptions``;
- useful FLOPs are a property of the workload, not of the schedule: each token's work depends only on
  its position, so the run that preempts and the run with memory to spare count the same FLOPs.
"""

from __future__ import annotations

import copy

import pytest

from sim.runner import run

SCENARIO = {
    "name": "recompute",
    "model": "tiny",
    "hardware": {"gpu": "cpu"},
    "latency": {"backend": "roofline"},
    "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 200.0},
                 "prompt_tokens": {"dist": "uniform", "min": 40, "max": 120},
                 "output_tokens": {"dist": "uniform", "min": 40, "max": 120}},
    "engine": {"block_size": 16, "num_gpu_blocks": 48, "max_num_seqs": 16, "max_num_batched_tokens": 512,
               "max_model_len": 256, "enable_prefix_caching": False},
    "policies": [{"name": "vllm-v1"}, {"name": "vllm-v0", "preemption": "recompute"}],
}


@pytest.mark.parametrize("label", ["vllm-v1", "vllm-v0"])
def test_prefill_tokens_are_prompts_plus_recomputed_tokens(label):
    result = run(SCENARIO, policies=[label])
    s = result.summaries[label]
    steps, reqs = result.steps, result.requests
    assert s["requests_finished"] == 60 and s["preemptions"] > 0
    assert s["recomputed_tokens"] == int(steps["recomputed_tokens"].sum()) > 0
    assert int(steps["prefill_tokens"].sum()) == (int(reqs["prompt_tokens"].sum()) + s["recomputed_tokens"]
                                                  + s["preemptions"])


@pytest.mark.parametrize("label", ["vllm-v1", "vllm-v0"])
def test_recomputed_work_is_not_counted_as_useful_flops(label):
    roomy = copy.deepcopy(SCENARIO)
    roomy["engine"]["num_gpu_blocks"] = 4000
    tight, spare = run(SCENARIO, policies=[label]), run(roomy, policies=[label])
    assert tight.summaries[label]["preemptions"] > 0 and spare.summaries[label]["preemptions"] == 0
    assert tight.steps["flops"].sum() == pytest.approx(spare.steps["flops"].sum(), rel=1e-9)
