"""TensorRT-LLM's scheduler rules (policies/trtllm.py), one test per rule, with closed forms.

Each test drives the policy through the engine protocol (tests/policy_invariants.drive, every
invariant checked at every step) or step by step by hand, and asserts the number the rule
implies: how many requests a no-evict reservation admits, who MAX_UTILIZATION pauses, the chunk
sizes of each chunking policy, the tokens a shared prefix costs with block reuse on and off, and
the KV pool TensorRT-LLM's memory rule gives.
"""

from __future__ import annotations

import pytest

from policies.base import EngineLimits, Request, Status, emit_tokens
from policies.registry import make_policy
from sim.errors import CbsimError
from sim.hardware.gpus import get_gpu
from sim.hardware.kv_capacity import reserve_bytes
from sim.hardware.models import get_model
from sim.hardware.trtllm_kv import CUDA_CONTEXT_BYTES, trtllm_kv
from tests.helpers import first_step_of
from tests.policy_invariants import drive
from tests.test_property_policies import make_requests


def _limits(blocks: int, block: int = 4, seqs: int = 8, budget: int = 256, max_len: int = 512) -> EngineLimits:
    return EngineLimits(block_size=block, num_gpu_blocks=blocks, max_num_seqs=seqs,
                        max_num_batched_tokens=budget, max_model_len=max_len)


def _recording(policy):
    """The policy with every plan it returns kept in ``policy.plans`` (the instance only)."""
    plans = []
    schedule = policy.schedule

    def record():
        plan = schedule()
        plans.append(plan)
        return plan

    policy.schedule = record
    policy.plans = plans
    return policy


def _step(policy, finished_after: dict[str, int] | None = None):
    """One iteration by hand: schedule, emit, finish requests that reached their output length."""
    plan = policy.schedule()
    emitted = emit_tokens(plan)
    done = [r for r in emitted if r.num_output_tokens >= (finished_after or {}).get(r.id, r.max_tokens)]
    for r in done:
        r.status = Status.FINISHED
    policy.finish_step(plan, done)
    return plan


# --- GUARANTEED_NO_EVICT -------------------------------------------------------------------------
def test_guaranteed_no_evict_admits_exactly_what_its_reservation_covers_and_never_preempts():
    """20 blocks of 4 tokens; each request reserves ceil((6 + 10) / 4) = 4 blocks for its prompt
    plus max_tokens, though it generates only 3: floor(20 / 4) = 5 run at once, never 6, and no
    request is ever paused. The rest are admitted as earlier ones finish."""
    limits = _limits(blocks=20)
    policy = _recording(make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=4))
    rows = [(0, 6, 3, 10, 0, 0, 0) for _ in range(12)]
    checker = drive(policy, make_requests(rows), limits)
    assert all(r.status is Status.FINISHED for r in checker.requests.values())
    assert [len(p.admitted) for p in policy.plans[:1]] == [5]
    assert max(len(p.scheduled) for p in policy.plans) == 5
    assert sum(len(p.preempted) for p in policy.plans) == 0
    assert all(r.num_preemptions == 0 for r in checker.requests.values())


def test_guaranteed_no_evict_reserves_to_max_seq_len_when_max_tokens_reaches_past_it():
    """The reservation is min(prompt + max_tokens, max_seq_len) (TensorRT-LLM clamps max_tokens to
    max_seq_len - prompt): with max_seq_len 16 each request reserves 4 blocks, not 28."""
    limits = _limits(blocks=8, max_len=16)
    policy = make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=4)
    for i in range(3):
        policy.add_request(Request(f"r{i}", 0.0, 6, 100, seq=i))
    plan = policy.schedule()
    assert [r.id for r in plan.admitted] == ["r0", "r1"]  # 2 × 4 blocks = the pool of 8


def test_static_batch_admits_only_when_nothing_generates():
    limits = _limits(blocks=100)
    policy = make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=4, capacity_scheduler_policy="STATIC_BATCH")
    policy.add_request(Request("a", 0.0, 4, 5, seq=0))
    assert [r.id for r in _step(policy).admitted] == ["a"]
    policy.add_request(Request("b", 0.1, 4, 5, seq=1))
    for _ in range(4):  # a generates its 5 tokens; b waits though the pool has room for both
        plan = _step(policy)
        assert [r.id for r in plan.scheduled] == ["a"]
    assert [r.id for r in _step(policy).admitted] == ["b"]


