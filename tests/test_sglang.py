"""The ``sglang`` policy driven step by step, one test per rule of sglang 0.5.23
(reference/schedulers.md §7; policies/sglang.py cites the source lines), its invariants on random
workloads with the radix cache on, and RadixAttention's reuse on a shared-system-prompt workload."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.base import EngineLimits, Request, Status
from policies.registry import make_policy
from policies.sglang import SglangPolicy
from sim.scenario.resolved import resolve
from sim.scenario.schema import load_scenario
from tests.fuzz_profiles import examples
from tests.helpers import FAKE_GPU, FAKE_MODEL, engine_step, wall_clock_limit
from tests.helpers import scheduled_tokens as sched
from tests.policy_invariants import drive
from tests.test_property_policies import limits_st, make_requests, workload_st

BIG = EngineLimits(block_size=16, num_gpu_blocks=1000, max_num_seqs=64, max_num_batched_tokens=8192,
                   max_model_len=4096)


def req(rid: str, *runs, max_tokens: int = 10, seq: int = 0) -> Request:
    prompt = sum(n for _, n in runs)
    return Request(rid, float(seq), prompt, max_tokens, prompt_runs=tuple(runs), seq=seq)


def step(pol: SglangPolicy):
    return engine_step(pol, check_invariants=True)


def run_until_idle(pol, limit=10_000):
    for _ in range(limit):
        if not pol.has_work():
            return
        step(pol)
    raise AssertionError("no end")


# --- the waiting-queue orders (§7.4) ---------------------------------------------------------------
def warmed(policy: str, **knobs) -> SglangPolicy:
    """A policy whose radix tree holds system prompt A (100 tokens), from one finished request."""
    pol = SglangPolicy(BIG, schedule_policy=policy, max_running_requests=1, **knobs)
    pol.add_request(req("warm", (("sys", "A"), 100), (("u", 0), 10), max_tokens=1))
    run_until_idle(pol)
    assert pol.cache.match_prefix([(("sys", "A"), 0, 100)], 100)[0] == 100
    return pol


def queue_three(pol):
    pol.add_request(req("unique", (("u", 1), 110), seq=1))
    pol.add_request(req("sysB", (("sys", "B"), 100), (("u", 2), 10), seq=2))
    pol.add_request(req("sysA", (("sys", "A"), 100), (("u", 3), 10), seq=3))


def test_lpm_admits_the_request_with_the_longest_cached_prefix_first():
    pol = warmed("lpm")
    queue_three(pol)
    plan, _ = step(pol)
    assert [r.id for r in plan.admitted] == ["sysA"]  # arrived last, but 100 of its tokens are cached
    assert plan.prefix_hit_tokens == {"sysA": 100} and sched(plan) == {"sysA": 10}
    assert pol.cached_tokens == 100


def test_fcfs_admits_in_arrival_order_whatever_is_cached():
    pol = warmed("fcfs")
    queue_three(pol)
    plan, _ = step(pol)
    assert [r.id for r in plan.admitted] == ["unique"] and sched(plan) == {"unique": 110}


def test_lpm_falls_back_to_fcfs_on_a_queue_longer_than_128():
    for n_before, expect in ((127, "sysA"), (128, "q0")):  # 128 waiting: lpm; 129: fcfs
        pol = warmed("lpm")
        for i in range(n_before):
            pol.add_request(req(f"q{i}", (("u", 100 + i), 20), seq=i + 1))
        pol.add_request(req("sysA", (("sys", "A"), 100), (("u", 3), 10), seq=500))
        plan, _ = step(pol)
        assert plan.admitted[0].id == expect, n_before


def test_lpm_defers_a_request_that_shares_an_uncached_prefix_with_an_earlier_one():
    """In-batch prefix caching: of two waiting requests sharing >= 32 uncached tokens, the later
    goes last this round, so the first computes the prefix and the second hits it next round."""
    pol = SglangPolicy(BIG, schedule_policy="lpm")
    for i, r in enumerate([req("a1", (("sys", "S"), 64), (("u", 1), 8)), req("b", (("u", 2), 72)),
                           req("a2", (("sys", "S"), 64), (("u", 3), 8))]):
        r.seq = i
        pol.add_request(r)
    pol._order_waiting()
    assert [r.id for r in pol.waiting] == ["a1", "b", "a2"]
    pol2 = SglangPolicy(BIG, schedule_policy="lpm")
    for r in [req("a1", (("sys", "S"), 20), (("u", 1), 8)), req("b", (("u", 2), 72)),
              req("a2", (("sys", "S"), 20), (("u", 3), 8))]:
        pol2.add_request(r)
    pol2._order_waiting()
    assert [r.id for r in pol2.waiting] == ["a1", "b", "a2"]  # stable: 20 shared < 32, no deferral


def test_lof_orders_by_max_tokens_and_cache_aware_orders_need_the_cache():
    pol = SglangPolicy(BIG, schedule_policy="lof")
    for i, m in enumerate([5, 50, 20]):
        pol.add_request(req(f"r{i}", (("u", i), 10), max_tokens=m, seq=i))
    pol._order_waiting()
    assert [r.id for r in pol.waiting] == ["r1", "r2", "r0"]
    assert SglangPolicy(BIG, schedule_policy="lpm", disable_radix_cache=True).schedule_policy == "fcfs"


def test_dfs_weight_serves_the_heaviest_subtree_first():
    pol = warmed("dfs-weight")
    pol.add_request(req("warmB", (("sys", "B"), 100), (("u", 9), 10), max_tokens=1, seq=1))
    run_until_idle(pol)
    pol.add_request(req("b1", (("sys", "B"), 100), (("u", 10), 10), seq=2))
    pol.add_request(req("a1", (("sys", "A"), 100), (("u", 11), 10), seq=3))
    pol.add_request(req("a2", (("sys", "A"), 100), (("u", 12), 10), seq=4))
    pol._order_waiting()
    assert [r.id for r in pol.waiting] == ["a1", "a2", "b1"]  # A's subtree holds two requests


# --- the event loop and PrefillAdder (§7.2, §7.3) --------------------------------------------------
def test_prefill_runs_first_and_the_decodes_wait():
    pol = SglangPolicy(BIG)
    pol.add_request(req("a", (("u", 1), 50), max_tokens=5))
    step(pol)
    pol.add_request(req("b", (("u", 2), 30), max_tokens=5))
    plan, _ = step(pol)
    assert sched(plan) == {"b": 30}  # a decodes next step, not in this one
    plan, _ = step(pol)
    assert sched(plan) == {"a": 1, "b": 1}


def test_a_decode_batch_after_a_decode_batch_says_its_requests_emitted_in_the_last_step():
    """StepPlan.num_decodes lets the engine count tokens in bulk without checking each request's
    run of steps; it may only cover requests that decoded in the step just before: never the
    first decode after a prefill batch (the running requests did not run in it), nor a batch
    that follows one with a new request prefilled."""
    pol = SglangPolicy(BIG)
    pol.add_request(req("a", (("u", 1), 50), max_tokens=8))
    plan, _ = step(pol)
    assert sched(plan) == {"a": 50} and plan.num_decodes == 0
    plan, _ = step(pol)  # the first decode follows a prefill
    assert sched(plan) == {"a": 1} and plan.num_decodes == 0
    plan, _ = step(pol)
    assert sched(plan) == {"a": 1} and plan.num_decodes == 1
    pol.add_request(req("b", (("u", 2), 30), max_tokens=3))
    plan, _ = step(pol)
    assert sched(plan) == {"b": 30} and plan.num_decodes == 0
    plan, _ = step(pol)  # a ran no token in b's prefill: its run broke
    assert sched(plan) == {"a": 1, "b": 1} and plan.num_decodes == 0
    plan, finished = step(pol)
    assert plan.num_decodes == 2 and [r.id for r in finished] == ["b"]
    plan, _ = step(pol)  # b finished in the last decode: a alone decoded in it and goes on
    assert sched(plan) == {"a": 1} and plan.num_decodes == 1


def test_enable_mixed_chunk_runs_the_decodes_inside_the_prefill_batch():
    pol = SglangPolicy(BIG, enable_mixed_chunk=True)
    pol.add_request(req("a", (("u", 1), 50), max_tokens=5))
    step(pol)
    pol.add_request(req("b", (("u", 2), 30), max_tokens=5))
    plan, _ = step(pol)
    assert sched(plan) == {"b": 30, "a": 1}


def test_a_long_prompt_is_chunked_and_continued_first_in_the_next_prefills():
    pol = SglangPolicy(BIG, chunked_prefill_size=64)
    pol.add_request(req("d", (("u", 0), 10), max_tokens=20))
    step(pol)
    pol.add_request(req("long", (("u", 1), 150)))
    pol.add_request(req("next", (("u", 2), 10)))
    plans = [sched(step(pol)[0]) for _ in range(4)]
    # 64-token chunks, the remainder with "next" (the chunk budget left: 64 - 22 = 42)
    assert plans[:3] == [{"long": 64}, {"long": 64}, {"long": 22, "next": 10}]
    assert plans[3] == {"d": 1, "long": 1, "next": 1}  # the decode waited for all three prefills


def test_max_prefill_tokens_caps_a_prefill_batch_when_chunking_is_off():
    pol = SglangPolicy(BIG, chunked_prefill_size=-1, max_prefill_tokens=150)
    for i in range(3):
        pol.add_request(req(f"r{i}", (("u", i), 100), seq=i))
    plan, _ = step(pol)
    assert sched(plan) == {"r0": 100}  # r1 would reach 200 >= the 150 left... of which 50 remain
    big = SglangPolicy(BIG, chunked_prefill_size=-1, max_prefill_tokens=50)
    big.add_request(req("huge", (("u", 9), 300)))
    assert sched(step(big)[0]) == {"huge": 300}  # the first request may exceed it


def test_max_running_requests_bounds_the_batch_and_batch_is_full_holds_until_it_shrinks():
    pol = SglangPolicy(BIG, max_running_requests=2)
    for i in range(3):
        pol.add_request(req(f"r{i}", (("u", i), 10), max_tokens=3 + i, seq=i))
    plan, _ = step(pol)
    assert sched(plan) == {"r0": 10, "r1": 10} and pol.batch_is_full
    plans = [sched(step(pol)[0]) for _ in range(4)]
    # r0 finishes in the 2nd decode; the next iteration still sees it in the batch (not yet
    # filtered): a decode, which filters it and clears batch_is_full; then r2 is admitted
    assert plans == [{"r0": 1, "r1": 1}, {"r0": 1, "r1": 1}, {"r1": 1}, {"r2": 10}]


def test_admission_reserves_future_decodes_at_new_token_ratio():
    """remaining_total = free + evictable - Σ_running min(max_new - generated, 4096) × ratio, and a
    request needs extend + max_new + page < remaining_total (prefill_budget.py)."""
    lim = EngineLimits(block_size=1, num_gpu_blocks=1000, max_num_seqs=8, max_num_batched_tokens=8192,
                       max_model_len=4096)
    for b_max, admitted in ((200, False), (150, True)):
        pol = SglangPolicy(lim)
        pol.add_request(req("a", (("u", 1), 100), max_tokens=1000))
        step(pol)  # a: max_new clipped to 999 - 100 - 1 = 898 on arrival; 897 left × 0.7 = 627.9
        assert pol.max_new_tokens(pol.running[0]) == 898
        pol.add_request(req("b", (("u", 2), 100), max_tokens=b_max))  # needs 100 + b_max + 1 < 900 - 627.9
        plan, _ = step(pol)
        assert ("b" in sched(plan)) is admitted and pol.batch_is_full is not admitted


@pytest.mark.parametrize("decodes", [0, 300, 650])
def test_with_k_running_at_a_decayed_ratio_a_prefill_admits_exactly_the_closed_form_count(decodes):
    """Pool T, k running requests of prompt p0 that have decoded d tokens (ratio r after d decodes),
    waiting requests of prompt p and max_new m: request j is admitted iff
    p + m + 1 < T - k(p0 + d) - k·(m0 - 1 - d)·r - j(p + 1 + m) (page 1: 0.5.23's prefill_budget.py
    ``remaining_total`` and ``reserve``; sglang 0.5.6.post2's ``PrefillAdder.add_one_req`` is the same
    rule without the page: p + m < ... - j(p + m)). The count differs from both a full reservation
    (ratio 1) and none."""
    T, k, p0, m0, p, m, waiting = 6000, 4, 50, 1000, 100, 200, 12
    lim = EngineLimits(block_size=1, num_gpu_blocks=T, max_num_seqs=64, max_num_batched_tokens=8192,
                       max_model_len=4096)
    pol = SglangPolicy(lim)
    for i in range(k):
        pol.add_request(req(f"run{i}", (("u", i), p0), max_tokens=m0, seq=i))
    assert sched(step(pol)[0]) == {f"run{i}": p0 for i in range(k)}  # 4 × (50 + 1 + 1000) < 6000
    for _ in range(decodes):
        plan, _ = step(pol)
        assert len(plan.scheduled) == k
    d = decodes
    r = max(0.7 - d * (0.7 - 0.098) / 600, 0.098)
    assert pol.new_token_ratio == pytest.approx(r)
    for j in range(waiting):
        pol.add_request(req(f"w{j}", (("w", j), p), max_tokens=m, seq=100 + j))
    plan, _ = step(pol)

    def count(ratio: float) -> int:
        room = T - k * (p0 + d) - k * (m0 - 1 - d) * ratio  # free slots less the running reservation
        return sum(1 for j in range(waiting) if p + m + 1 < room - j * (p + 1 + m))

    admitted = sorted(sched(plan))
    assert admitted == sorted(f"w{j}" for j in range(count(r))) and pol.batch_is_full
    assert (count(r), count(1.0), count(0.0)) == {0: (9, 5, 12), 300: (11, 5, 12), 650: (10, 5, 10)}[d]


def test_the_corpus_shape_runs_all_512_clients_on_sglangs_own_h200_tp2_pool_and_cap():
    """The H200 SGLang Llama-3.1-8B rows at 512 clients (1,000 / 2,000 tokens, TP 2) measure TTFT as
    if only ~480 of them ran (docs/accuracy-corpus.md). SGLang's own limits run all 512: the running
    cap is min(pool // 2, clamp(pool / context × 512, 2048, 4096)) and the pool (bf16 Llama-3-8B,
    smaller than the rows' fp8 one) holds every prompt with the opening's reservation at ratio 0.7;
    the 512 prompts go in ceil(512,000 / 8,192) = 63 prefill batches, before any decode."""
    dep = resolve(load_scenario({"model": "llama-3-8b", "hardware": {"gpu": "h200", "tensor_parallel": 2, "count": 2},
                                 "engine": {"max_model_len": 3016}, "policies": [{"name": "sglang"}]}))
    lim = dep.limits_for("sglang")
    pool = lim.num_gpu_blocks * lim.block_size
    assert lim.max_num_seqs == 4096 and pool > 1_900_000
    n, isl, osl = 512, 1000, 2000
    assert isl * n + (n - 1) * (osl - 1) * 0.7 + isl + osl + 1 < pool  # the last admission's need
    pol = SglangPolicy(lim)
    for i in range(n):
        pol.add_request(req(f"c{i}", (("u", i), isl), max_tokens=osl, seq=i))
    prefills = 0
    while pol.waiting or pol.chunked is not None:
        plan, _ = engine_step(pol)
        assert all(n_new > 1 for n_new in plan.num_new_tokens), "a decode ran before every prompt was in"
        assert sum(plan.num_new_tokens) <= 8192
        prefills += 1
    assert prefills == 63 and len(pol.running) == n and pol.num_retractions == 0


# --- new_token_ratio and retraction (§7.1, §7.5) ---------------------------------------------------
def test_new_token_ratio_starts_decays_per_decode_to_its_floor_and_resets_when_idle():
    pol = SglangPolicy(BIG)
    assert pol.new_token_ratio == pytest.approx(0.7)
    assert pol.min_ratio == pytest.approx(0.7 * 0.14) and pol.ratio_decay == pytest.approx((0.7 - 0.098) / 600)
    pol.add_request(req("a", (("u", 1), 10), max_tokens=700))
    step(pol)  # the prefill does not decay it
    assert pol.new_token_ratio == pytest.approx(0.7)
    for _ in range(10):
        step(pol)
    assert pol.new_token_ratio == pytest.approx(0.7 - 10 * pol.ratio_decay)
    for _ in range(650):
        step(pol)
    assert pol.new_token_ratio == pytest.approx(0.098)
    run_until_idle(pol)
    assert pol.new_token_ratio == pytest.approx(0.7)  # idle: self_check_during_idle resets it
    assert SglangPolicy(BIG, schedule_conservativeness=2.0).new_token_ratio == 1.0


def test_retraction_when_the_next_decode_does_not_fit_takes_the_fewest_generated_and_raises_the_ratio():
    lim = EngineLimits(block_size=1, num_gpu_blocks=200, max_num_seqs=8, max_num_batched_tokens=8192,
                       max_model_len=4096)
    pol = SglangPolicy(lim, init_new_token_ratio=0.01)  # admit optimistically, then run out
    pol.add_request(req("old", (("u", 1), 40), max_tokens=100, seq=0))
    step(pol)
    pol.add_request(req("new", (("u", 2), 40), max_tokens=100, seq=1))
    pol.add_request(req("late", (("u", 3), 30), max_tokens=100, seq=2))
    for _ in range(500):
        ratio = pol.new_token_ratio
        plan, _ = step(pol)
        if plan.preempted:
            break
    else:
        raise AssertionError("never retracted")
    running = {r.id: r for r in pol.running}
    victims = [r.id for r in plan.preempted]
    # the running batch was [old, new, late] minus whoever did not fit; the victims have the
    # fewest generated tokens (the latest admitted), and decoding resumes for the rest
    assert "old" in running and "old" not in victims
    kept = list(running.values())
    gen_kept = min(r.num_output_tokens for r in kept)
    assert all(v.num_output_tokens <= gen_kept for v in plan.preempted)
    for v in plan.preempted:
        assert v.status is Status.PREEMPTED and v.num_computed_tokens == 0 and v.num_preemptions == 1
        assert pol.waiting[-len(plan.preempted):].count(v) == 1  # appended at the back
    # computed before this step's decode emitted one more token each
    expect = min(1.0, (sum(r.num_output_tokens - 1 for r in kept) + 20 * len(kept))
                 / (sum(pol.max_new_tokens(r) for r in kept) + 1))
    assert pol.new_token_ratio == pytest.approx(expect) and pol.new_token_ratio > ratio
    # the freed memory lets the rest decode; the retracted requests come back and finish
    assert sched(plan) == {r.id: 1 for r in pol.running}
    run_until_idle(pol)
    for r in [*kept, *plan.preempted]:
        assert r.status is Status.FINISHED and r.num_output_tokens == 100
    assert pol.kv_blocks_used() == 0 and pol.cache.private == 0


def test_a_retracted_request_is_prefilled_again_with_its_outputs_and_hits_its_cached_prompt():
    lim = EngineLimits(block_size=1, num_gpu_blocks=150, max_num_seqs=8, max_num_batched_tokens=8192,
                       max_model_len=4096)
    pol = SglangPolicy(lim, init_new_token_ratio=0.0)
    pol.add_request(req("a", (("u", 1), 40), max_tokens=60, seq=0))
    step(pol)
    b = req("b", (("u", 2), 41), max_tokens=60, seq=1)
    pol.add_request(b)
    retracted_at = None
    while pol.has_work():
        plan, _ = step(pol)
        if plan.preempted:
            assert [r.id for r in plan.preempted] == ["b"]  # fewer generated tokens than a
            retracted_at = b.num_output_tokens
        if retracted_at is not None and "b" in pol.admission_hits:
            hit = pol.admission_hits["b"]
            assert 0 < hit <= 41 and sched(plan)["b"] == 41 + retracted_at - hit  # prompt + outputs again
            retracted_at = -1
    assert retracted_at == -1 and b.status is Status.FINISHED and b.num_output_tokens == 60


def test_a_lone_request_that_outgrows_the_pool_is_rejected_with_a_reason():
    lim = EngineLimits(block_size=1, num_gpu_blocks=50, max_num_seqs=4, max_num_batched_tokens=8192,
                       max_model_len=4096)
    pol = SglangPolicy(lim)
    pol.add_request(req("big", (("u", 1), 30), max_tokens=100))
    rejected = []
    while pol.has_work():
        plan, _ = step(pol)
        rejected += plan.rejected
    assert [r.id for r in rejected] == ["big"] and "whole KV pool" in rejected[0].reject_reason
    assert rejected[0].num_output_tokens == 21  # 30 + 20 tokens in KV: the 22nd token has no slot


def step_of_admission(pol: SglangPolicy, rid: str, limit: int = 200) -> int:
    """Steps taken until ``rid`` is in a prefill batch (its prompt scheduled)."""
    for n in range(1, limit):
        plan, _ = step(pol)
        if rid in sched(plan):
            return n
    raise AssertionError(f"{rid} never admitted")


@pytest.mark.parametrize("interval", [7, 10, 30])
def test_scheduler_recv_interval_admits_a_request_after_that_many_decodes_since_the_last_poll(interval):
    # SchedulerRecvSkipper: a decode iteration weighs 1, a prefill 1000; the scheduler polls when the
    # sum reaches the interval. "a" is prefilled (iteration 1, a poll); its decodes weigh 1 each, so
    # the polls fall at iterations 2 (after the prefill), 2 + interval, 2 + 2 x interval, ...
    pol = SglangPolicy(BIG, scheduler_recv_interval=interval)
    pol.add_request(req("a", (("u", 1), 50), max_tokens=500))
    assert pol.num_waiting == 1 and not pol.waiting  # sent, not received: the idle loop polls at once
    step(pol)  # iteration 1: the idle spin polls, "a" prefills
    step(pol)  # iteration 2: polls (after a prefill), "a" decodes
    for _ in range(3):
        step(pol)  # iterations 3-5: decodes
    pol.add_request(req("b", (("u", 2), 30), seq=1))
    assert pol.num_waiting == 1 and pol.has_work()
    polls = [2 + j * interval for j in range(1, 10)]
    first_poll = next(p for p in polls if p > 5)
    assert 5 + step_of_admission(pol, "b") == first_poll


def test_scheduler_recv_interval_1_is_sglangs_default_every_iteration_polls():
    pol = SglangPolicy(BIG)
    assert pol.recv_interval == 1
    pol.add_request(req("a", (("u", 1), 50), max_tokens=50))
    step(pol)
    step(pol)
    pol.add_request(req("b", (("u", 2), 30), seq=1))
    assert [r.id for r in pol.waiting] == ["b"]
    assert step_of_admission(pol, "b") == 1


def test_scheduler_recv_interval_polls_after_a_prefill_and_when_idle():
    pol = SglangPolicy(BIG, scheduler_recv_interval=30)
    pol.add_request(req("a", (("u", 1), 50), max_tokens=3))
    step(pol)  # prefill (first token)
    pol.add_request(req("b", (("u", 2), 30), seq=1))
    assert step_of_admission(pol, "b") == 1  # the iteration after a prefill weighs 1000: it polls
    run_until_idle(pol)
    pol.add_request(req("c", (("u", 3), 30), seq=2))
    assert step_of_admission(pol, "c") == 1  # an idle engine spins through its polls at once
    run_until_idle(pol)
    assert not pol.inbox and not pol.waiting


def test_bad_knob_values_name_the_knob():
    for knobs, word in [({"schedule_policy": "lpn"}, "schedule_policy"), ({"page_size": 0}, "page_size"),
                        ({"max_running_requests": 0}, "max_running_requests"),
                        ({"scheduler_recv_interval": 0}, "scheduler_recv_interval")]:
        with pytest.raises(ValueError, match=word):
            make_policy("sglang", BIG, **knobs)


# --- invariants with the radix cache on --------------------------------------------------------------
# tests/policy_invariants.py checks every prefix hit (whole pages, reported, of tokens computed before)
@examples(ci=150)
@given(data=st.data())
def test_property_invariants_hold_with_the_radix_cache_on(data):
    limits = data.draw(limits_st(), label="limits")
    knobs = data.draw(st.fixed_dictionaries({
        "schedule_policy": st.sampled_from(["fcfs", "lpm", "dfs-weight", "lof", "random"]),
        "chunked_prefill_size": st.sampled_from([None, -1, 7, 64]),
        "enable_mixed_chunk": st.booleans(),
        "page_size": st.sampled_from([1, 1, 2, 4]),
        "init_new_token_ratio": st.sampled_from([0.0, 0.7]),
    }), label="knobs")
    rows = data.draw(workload_st(), label="requests")
    policy = make_policy("sglang", limits, **knobs)
    with wall_clock_limit(20):
        checker = drive(policy, make_requests(rows), limits)
    policy.check_invariants()
    assert policy.cache.private == 0 and policy.cache.protected_size == 0
    assert checker.seen["prefix hit"] == 0 or policy.cached_tokens > 0


# --- RadixAttention's reuse on shared system prompts -----------------------------------------------
def test_shared_system_prompts_prefill_at_most_a_quarter_and_exactly_what_the_tree_did_not_hold():
    """8 system prompts x 50 users, prefix 1,000 tokens, question 200: the prefill tokens computed
    are at most 25 % of the prompts' tokens, and equal prompts minus what the radix tree served."""
    from sim.engine import Simulation
    from sim.latency.constant import ConstantLatency
    from sim.scenario.resolved import resolve
    from sim.scenario.schema import load_scenario
    from sim.workload.synthetic import build_workload

    scn = load_scenario({
        "name": "shared-prompts", "seed": 3, "model": "tiny", "hardware": {"gpu": "cpu"},
        "latency": {"backend": "constant", "step_s": 0.02},
        "workload": {"num_requests": 400, "arrival": {"process": "poisson", "rate": 40.0},
                     "prompt_tokens": {"dist": "fixed", "value": 1200},
                     "output_tokens": {"dist": "fixed", "value": 16}, "max_tokens": 16,
                     "prefix": {"num_groups": 8, "prefix_len": 1000}},
        "engine": {"block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 8192,
                   "max_model_len": 4096, "num_gpu_blocks": 4096},
        "policies": [{"name": "sglang"}],
    })
    specs = build_workload(scn)
    assert len({s.prompt_runs[0][0] for s in specs}) == 8
    limits = resolve(scn).limits
    pol = make_policy("sglang", limits)
    latency = ConstantLatency(0.02, FAKE_MODEL, FAKE_GPU, 1, limits.block_size)
    rec = Simulation(specs, [(pol, latency)], limits.max_model_len).run()
    requests, steps = rec.requests_frame(), rec.steps_frame()
    assert (requests["state"] == "finished").all() and requests["preemptions"].sum() == 0
    prompts = int(requests["prompt_tokens"].sum())
    computed = int(steps["prefill_tokens"].sum())
    assert computed == pol.prefill_tokens == prompts - pol.cached_tokens
    assert computed <= 0.25 * prompts, computed / prompts
    assert pol.cache.duplicate_tokens == 0 or computed > 8 * 1000 + 400 * 200
