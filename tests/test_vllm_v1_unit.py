"""vllm-v1 driven directly, step by step, without SimPy (reference/schedulers.md §1 and §8.3-8.4)."""

from __future__ import annotations

import random

import pytest

from policies.base import EngineLimits, Request, Status
from policies.registry import POLICIES, make_policy
from policies.vllm_v1 import VllmV1Policy
from tests.helpers import engine_step as step
from tests.helpers import scheduled_tokens as sched


def _limits(**kw) -> EngineLimits:
    base = dict(
        block_size=16, num_gpu_blocks=10, max_num_seqs=16, max_num_batched_tokens=64, max_model_len=2048
    )
    base.update(kw)
    return EngineLimits(**base)


def ids(reqs) -> list[str]:
    return [r.id for r in reqs]


def run_trace(apc: bool):
    policy = VllmV1Policy(_limits(), enable_prefix_caching=apc)
    reqs = [Request(str(i), 0.0, 40, 30, prompt_runs=(((i,), 40),), seq=i) for i in range(3)]
    for r in reqs:
        policy.add_request(r)
    trace = []
    while policy.has_work():
        plan, finished = step(policy)
        trace.append(
            (
                sched(plan),
                ids(plan.preempted),
                ids(finished),
                policy.num_free_blocks,
                ids(policy.running),
                ids(policy.waiting_requests()),
            )
        )
        assert len(trace) < 500
    return policy, reqs, trace


def test_oracle_trace_8_3_reproduced_by_hand():
    """11 blocks (10 usable), B=16, budget 64, three 40-token prompts with 30 outputs."""
    policy, reqs, trace = run_trace(apc=False)
    # step 0: r1 is chunked to the budget; the full-prompt gate passed for it
    assert trace[0] == ({"0": 40, "1": 24}, [], [], 5, ["0", "1"], ["2"])
    # step 1: decode first, then the rest of the chunk, then the new prefill
    assert trace[1] == ({"0": 1, "1": 16, "2": 40}, [], [], 1, ["0", "1", "2"], [])
    assert trace[9][0] == {"0": 1, "1": 1, "2": 1} and trace[9][3] == 0
    # step 10: LIFO victim = running[-1]; no admission in a step that preempted
    assert trace[10] == ({"0": 1, "1": 1}, ["2"], [], 2, ["0", "1"], ["2"])
    # step 11: resuming needs cdiv(49, 16) = 4 blocks for the whole sequence, only 2 are free
    assert trace[11] == ({"0": 1, "1": 1}, [], [], 2, ["0", "1"], ["2"])
    assert reqs[2].num_preemptions == 1 and reqs[2].num_output_tokens == 30
    # the resumed request prefills prompt + 9 outputs again
    resumed = [i for i, t in enumerate(trace) if t[0].get("2", 0) > 1]
    assert resumed == [1, 30] and trace[30][0]["2"] == 49
    assert all(r.status is Status.FINISHED for r in reqs)
    assert policy.num_free_blocks == 10 and policy.kv_blocks_used() == 0
    policy.kv.pool.check_invariants()


def test_oracle_trace_8_4_prefix_blocks_of_the_victim_were_evicted():
    _, _, trace_off = run_trace(apc=False)
    policy, _, trace = run_trace(apc=True)
    # its three hashed blocks went to the back of the free queue, but the others' decode growth
    # used them up before it resumed at step 30: a full recompute of 49 tokens
    assert trace[30][0]["2"] == 49
    assert [t[:3] for t in trace] == [t[:3] for t in trace_off]
    assert policy.num_free_blocks == 10
    policy.kv.pool.check_invariants()


def test_blocks_are_hashed_at_schedule_time_so_a_same_step_admission_hits_them():
    policy = VllmV1Policy(_limits(max_num_batched_tokens=256, num_gpu_blocks=40), enable_prefix_caching=True)
    a = Request("a", 0.0, 64, 5, prompt_runs=(("sys", 64),), seq=0)
    b = Request("b", 0.0, 80, 5, prompt_runs=(("sys", 64), ("b", 16)), seq=1)
    c = Request("c", 0.0, 64, 5, prompt_runs=(("sys", 64),), seq=2)  # identical to a
    for r in (a, b, c):
        policy.add_request(r)
    plan, _ = step(policy)
    # a computes 4 blocks; b hits all 4; c may hit only 3 (its last token is always recomputed)
    assert sched(plan) == {"a": 64, "b": 16, "c": 16}
    assert plan.prefix_hit_tokens == {"b": 64, "c": 48}
    assert ids(plan.admitted) == ["a", "b", "c"]
    # a:4 blocks; b: 4 shared + 1; c: 3 shared + 1 of its own (identical content, not deduplicated)
    assert policy.num_free_blocks == 40 - 6
    reserved, used = policy.kv_tokens_reserved_and_used()
    assert (reserved, used) == ((4 + 5 + 4) * 16, 64 + 80 + 64)