# --- MAX_UTILIZATION -----------------------------------------------------------------------------
def test_max_utilization_pauses_the_newest_started_request_and_every_request_finishes():
    """A pool of 6 blocks (24 tokens) and three requests of 4 prompt + 16 output tokens (5 blocks
    each at the end): all three start (one block each) and hold 2 blocks each at 8 tokens. Then
    r000 needs a block: the newest started request, r002, is paused (9 tokens: 4 prompt + 5
    generated). At 12 tokens r000 needs another, with none free: r002 has not restarted, so r001
    (13 tokens) is paused. They resume in active-list order, r001 before r002, each recomputing
    prompt + generated tokens as one context, and every request finishes with all 16 tokens (the
    checker counts every token and block at every step)."""
    limits = _limits(blocks=6)
    policy = _recording(make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=4, capacity_scheduler_policy="MAX_UTILIZATION",
                                    enable_block_reuse=False))
    rows = [(0, 4, 16, 16, 0, 0, 0) for _ in range(3)]
    checker = drive(policy, make_requests(rows), limits)
    assert all(r.status is Status.FINISHED and r.num_output_tokens == 16 for r in checker.requests.values())
    pauses = [(i, r.id) for i, p in enumerate(policy.plans) for r in p.preempted]
    assert [rid for _, rid in pauses] == ["r002", "r001"]
    assert [i for i, _ in pauses] == [5, 9]  # at 8 and at 12 computed tokens of r000
    resumes = [(i, r.id, n) for i, p in enumerate(policy.plans) for r, n, c in
               zip(p.scheduled, p.num_new_tokens, p.context) if c == 0 and i > 0]
    assert [(rid, n) for _, rid, n in resumes] == [("r001", 13), ("r002", 9)]
    assert sum(r.num_preemptions for r in checker.requests.values()) == 2


def test_max_utilization_admits_on_next_step_blocks_where_no_evict_reserves_to_completion():
    """The same pool and requests: GUARANTEED_NO_EVICT starts one request at a time (5 of the 6
    blocks reserved), MAX_UTILIZATION starts all three at once (one block each)."""
    limits = _limits(blocks=6)
    for policy_name, started in (("GUARANTEED_NO_EVICT", 1), ("MAX_UTILIZATION", 3)):
        policy = make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=4, capacity_scheduler_policy=policy_name)
        for i in range(3):
            policy.add_request(Request(f"r{i}", 0.0, 4, 16, seq=i))
        assert len(policy.schedule().admitted) == started, policy_name


# --- micro-batch scheduler: budget, batch cap, chunking -------------------------------------------
def _one_decode_and_two_contexts(**knobs):
    limits = _limits(blocks=200, block=16, budget=64)
    policy = make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=16, enable_block_reuse=False,
                         enable_chunked_prefill=True, **knobs)
    policy.add_request(Request("g", 0.0, 4, 50, seq=0))
    _step(policy)  # g's context: a decode from now on
    policy.add_request(Request("a", 0.1, 100, 5, seq=1))
    policy.add_request(Request("b", 0.2, 100, 5, seq=2))
    plan = policy.schedule()
    return {r.id: n for r, n in zip(plan.scheduled, plan.num_new_tokens)}, plan


def test_first_come_first_served_chunking_fills_the_budget_in_whole_units():
    """Budget 64, one decode: 63 tokens left. a takes min(100, 63) = 63, cut to a multiple of the
    16-token unit: 48; b gets the 15 left, cut to 0, and waits."""
    sizes, plan = _one_decode_and_two_contexts(context_chunking_policy="FIRST_COME_FIRST_SERVED")
    assert sizes == {"a": 48, "g": 1}
    assert plan.total_tokens <= 64


def test_equal_progress_chunking_gives_each_context_a_unit_per_round():
    """63 tokens left: round 1 gives a and b 16 each (32), round 2 a another 16 (48); b's next 16
    would pass 63, and so would a's: a 32, b 16."""
    sizes, _ = _one_decode_and_two_contexts(context_chunking_policy="EQUAL_PROGRESS")
    assert sizes == {"a": 32, "b": 16, "g": 1}


