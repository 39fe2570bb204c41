"""The ``tgi`` policy driven step by step, one test per rule of TGI v3's router (reference/schedulers.md §6;
policies/tgi.py cites queue.rs, backend.rs and radix.rs), and its invariants with the prefix cache on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from policies.base import EngineLimits, Request, Status
from policies.registry import make_policy
from policies.tgi import TgiPolicy
from tests.fuzz_profiles import examples
from tests.helpers import engine_step, wall_clock_limit
from tests.helpers import scheduled_tokens as sched
from tests.policy_invariants import drive
from tests.test_property_policies import limits_st, make_requests, workload_st

LIM = EngineLimits(block_size=1, num_gpu_blocks=1000, max_num_seqs=64, max_num_batched_tokens=8192,
                   max_model_len=4096)


def req(rid: str, prompt: int, max_tokens: int, seq: int = 0, runs=None) -> Request:
    return Request(rid, float(seq), prompt, max_tokens, prompt_runs=runs or ((("u", rid), prompt),), seq=seq)


def step(pol: TgiPolicy):
    return engine_step(pol, check_invariants=True)


def test_admission_reserves_prompt_plus_max_new_tokens_and_stops_at_the_first_that_does_not_fit():
    pol = TgiPolicy(LIM)
    for i, (p, m) in enumerate([(100, 400), (100, 400), (50, 100)]):
        pol.add_request(req(f"r{i}", p, m, seq=i))
    plan, _ = step(pol)
    # r0 and r1 reserve 100 + 400 - 1 = 499 slots each; r2's 149 do not fit the 2 left: FIFO stops
    assert sched(plan) == {"r0": 100, "r1": 100} and pol.kv_blocks_used() == 998
    assert [r.id for r in pol.queue] == ["r2"]
    used, stored = pol.kv_tokens_reserved_and_used()
    assert (used, stored) == (998, 200)  # reserved at admission, not as the outputs grow


def test_tgi_never_preempts_and_serves_the_queue_as_reservations_end():
    pol = TgiPolicy(EngineLimits(block_size=1, num_gpu_blocks=300, max_num_seqs=16,
                                 max_num_batched_tokens=8192, max_model_len=4096))
    reqs = [req(f"r{i}", 40, 100, seq=i) for i in range(6)]
    for r in reqs:
        pol.add_request(r)
    steps = 0
    while pol.has_work():
        plan, _ = step(pol)
        assert not plan.preempted
        assert pol.kv_blocks_used() <= 300
        steps += 1
    assert all(r.status is Status.FINISHED and r.num_output_tokens == 100 for r in reqs)
    assert all(r.num_preemptions == 0 for r in reqs) and pol.kv_blocks_used() == 0


def unchunked(**knobs) -> TgiPolicy:
    return TgiPolicy(LIM, prefill_chunking=False, prefix_caching=False, **knobs)


def test_without_chunking_a_prefill_interrupts_only_when_enough_requests_wait():
    """min_size = floor(batch_size × waiting_served_ratio) until max_waiting_tokens decodes passed."""
    pol = unchunked(waiting_served_ratio=0.3, max_waiting_tokens=20)
    for i in range(10):
        pol.add_request(req(f"r{i}", 10, 60, seq=i))
    step(pol)  # the first batch of 10
    pol.add_request(req("w1", 10, 5, seq=20))
    pol.add_request(req("w2", 10, 5, seq=21))  # 2 < floor(10 × 0.3) = 3: decodes go on
    waited = 0
    while True:
        plan, _ = step(pol)
        if "w1" in sched(plan):
            break
        assert set(sched(plan)) == {f"r{i}" for i in range(10)}
        waited += 1
    assert sched(plan) == {"w1": 10, "w2": 10}  # the running batch is paused for this prefill
    assert waited == 19  # waiting_tokens counts 1 after the first prefill, +1 per decode, up to 20
    plan, _ = step(pol)
    assert len(sched(plan)) == 12  # a decode of everything follows the prefill


def test_without_chunking_enough_waiting_requests_interrupt_at_once():
    pol = unchunked(waiting_served_ratio=0.3)
    for i in range(10):
        pol.add_request(req(f"r{i}", 10, 60, seq=i))
    step(pol)
    for i in range(3):
        pol.add_request(req(f"w{i}", 10, 5, seq=20 + i))
    plan, _ = step(pol)
    assert sched(plan) == {"w0": 10, "w1": 10, "w2": 10}


def test_with_chunking_the_prefill_is_fused_and_budgeted_by_the_running_batch():
    pol = TgiPolicy(LIM, max_batch_prefill_tokens=100, prefix_caching=False)
    for i in range(5):
        pol.add_request(req(f"d{i}", 10, 50, seq=i))
    step(pol)
    pol.add_request(req("long", 300, 5, seq=10))
    plan, _ = step(pol)
    # budget 100 - 5 decodes = 95 tokens of the new prompt, in the same forward as the decodes
    assert sched(plan) == {**{f"d{i}": 1 for i in range(5)}, "long": 95}
    plan, _ = step(pol)  # the decode that follows: the chunk continues with what the decodes leave
    assert sched(plan)["long"] == 95
    plan, _ = step(pol)
    assert sched(plan)["long"] == 95
    plan, _ = step(pol)
    assert sched(plan)["long"] == 15  # 300 = 3 × 95 + 15; its first token comes now


def test_429_past_max_concurrent_requests_is_a_rejection_with_its_reason():
    pol = TgiPolicy(LIM, max_concurrent_requests=3)
    for i in range(5):
        pol.add_request(req(f"r{i}", 10, 5, seq=i))
    plan, _ = step(pol)
    assert [r.id for r in plan.rejected] == ["r3", "r4"] and pol.num_429 == 2
    assert all(r.status is Status.REJECTED and r.reject_reason.startswith("429") for r in plan.rejected)
    assert set(sched(plan)) == {"r0", "r1", "r2"}


def test_validation_rejects_what_tgi_refuses():
    pol = TgiPolicy(EngineLimits(block_size=1, num_gpu_blocks=100, max_num_seqs=8,
                                 max_num_batched_tokens=8192, max_model_len=200))
    for r in [req("long", 200, 1), req("total", 150, 60), req("pool", 50, 80), req("ok", 50, 50)]:
        pol.add_request(r)
    plan, _ = step(pol)
    reasons = {r.id: r.reject_reason for r in plan.rejected}
    assert set(reasons) == {"long", "total", "pool"} and "422" in reasons["total"]
    assert "whole pool" in reasons["pool"] and sched(plan) == {"ok": 50}


def test_prefix_cache_serves_a_finished_requests_prompt_and_recomputes_the_last_token():
    pol = TgiPolicy(LIM)
    shared = ((("sys", 0), 100),)
    pol.add_request(req("first", 100, 2, runs=shared))
    pol.add_request(req("second", 100, 2, seq=1, runs=shared))
    plan, _ = step(pol)
    assert sched(plan) == {"first": 100, "second": 100}  # both admitted before either finished
    while pol.has_work():
        step(pol)
    pol.add_request(req("third", 100, 2, seq=2, runs=shared))
    pol.add_request(req("fourth", 120, 2, seq=3, runs=((("sys", 0), 100), (("q", 4), 20))))
    plan, _ = step(pol)
    assert plan.prefix_hit_tokens == {"third": 99, "fourth": 100}  # all 100 found: 1 computed again
    assert sched(plan) == {"third": 1, "fourth": 20}
    assert pol.cache.duplicate_tokens == 100  # "second" inserted what "first" already had


@examples(ci=150)
@given(data=st.data())
def test_property_invariants_hold_with_the_prefix_cache_and_both_prefill_modes(data):
    limits = data.draw(limits_st(), label="limits")
    knobs = data.draw(st.fixed_dictionaries({
        "max_batch_prefill_tokens": st.sampled_from([3, 16, 64, 4096]),
        "prefill_chunking": st.booleans(),
        "waiting_served_ratio": st.sampled_from([0.0, 0.3, 1.2]),
        "max_waiting_tokens": st.sampled_from([0, 2, 20]),
        "block_size": st.sampled_from([1, 1, 2, 4]),
    }), label="knobs")
    rows = data.draw(workload_st(), label="requests")
    policy = make_policy("tgi", limits, **knobs)  # tests/policy_invariants.py checks every prefix hit
    with wall_clock_limit(20):
        checker = drive(policy, make_requests(rows), limits)
    assert checker.seen["preempted"] == 0
    assert policy.cache.private == 0 and policy.cache.protected_size == 0