def test_priority_preempts_the_worst_and_keeps_the_first_of_ties():
    policy = VllmV1Policy(_limits(num_gpu_blocks=6, max_num_batched_tokens=256), scheduling_policy="priority")
    a = Request("A", 0.0, 32, 50, priority=0, seq=0)
    b = Request("B", 0.0, 32, 50, priority=1, seq=1)
    c = Request("C", 0.0, 32, 50, priority=1, seq=2)
    for r in (c, b, a):  # the heap orders them, not the insertion
        policy.add_request(r)
    plan, _ = step(policy)
    assert sched(plan) == {"A": 32, "B": 32, "C": 32} and policy.num_free_blocks == 0
    plan, _ = step(policy)
    # A needs a 3rd block: victim = max (priority, arrival) = B and C tie, max keeps B (first)
    assert ids(plan.preempted) == ["B"]
    assert sched(plan) == {"A": 1, "C": 1}
    assert policy.waiting_requests() == [b] and b.num_computed_tokens == 0


def test_priority_victim_already_scheduled_gives_its_tokens_back():
    policy = VllmV1Policy(_limits(num_gpu_blocks=4, max_num_batched_tokens=256), scheduling_policy="priority")
    low = Request("low", 0.0, 20, 50, priority=1, seq=0)
    high = Request("high", 1.0, 32, 50, priority=0, seq=1)
    policy.add_request(low)
    step(policy)
    policy.add_request(high)
    plan, _ = step(policy)
    assert sched(plan) == {"low": 1, "high": 32} and policy.num_free_blocks == 0
    plan, _ = step(policy)
    # low (decode fits its 2 blocks) is scheduled first; high then needs a block: low is the
    # victim, drops out of this step's batch, and high is retried at the moved-back cursor
    assert sched(plan) == {"high": 1}
    assert ids(plan.preempted) == ["low"] and plan.context == [32]
    assert low.num_computed_tokens == 0 and low.status is Status.PREEMPTED
    assert ids(policy.running) == ["high"]


def test_fcfs_preempted_request_goes_to_the_front_and_blocks_the_queue():
    policy = VllmV1Policy(_limits(num_gpu_blocks=4, max_num_batched_tokens=256))
    a = Request("a", 0.0, 32, 50, seq=0)
    b = Request("b", 0.0, 32, 50, seq=1)
    policy.add_request(a)
    policy.add_request(b)
    step(policy)
    late = Request("late", 1.0, 1, 5, seq=2)
    policy.add_request(late)
    plan, _ = step(policy)  # a needs a 3rd block: b (running[-1]) is preempted
    assert ids(plan.preempted) == ["b"] and sched(plan) == {"a": 1}
    assert ids(policy.waiting_requests()) == ["b", "late"]
    plan, _ = step(policy)
    # b needs 3 blocks for 33 tokens, only 1 is free; late (1 block) would fit but waits behind it
    assert sched(plan) == {"a": 1} and not plan.admitted


def test_long_prefill_threshold_spares_a_lone_request_and_applies_after_a_prefix_hit():
    lone = VllmV1Policy(
        _limits(max_num_batched_tokens=512, num_gpu_blocks=100), long_prefill_token_threshold=16
    )
    lone.add_request(Request("x", 0.0, 50, 3))
    assert sched(step(lone)[0]) == {"x": 50}

    two = VllmV1Policy(
        _limits(max_num_batched_tokens=512, num_gpu_blocks=100),
        long_prefill_token_threshold=16,
        enable_prefix_caching=True,
    )
    two.add_request(Request("a", 0.0, 70, 3, prompt_runs=(("sys", 64), ("a", 6)), seq=0))
    two.add_request(Request("b", 0.0, 100, 3, prompt_runs=(("sys", 64), ("b", 36)), seq=1))
    plan, _ = step(two)
    assert sched(plan) == {"a": 16, "b": 16}
    for _ in range(3):
        step(two)  # a reaches 64 computed tokens (4 hashed blocks)
    assert two.running[0].num_computed_tokens == 64
    c = Request("c", 0.0, 100, 3, prompt_runs=(("sys", 64), ("c", 36)), seq=2)
    two.add_request(c)
    plan, _ = step(two)
    assert plan.prefix_hit_tokens == {"c": 64} and sched(plan)["c"] == 16  # 36 left, capped at 16


def test_max_num_seqs_caps_admission():
    policy = VllmV1Policy(_limits(max_num_seqs=2, max_num_batched_tokens=256, num_gpu_blocks=50))
    for i in range(4):
        policy.add_request(Request(f"r{i}", 0.0, 10, 3, seq=i))
    plan, _ = step(policy)
    assert ids(plan.admitted) == ["r0", "r1"] and policy.num_waiting == 2