def test_without_chunking_the_first_context_that_overflows_the_budget_ends_the_pass():
    limits = _limits(blocks=200, block=16, budget=64)
    policy = make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=16, enable_block_reuse=False)
    for i in range(3):
        policy.add_request(Request(f"r{i}", 0.0, 40, 5, seq=i))
    plan = policy.schedule()
    assert [(r.id, n) for r, n in zip(plan.scheduled, plan.num_new_tokens)] == [("r0", 40)]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_token_budget_and_batch_cap_hold_every_step(chunked, overlap):
    """With and without the overlap scheduler (which only delays when a request enters)."""
    limits = _limits(blocks=400, block=16, seqs=3, budget=64)
    policy = _recording(make_policy("trtllm", limits, disable_overlap_scheduler=not overlap, tokens_per_block=16,
                                    enable_chunked_prefill=chunked))
    rows = [(i // 3, 20 + 7 * i % 40, 5 + i % 9, 20, 0, i % 2, 8) for i in range(20)]
    checker = drive(policy, make_requests(rows), limits)
    assert all(r.status is Status.FINISHED for r in checker.requests.values())
    assert max(p.total_tokens for p in policy.plans) <= 64
    assert max(len(p.scheduled) for p in policy.plans) == 3  # the cap binds and holds


# --- block reuse -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reuse, prefill", [(True, 84 + 20), (False, 84 + 84)])
def test_block_reuse_computes_a_shared_prefix_once(reuse, prefill):
    """Two prompts of a shared 64-token prefix and 20 tokens of their own arrive together. With
    reuse, b is skipped in the first step (its first new block is the one a is computing,
    beneficialToSkip) and then reuses a's four 16-token blocks: 64 prefix tokens computed once."""
    limits = _limits(blocks=200, block=16)
    policy = _recording(make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=16, enable_block_reuse=reuse))
    rows = [(0, 84, 3, 3, 0, 0, 64), (0, 84, 3, 3, 0, 0, 64)]
    drive(policy, make_requests(rows), limits)
    computed = sum(n for p in policy.plans for r, n, c in zip(p.scheduled, p.num_new_tokens, p.context)
                   if c + n <= r.prompt_tokens)
    assert computed == prefill
    first = policy.plans[0]
    assert [r.id for r in first.scheduled] == (["r000"] if reuse else ["r000", "r001"])
    if reuse:
        assert policy.plans[1].prefix_hit_tokens == {"r001": 64}


# --- requests TensorRT-LLM could never serve --------------------------------------------------------
def test_requests_it_could_never_serve_are_rejected_with_a_reason():
    limits = _limits(blocks=8, budget=64, max_len=100)
    policy = make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=4)
    for rid, prompt, max_tokens in (("long", 100, 5), ("budget", 70, 5), ("pool", 20, 60), ("ok", 10, 5)):
        policy.add_request(Request(rid, 0.0, prompt, max_tokens))
    plan = policy.schedule()
    reasons = {r.id: r.reject_reason for r in plan.rejected}
    assert set(reasons) == {"long", "budget", "pool"}
    assert "max_seq_len" in reasons["long"] and "max_num_tokens" in reasons["budget"]
    assert "whole pool" in reasons["pool"]
    assert [r.id for r in plan.admitted] == ["ok"]


def test_engine_defaults_are_tensorrt_llms():
    limits = EngineLimits(max_num_seqs=None, max_num_batched_tokens=None)
    policy = make_policy("trtllm", limits, disable_overlap_scheduler=True)
    assert (policy.limits.max_num_seqs, policy.limits.max_num_batched_tokens) == (2048, 8192)
    assert policy.B == 32 and policy.num_blocks == 1000 * 16 // 32


# --- KV sizing -----------------------------------------------------------------------------------------
class _Hw:
    tensor_parallel = 1
    activation_reserve_gib = None
    expert_parallel = False


