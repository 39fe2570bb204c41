"""TensorRT-LLM's attention-DP balance (policies/trtllm.py AdpBalance, applied by sim/lockstep.py)."""

from __future__ import annotations

import pytest

from policies.base import EngineLimits
from policies.registry import make_policy
from policies.trtllm import AdpBalance
from sim import run
from sim.scenario.schema import load_scenario


def _iterations_until_run(rule: AdpBalance, counts) -> int:
    """How many iterations of the same per-rank counts pass until the contexts run (1: at once)."""
    for i in range(1, 10_000):
        if rule.release(counts):
            return i
    raise AssertionError("never ran")


@pytest.mark.parametrize("timeout", [1, 7, 60])
def test_a_lone_context_waits_for_the_timeout_while_every_rank_decodes(timeout):
    """One rank of 4 has a context, all 4 decode: held until the wait counter reaches
    timeout_iters, so it runs in iteration ``timeout`` (``timeout - 1`` held)."""
    rule = AdpBalance(timeout, 10, 256)
    counts = [(1, 8), (0, 8), (0, 8), (0, 8)]
    assert _iterations_until_run(rule, counts) == timeout
    assert rule.held == timeout - 1
    assert _iterations_until_run(rule, counts) == timeout  # the counter reset when it ran


@pytest.mark.parametrize("wait", [0, 3, 10])
def test_contexts_on_every_rank_wait_batching_wait_iters_then_run_together(wait):
    rule = AdpBalance(50, wait, 256)
    assert _iterations_until_run(rule, [(1, 8), (2, 8), (1, 8), (1, 8)]) == wait + 1


def test_a_rank_without_generation_requests_releases_the_contexts_at_once():
    rule = AdpBalance(50, 10, 256)
    assert rule.release([(1, 8), (0, 0), (0, 8)])  # one rank has nothing to decode
    assert rule.release([(1, 0), (1, 0)])  # the opening wave: contexts everywhere, no decodes
    assert rule.held == 0


def test_the_wait_counter_runs_through_iterations_without_any_context():
    """``_balance_adp_requests`` counts every iteration that lacks a context on some rank, those
    with none anywhere too: a context scheduled after 4 decode-only iterations, timeout 8, runs in
    its 4th iteration, not its 8th."""
    rule = AdpBalance(8, 0, 256)
    for _ in range(4):
        rule.release([(0, 8), (0, 8)])  # nothing to run or hold; the counter counts it
    assert rule.waiting == 4 and rule.held == 0
    assert _iterations_until_run(rule, [(1, 8), (0, 8)]) == 4


def test_a_full_rank_keeps_contexts_waiting_even_when_every_rank_has_one():
    rule = AdpBalance(5, 0, 8)
    assert _iterations_until_run(rule, [(1, 8), (1, 3)]) == 5  # rank 0 has no free slot
    assert _iterations_until_run(rule, [(1, 7), (1, 3)]) == 1


def test_balance_knobs_have_the_engines_defaults_and_are_checked():
    limits = EngineLimits(max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=4096,
                          num_gpu_blocks=512, block_size=32)
    pol = make_policy("trtllm", limits)
    assert pol.adp_balance() is None  # attention_dp_config defaults to None: no balance
    rule = make_policy("trtllm", limits, attention_dp_enable_balance=True).adp_balance()
    assert (rule.timeout_iters, rule.batching_wait_iters, rule.max_batch) == (50, 10, 64)
    with pytest.raises(ValueError, match="attention_dp_timeout_iters must be >= 0"):
        make_policy("trtllm", limits, attention_dp_enable_balance=True, attention_dp_timeout_iters=-1)


def _scenario(knobs: dict, dp: int = 4):
    return load_scenario(
        {
            "model": "openai/gpt-oss-20b",
            "hardware": {"gpu": "h200", "data_parallel": dp, "expert_parallel": True},
            "workload": {
                "num_requests": 160,
                "arrival": {"process": "closed", "concurrency": 32},
                "prompt_tokens": {"dist": "uniform", "min": 256, "max": 2048},
                "output_tokens": {"dist": "uniform", "min": 16, "max": 96},
            },
            "policies": [{"name": "trtllm", **knobs}],
        }
    )


def _mixed_iterations(steps, dp: int) -> tuple[int, int]:
    """(group iterations where some ranks prefill and others do not, of those the ones where every
    rank had a generation request: a rank absent from the iteration had none to run but counts its
    dummy, one present counts its decodes)."""
    mixed = unexcused = 0
    for _, it in steps.groupby("start_s"):
        prefilling = int((it.prefill_tokens > 0).sum())
        if prefilling == 0 or prefilling == dp:
            continue
        mixed += 1
        if (it.decode_tokens > 0).all():
            unexcused += 1
    return mixed, unexcused


def test_with_balance_no_iteration_prefills_on_some_ranks_while_every_rank_decodes():
    """The closed form of the rule with a timeout that never comes: a context runs only beside
    the other ranks' contexts, or when some rank has no generation request. With balance off
    (the default) one rank prefills beside the others' decodes in many iterations."""
    off = run(_scenario({})).steps
    mixed_off, unexcused_off = _mixed_iterations(off, 4)
    assert unexcused_off > 20
    on = run(_scenario({"attention_dp_enable_balance": True, "attention_dp_timeout_iters": 10**9,
                        "attention_dp_batching_wait_iters": 0}))
    mixed_on, unexcused_on = _mixed_iterations(on.steps, 4)
    assert unexcused_on == 0
    assert mixed_on < mixed_off / 10  # the contexts wait for each other: mixed iterations all but vanish
    assert on.summaries["trtllm"]["requests_finished"] == 160


def test_with_balance_a_timed_out_context_runs_alone():
    """A timeout of 1 iteration releases every context in the iteration it is scheduled: the same
    steps as balance off, bit for bit."""
    off = run(_scenario({})).steps
    on = run(_scenario({"attention_dp_enable_balance": True, "attention_dp_timeout_iters": 1,
                        "attention_dp_batching_wait_iters": 0})).steps
    cols = ["replica", "start_s", "duration_s", "prefill_tokens", "decode_tokens"]
    assert off[cols].equals(on[cols])


def test_balance_without_an_attention_dp_group_warns_that_it_does_nothing():
    """One rank (data_parallel 1) has no group to balance: the run says so and runs as without it."""
    from sim.errors import SettingIgnored

    scn = _scenario({"attention_dp_enable_balance": True}, dp=1)
    scn.workload.num_requests = 40
    with pytest.warns(SettingIgnored, match="attention_dp_enable_balance does nothing here.*data_parallel 1"):
        on = run(scn)
    plain = _scenario({}, dp=1)
    plain.workload.num_requests = 40
    assert on.steps.equals(run(plain).steps)