def test_requests_that_can_never_run_are_rejected_not_queued_forever():
    policy = VllmV1Policy(_limits(num_gpu_blocks=4, max_model_len=100))
    too_long = Request("long", 0.0, 100, 5)  # no room for one output token
    too_big = Request("big", 0.0, 99, 1)  # 7 blocks > 4
    grows = Request("grows", 0.0, 40, 50)  # fits at first, outgrows the whole pool at 65 tokens
    for r in (too_long, too_big, grows):
        policy.add_request(r)
    assert too_long.status is Status.REJECTED and "max_model_len 100" in too_long.reject_reason
    assert too_big.status is Status.REJECTED and "needs 7 KV blocks" in too_big.reject_reason
    plan, _ = step(policy)
    assert ids(plan.rejected) == ["long", "big"] and sched(plan) == {"grows": 40}
    rejected_at = None
    for k in range(100):
        plan, _ = step(policy)
        if plan.rejected:
            rejected_at = k
            break
    assert rejected_at is not None and ids(plan.rejected) == ["grows"] and not plan.preempted
    assert grows.status is Status.REJECTED and "whole KV pool" in grows.reject_reason
    assert grows.num_output_tokens == 25 and not policy.has_work()  # 64 tokens in 4 blocks, the 65th fails
    assert policy.num_free_blocks == 4 and policy.kv_tokens_reserved_and_used() == (0, 0)


def test_chunked_prefill_off_waits_for_the_whole_prompt():
    policy = VllmV1Policy(_limits(num_gpu_blocks=50), enable_chunked_prefill=False)
    too_big = Request("huge", 0.0, 65, 3, seq=0)
    policy.add_request(too_big)
    assert too_big.status is Status.REJECTED and "enable_chunked_prefill is off" in too_big.reject_reason
    policy.add_request(Request("a", 0.0, 40, 3, seq=1))
    policy.add_request(Request("b", 0.0, 30, 3, seq=2))
    plan, _ = step(policy)
    assert sched(plan) == {"a": 40}  # b (30) does not fit the 24 left and is not chunked
    plan, _ = step(policy)
    assert sched(plan) == {"a": 1, "b": 30}


def test_drain_returns_everything_and_frees_the_pool():
    policy = VllmV1Policy(_limits())
    reqs = [Request(str(i), 0.0, 40, 30, seq=i) for i in range(3)]
    for r in reqs:
        policy.add_request(r)
    step(policy)
    assert ids(policy.drain()) == ["0", "1", "2"]
    assert not policy.has_work() and policy.num_free_blocks == 10


def test_knobs_are_documented_and_validated():
    assert POLICIES["vllm-v1"] is VllmV1Policy
    p = make_policy("vllm-v1", _limits())
    assert p.knobs == {
        "watermark": 0.0,
        "long_prefill_token_threshold": 0,
        "scheduling_policy": "fcfs",
        "enable_prefix_caching": True,  # on by default, as in vLLM V1
        "scheduler_reserve_full_isl": True,
        "enable_chunked_prefill": True,
        "kv_offload": True,  # uses engine.kv_offloading_size's tiers when the engine has them
        "async_admission": False,  # a request arriving mid-step enters the next step (synchronous vLLM)
    }
    assert all(k.help for k in VllmV1Policy.KNOBS.values())
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        VllmV1Policy(_limits(), scheduling_policy="lifo")
    with pytest.raises(ValueError, match=r"watermark must be in \[0, 1\)"):
        VllmV1Policy(_limits(), watermark=1.0)
    with pytest.raises(ValueError, match="no setting"):
        VllmV1Policy(_limits(), preemption="swap")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("mode", ["fcfs", "priority"])
def test_random_workloads_finish_within_limits_and_give_every_block_back(seed, mode):
    rng = random.Random(seed)
    lim = _limits(num_gpu_blocks=40, max_num_batched_tokens=128, max_num_seqs=6, max_model_len=512)
    policy = VllmV1Policy(
        lim,
        enable_prefix_caching=True,
        scheduling_policy=mode,
        watermark=0.05,
        long_prefill_token_threshold=48,
    )
    arrivals = {}
    reqs = []
    for i in range(40):
        prompt = rng.randint(1, 300)
        shared = min(prompt, rng.choice([0, 32, 64, 100]))
        runs = tuple(x for x in ((("sys", shared % 3), shared), (("own", i), prompt - shared)) if x[1])
        r = Request(
            f"r{i:02d}",
            float(i // 3),
            prompt,
            rng.randint(1, 60),
            priority=rng.randint(0, 2),
            prompt_runs=runs,
            seq=i,
        )
        reqs.append(r)
        arrivals.setdefault(i // 3, []).append(r)
    t = 0
    while t < 5000 and (policy.has_work() or t <= max(arrivals)):
        for r in arrivals.get(t, []):
            policy.add_request(r)
        if policy.has_work():
            plan, _ = step(policy)
            assert sum(plan.num_new_tokens) <= lim.max_num_batched_tokens
            assert policy.num_running <= lim.max_num_seqs
            assert all(
                c + n <= r.num_tokens for r, n, c in zip(plan.scheduled, plan.num_new_tokens, plan.context)
            )
            policy.kv.pool.check_invariants()
        t += 1
    assert all(r.status is Status.FINISHED and r.num_output_tokens == r.max_tokens for r in reqs)
    assert sum(r.num_preemptions for r in reqs) > 0  # the pool was tight enough to matter
    assert policy.num_free_blocks == 40 and policy.kv_blocks_used() == 0
    assert policy.kv_tokens_reserved_and_used() == (0, 0)