def test_kv_pool_is_a_fraction_of_the_memory_left_after_weights_and_the_profiling_pass():
    """(memory − weights − profiling peak) × free_gpu_memory_fraction // bytes per token, where
    vLLM's rule takes its fraction of the total memory: on an H100 SXM the TensorRT-LLM pool of
    Llama-3-8B at fraction 0.9 is that closed form, and halving the fraction halves what the
    weights and activations left (not the whole memory)."""
    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    per_token = 2 * 8 * 128 * 2 * 32  # K and V × kv heads × head dim × bf16 × layers
    assert model.kv_capacity_bytes_per_token(1, 8192) == per_token
    left = gpu.memory_bytes - model.weight_bytes(1) - reserve_bytes(model, _Hw(), 1, 8192, 1) - CUDA_CONTEXT_BYTES
    for fraction in (0.9, 0.45):
        pool = trtllm_kv(model, gpu, _Hw(), 1, max_num_tokens=8192, max_seq_len=8192, fraction=fraction)
        assert pool.num_blocks == int(left * fraction // per_token) // 32
        assert "free_gpu_memory_fraction" in pool.note
    with pytest.raises(CbsimError, match="does not fit"):
        trtllm_kv(get_model("llama-3-70b"), get_gpu("rtx-4090"), _Hw(), 1, max_num_tokens=8192, max_seq_len=8192)


def test_a_request_handed_over_with_its_prompts_kv_is_admitted_as_a_decode():
    """Disaggregated serving (sim.disaggregation): a request arrives with its 40-token prompt computed
    elsewhere and its first token emitted. Like TensorRT-LLM's DISAGG_GENERATION_INIT requests it
    waits for its no-evict reservation (ceil((40 + 20) / 8) = 8 blocks), not for the token budget
    (its prompt is not computed here), and its first step is a one-token decode over the transferred
    context, holding ceil(41 / 8) = 6 blocks."""
    limits = _limits(blocks=12, block=8, budget=16)
    policy = make_policy("trtllm", limits, disable_overlap_scheduler=True, tokens_per_block=8)
    held = Request("held", 0.0, 40, 20, seq=0)
    held.num_computed_tokens, held.num_output_tokens = 40, 1
    policy.add_request(held)
    plan = policy.schedule()
    assert [(r.id, n, c) for r, n, c in zip(plan.scheduled, plan.num_new_tokens, plan.context)] == [("held", 1, 40)]
    assert plan.admitted == [held] and policy.kv_blocks_used() == 6 and policy.num_running == 1
    other = Request("other", 0.0, 40, 20, seq=1)  # another 8-block reservation: 4 blocks are left
    other.num_computed_tokens, other.num_output_tokens = 40, 1
    policy.add_request(other)
    assert [r.id for r in policy.schedule().scheduled] == ["held"]


# --- the overlap scheduler (disable_overlap_scheduler False, TensorRT-LLM's default) --------------


@pytest.mark.parametrize("disable", [False, True])
@pytest.mark.parametrize("when", ["in_flight", "between"])
def test_overlap_scheduler_fetches_a_request_one_or_two_steps_late(disable, when):
    """A decodes for 20 steps; B arrives during step 2, or as it ends. Without the overlap
    scheduler B enters step 3. With it (``_executor_loop_overlap``: the fetch for step k + 1 runs
    when step k starts on the GPU) B missed step 3's fetch and enters step 4."""
    limits = _limits(blocks=200)
    policy = make_policy("trtllm", limits, tokens_per_block=4, disable_overlap_scheduler=disable)
    policy.add_request(Request("a", 0.0, 8, 20, seq=0))

    def arrive(k, in_flight):
        if k == 2 and in_flight == (when == "in_flight"):
            policy.add_request(Request("b", 0.0, 8, 4, seq=1))

    expected = 3 if disable else 4
    assert first_step_of(policy, "b", arrive) == expected


def test_overlap_scheduler_lets_an_idle_engine_take_a_request_at_once():
    """An idle executor blocks in its fetch until a request comes: a lone request enters the first
    step, and one arriving after every request finished enters the next step, overlap or not."""
    limits = _limits(blocks=200)
    policy = make_policy("trtllm", limits, tokens_per_block=4)
    policy.add_request(Request("a", 0.0, 8, 1, seq=0))

    def arrive(k, in_flight):
        if k == 1 and not in_flight:  # a finished in step 1 (its one token): nothing left running
            policy.add_request(Request("b", 0.0, 8, 1, seq=1))

    assert first_step_of(policy, "b", arrive) == 2


def test_under_attention_dp_a_request_for_an_idle_rank_of_a_busy_group_waits_for_the_groups_fetch():
    """Two attention-DP ranks fetch together (``_fetch_new_requests`` sums the active requests of
    every rank): rank 0 decodes A; B, for the idle rank 1, arrives during group iteration 2 and
    enters iteration 4, as it would on rank 0, not iteration 3 as on a lone idle engine. Once
    every rank is idle, a request enters the next iteration."""
    limits = _limits(blocks=200)
    ranks = [make_policy("trtllm", limits, tokens_per_block=4) for _ in range(2)]
    for p in ranks:
        p.join_lockstep(ranks)
    ranks[0].add_request(Request("a", 0.0, 8, 6, seq=0))
    entered = {}
    for k in range(1, 12):  # one group iteration: every rank with work schedules, the others idle
        plans = [p.schedule() if p.has_work() else None for p in ranks]
        for p, plan in zip(ranks, plans):
            if plan is None or plan.is_empty:
                p.idle_iteration()
            else:
                for r in plan.scheduled:
                    entered.setdefault(r.id, k)
        if k == 2:  # during the step
            ranks[1].add_request(Request("b", 0.0, 8, 1, seq=1))
        for p, plan in zip(ranks, plans):
            if plan is not None and not plan.is_empty:
                done = [r for r in emit_tokens(plan) if r.num_output_tokens >= r.max_tokens]
                for r in done:
                    r.status = Status.FINISHED
                p.finish_step(plan, done)
        if k == 7:  # a (6 tokens: iterations 1-6) and b are done: the group is idle
            assert not any(p.has_work() for p in ranks)
            ranks[1].add_request(Request("c", 0.0, 8, 1, seq=2))
    assert entered == {"a": 1, "b": 4, "c": 8}


# --- batch waiting (PyExecutor._waiting_requests) ---------------------------------------------------
@pytest.mark.parametrize("timeout", [0, 1, 5, 40])
def test_batch_waiting_holds_a_context_beside_decodes_for_the_timeout(timeout):
    """A decodes; B (8 prompt tokens) arrives after step 2. B's context is first scheduled in step 3,
    and with batch waiting it is held while its 8 tokens + A's 1 stay under 0.8 x 256: step 3 + timeout
    (the count reaches the timeout after that many held iterations; 0 is off)."""
    limits = _limits(blocks=200)
    policy = make_policy("trtllm", limits, tokens_per_block=4, disable_overlap_scheduler=True,
                         batch_wait_timeout_iters=timeout, batch_wait_max_tokens_ratio=0.8)
    policy.add_request(Request("a", 0.0, 8, 60, seq=0))

    def arrive(k, in_flight):
        if k == 2 and not in_flight:
            policy.add_request(Request("b", 0.0, 8, 4, seq=1))

    assert first_step_of(policy, "b", arrive, steps=60) == 3 + timeout


def test_batch_waiting_lets_contexts_run_once_their_tokens_reach_the_ratio_and_never_holds_an_idle_engine():
    limits = _limits(blocks=400)
    policy = make_policy("trtllm", limits, tokens_per_block=4, disable_overlap_scheduler=True,
                         batch_wait_timeout_iters=40, batch_wait_max_tokens_ratio=0.5)
    policy.add_request(Request("a", 0.0, 8, 60, seq=0))
    assert first_step_of(policy, "a", lambda k, f: None) == 1  # nothing generates: no waiting

    def arrive(k, in_flight):  # 127 prompt tokens + 1 decode = 128 = 0.5 x 256: runs at once
        if k == 1 and not in_flight:
            policy.add_request(Request("b", 0.0, 127, 4, seq=1))

    assert first_step_of(policy, "b", arrive) == 2
    for knobs in ({"batch_wait_timeout_iters": -1}, {"batch_wait_max_tokens_ratio": 1.5}):
        with pytest.raises(ValueError, match="batch_wait"):
            make_policy("trtllm", limits, **knobs)
