"""The prefix-reuse figures of the run table and summary.json (issue 28, item 7), by conservation.

With every request admitted once and no preemption, each prompt token is either served by the prefix
cache at admission or computed in a prefill step, so ``prefill_tokens == prompt_tokens - hit_tokens``
exactly and ``computed_share + hit_rate == 1``; with prefix caching off nothing is served.
"""

from __future__ import annotations

import pytest

from sim.runner import run

SCENARIO = {
    "name": "shared-prompts",
    "model": "llama-3-8b",
    "hardware": {"gpu": "h200"},
    "latency": {"backend": "roofline"},
    "workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 20.0},
                 "prompt_tokens": {"dist": "uniform", "min": 600, "max": 700},
                 "output_tokens": {"dist": "uniform", "min": 20, "max": 60}, "max_tokens": 128,
                 "prefix": {"num_groups": 4, "prefix_len": 500}},
    "policies": [{"name": "vllm-v1"}, {"name": "sglang"}, {"name": "tgi"},
                 {"name": "vllm-v1", "label": "no-cache", "enable_prefix_caching": False}],
}


@pytest.fixture(scope="module")
def result():
    return run(SCENARIO)


@pytest.mark.parametrize("label", ["vllm-v1", "sglang", "tgi"])
def test_every_prompt_token_is_a_hit_or_computed(result, label):
    s = result.summaries[label]
    assert s["requests_finished"] == 120 and s["preemptions"] == 0
    pr = s["prefix_reuse"]
    steps = result.steps[result.steps["policy"] == label]
    reqs = result.requests[result.requests["policy"] == label]
    assert pr["prompt_tokens"] == int(reqs["prompt_tokens"].sum())
    assert pr["prefill_tokens"] == int(steps["prefill_tokens"].sum())
    assert pr["prefill_tokens"] == pr["prompt_tokens"] - pr["hit_tokens"]
    assert pr["hit_tokens"] == int(steps["prefix_hit_tokens"].sum()) > 0
    assert pr["computed_share"] + pr["hit_rate"] == pytest.approx(1.0, abs=1e-12)
    # 4 system prompts of 500 tokens shared by 120 requests: at most 4 × 500 of them computed
    assert pr["hit_tokens"] <= 116 * 500


def test_no_prefix_cache_no_hits(result):
    pr = result.summaries["no-cache"]["prefix_reuse"]
    assert pr["hit_tokens"] == 0 and pr["hit_rate"] == 0.0 and pr["computed_share"] == 1.0


def test_run_table_shows_the_figures(result):
    from sim.cli.output import table_records
    from sim.cli.run import comparison_table

    rows = {r["metric"]: r for r in table_records(comparison_table(result))}
    for label in ("vllm-v1", "sglang", "tgi", "no-cache"):
        pr = result.summaries[label]["prefix_reuse"]
        assert rows["prompt tokens computed (prefill / prompt)"][label] == f"{100 * pr['computed_share']:.1f}%"
        assert rows["prefix-cache hit rate"][label] == f"{100 * pr['hit_rate']:.1f}%"
