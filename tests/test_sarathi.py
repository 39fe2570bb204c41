"""sarathi driven step by step without SimPy: exact hand-computed schedules plus invariants.

The driver (``drive_paged_policy`` in tests/helpers.py) is the engine protocol in miniature
(policies/base.py): arrivals, ``schedule``, ``emit_tokens``, then the driver (never the policy)
decides which requests are done from output lengths it keeps to itself, and calls ``finish_step``.
"""

from __future__ import annotations

import random

import pytest

from policies.base import EngineLimits, Request, Status, StepPlan, emit_tokens
from policies.sarathi import SarathiPolicy
from policies.v0_blocks import cdiv
from policies.vllm_v0 import VllmV0Policy
from tests.helpers import drive_paged_policy, req


def drive(
    policy, workload, max_steps=5000, check=None
) -> tuple[list[StepPlan], list[Request], list[Request]]:
    """``workload``: (arrival step, Request, output length). Returns (plans, finished, rejected).

    ``check(policy, plan, decoding)`` sees each plan right after ``schedule``; ``decoding`` is the
    set of request ids whose prompt was done before the step (emitted a token, not finished).
    """
    plans: list[StepPlan] = []
    decoding: set[str] = set()

    def on_plan(plan: StepPlan) -> None:
        if check:
            check(policy, plan, decoding)
        decoding.difference_update(r.id for r in plan.preempted)
        plans.append(plan)

    def on_step(plan: StepPlan, emitted: list[Request], done: list[Request]) -> None:
        decoding.update(r.id for r in emitted)
        decoding.difference_update(r.id for r in done)

    finished, rejected = drive_paged_policy(policy, workload, max_steps, on_plan=on_plan, on_step=on_step)
    return plans, finished, rejected


def batch(plan: StepPlan) -> list[tuple[str, int, int]]:
    return [(r.id, n, c) for r, n, c in zip(plan.scheduled, plan.num_new_tokens, plan.context)]


LIMITS = EngineLimits(block_size=4, num_gpu_blocks=20, max_num_seqs=4, max_model_len=64)


# --- exact schedules ------------------------------------------------------------------------


def test_chunks_share_the_step_with_decodes_hand_computed():
    policy = SarathiPolicy(LIMITS, chunk_size=8)
    blocks_after_step0 = []

    def check(p, plan, decoding):
        if not blocks_after_step0:
            blocks_after_step0.append(p.blocks.gpu_blocks_of(plan.scheduled[0]))

    work = [(0, req("A", 10, 0), 3), (0, req("B", 5, 1), 2), (2, req("C", 6, 2), 1)]
    plans, finished, _ = drive(policy, work, check=check)
    assert [batch(p) for p in plans] == [
        [("A", 8, 0)],  # B would get 0 tokens: not admitted
        [("A", 2, 8), ("B", 5, 0)],  # A's last chunk, B's whole prompt in the leftover 6
        [("A", 1, 10), ("B", 1, 5), ("C", 6, 0)],  # decodes first, C's prompt beside them
        [("A", 1, 11)],
    ]
    assert blocks_after_step0 == [3]  # A's whole 10-token prompt, though 8 tokens are computed
    assert [r.id for r in finished] == ["B", "C", "A"]
    assert [[r.id for r in p.admitted] for p in plans] == [["A"], ["B"], ["C"], []]


def test_long_prompt_is_chunked_and_decodes_run_beside_the_last_chunk():
    policy = SarathiPolicy(LIMITS, chunk_size=4)
    plans, _, _ = drive(policy, [(0, req("A", 10, 0), 2), (0, req("B", 3, 1), 2)])
    assert [batch(p) for p in plans] == [
        [("A", 4, 0)],
        [("A", 4, 4)],
        [("A", 2, 8), ("B", 2, 0)],
        [("A", 1, 10), ("B", 1, 2)],  # A decodes while B's prompt finishes
        [("B", 1, 3)],
    ]


def test_newest_arrival_is_recomputed_when_no_block_is_free():
    limits = EngineLimits(block_size=2, num_gpu_blocks=4, max_num_seqs=4, max_model_len=64)
    policy = SarathiPolicy(limits, chunk_size=8)
    plans, finished, _ = drive(policy, [(0, req("A", 4, 0), 4), (0, req("B", 3, 1), 3)])
    assert [batch(p) for p in plans] == [
        [("A", 4, 0), ("B", 3, 0)],  # whole prompts take all 4 blocks
        [("A", 1, 4)],  # no free block: B (newest) is preempted; its 2 blocks do not fit the 1 left
        [("A", 1, 5)],
        [("A", 1, 6)],
        [("B", 4, 0)],  # B prefills its prompt and its 1 generated token again
        [("B", 1, 4)],
    ]
    assert [[r.id for r in p.preempted] for p in plans] == [[], ["B"], [], [], [], []]
    b = finished[-1]
    assert (b.id, b.num_output_tokens, b.num_preemptions) == ("B", 3, 1)


def test_victims_are_the_newest_arrivals_and_go_to_the_front_of_waiting():
    limits = EngineLimits(block_size=2, num_gpu_blocks=4, max_num_seqs=4, max_model_len=64)
    work = [(0, req("A", 4, 0), 2), (0, req("B", 1, 1), 3), (0, req("C", 1, 2), 3), (0, req("D", 3, 3), 1)]
    plans, _, _ = drive(SarathiPolicy(limits, chunk_size=8), work)
    assert [batch(p) for p in plans] == [
        [("A", 4, 0), ("B", 1, 0), ("C", 1, 0)],  # all 4 blocks; D waits
        # A needs a block: C (newest) is preempted. Then no block is free for B's decode and no
        # one else is left, so B preempts itself; waiting is now B, C, D and B fits again.
        [("A", 1, 4), ("B", 2, 0)],
        [("B", 1, 2), ("C", 2, 0)],  # C before D, which needs 2 blocks and finds 1
        [("C", 1, 2), ("D", 3, 0)],
    ]
    assert [[r.id for r in p.preempted] for p in plans] == [[], ["C", "B"], [], []]


def test_no_free_block_preempts_even_a_decode_that_needs_none():
    # Sarathi checks free > 0, not this decode's need: a lone request holding the whole pool
    # preempts itself and is re-admitted at once, re-prefilling prompt + outputs, until it no
    # longer fits the pool at all (vllm-v0 checks the real need and never preempts here).
    limits = EngineLimits(block_size=2, num_gpu_blocks=3, max_num_seqs=4, max_model_len=64)
    plans, _, rejected = drive(SarathiPolicy(limits), [(0, req("A", 5, 0), 3)])
    assert [batch(p) for p in plans] == [[("A", 5, 0)], [("A", 6, 0)], []]
    assert [[r.id for r in p.preempted] for p in plans] == [[], ["A"], ["A"]]
    assert [[r.id for r in p.admitted] for p in plans] == [["A"], ["A"], []]
    (a,) = rejected
    assert (a.num_output_tokens, a.num_preemptions, a.status) == (2, 2, Status.REJECTED)
    assert "7 tokens need 4 KV blocks" in a.reject_reason

    v0_plans, v0_finished, _ = drive_v0(limits, [(0, req("A", 5, 0), 2)])
    assert v0_finished[0].num_preemptions == 0 and len(v0_plans) == 2


def drive_v0(limits, work):
    return drive(VllmV0Policy(limits), work)


def test_max_num_seqs_caps_admission():
    limits = EngineLimits(block_size=4, num_gpu_blocks=20, max_num_seqs=1, max_model_len=64)
    plans, _, _ = drive(SarathiPolicy(limits, chunk_size=8), [(0, req("A", 2, 0), 2), (0, req("B", 2, 1), 1)])
    assert [batch(p) for p in plans] == [[("A", 2, 0)], [("A", 1, 2)], [("B", 2, 0)]]


# --- admission: watermark, rejection --------------------------------------------------------


@pytest.mark.parametrize(("watermark", "b_prompt", "b_admitted_at"), [(0.1, 6, 5), (0.1, 5, 0), (0.0, 6, 0)])
def test_watermark_blocks_admission(watermark, b_prompt, b_admitted_at):
    limits = EngineLimits(block_size=1, num_gpu_blocks=100, max_num_seqs=8, max_model_len=256)
    policy = SarathiPolicy(limits, chunk_size=256, watermark=watermark)
    plans, _, _ = drive(policy, [(0, req("A", 85, 0), 5), (0, req("B", b_prompt, 1), 1)])
    admitted = [i for i, p in enumerate(plans) if any(r.id == "B" for r in p.admitted)]
    assert admitted == [b_admitted_at]


def test_too_long_and_never_fitting_requests_are_rejected():
    limits = EngineLimits(block_size=4, num_gpu_blocks=10, max_num_seqs=4, max_model_len=64)
    work = [(0, req("long", 65, 0), 1), (0, req("huge", 41, 1), 1), (0, req("ok", 40, 2), 1)]
    plans, finished, rejected = drive(SarathiPolicy(limits, chunk_size=16), work)
    assert [r.id for r in rejected] == ["long", "huge"]
    assert "exceed max_model_len 64" in rejected[0].reject_reason
    assert "41 tokens need 11 KV blocks of 4; the GPU pool has 10" in rejected[1].reject_reason
    assert [batch(p) for p in plans] == [[("ok", 16, 0)], [("ok", 16, 16)], [("ok", 8, 32)]]
    assert [r.id for r in finished] == ["ok"]


def test_knobs():
    assert SarathiPolicy.KNOBS["chunk_size"].default == 512
    assert SarathiPolicy.KNOBS["watermark"].default == 0.01
    assert SarathiPolicy(EngineLimits()).token_budget == 512
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        SarathiPolicy(EngineLimits(), chunk_size=0)
    with pytest.raises(ValueError, match="no setting"):
        SarathiPolicy(EngineLimits(), preemption="swap")


# --- invariants under random traffic and memory pressure -------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_invariants_stall_free_and_whole_prompt_allocation(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    limits = EngineLimits(  # room for a few hundred tokens: requests must be preempted
        block_size=bs,
        num_gpu_blocks=rng.randint(100, 200) // bs,
        max_num_seqs=rng.randint(3, 10),
        max_model_len=rng.choice([64, 128, 200]),
    )
    chunk = rng.choice([8, 16, 32, 64])
    policy = SarathiPolicy(limits, chunk_size=chunk, watermark=rng.choice([0.0, 0.01, 0.1]))
    work, t = [], 0
    for i in range(40):
        t += rng.choice([0, 0, 1, 2, 5])
        work.append((t, req(f"r{i}", rng.randint(1, 60), i), rng.randint(1, 80)))
    expected_out = {r.id: n for _, r, n in work}
    reprefill: dict[str, int] = {}  # preempted id -> tokens its re-prefill must cover
    prefilled: dict[str, int] = {}  # id -> tokens prefilled since (re)admission

    def check(p: SarathiPolicy, plan: StepPlan, decoding: set[str]):
        assert plan.total_tokens <= chunk
        assert len(plan.scheduled) <= limits.max_num_seqs and p.num_running <= limits.max_num_seqs
        preempted = {r.id for r in plan.preempted}
        rows = batch(plan)
        # Stall-free: every decode not preempted gets its one token, ahead of every prefill chunk.
        decodes = [row for row in rows if row[0] in decoding and row[0] not in preempted]
        assert {row[0] for row in decodes} == decoding - preempted
        assert rows[: len(decodes)] == decodes and all(n == 1 for _, n, _ in decodes)
        for r in plan.preempted:
            if r.status is Status.PREEMPTED:
                reprefill[r.id] = r.num_tokens
                prefilled.pop(r.id, None)
        for r in plan.admitted:  # whole prompt allocated at admission
            assert p.blocks.gpu_blocks_of(r) == cdiv(r.num_tokens, bs)
            if r.id in reprefill:
                assert r.num_tokens == reprefill.pop(r.id) == r.prompt_tokens + r.num_output_tokens
            prefilled[r.id] = 0
        for r, n, ctx in zip(plan.scheduled, plan.num_new_tokens, plan.context):
            if r.id in prefilled:
                assert ctx == prefilled[r.id]
                prefilled[r.id] += n
                if prefilled[r.id] == r.num_tokens:
                    del prefilled[r.id]
        for r in p.running:  # prefills hold their whole prompt; decodes the token being computed
            assert p.blocks.gpu_blocks_of(r) == cdiv(r.num_tokens, bs) and r.status is Status.RUNNING
        reserved, stored = p.kv_tokens_reserved_and_used()
        assert reserved == p.kv_blocks_used() * bs and stored <= reserved

    plans, finished, rejected = drive(policy, work, check=check)
    assert len(finished) + len(rejected) == len(work)
    for r in finished:
        assert r.status is Status.FINISHED
        assert r.num_output_tokens == max(1, min(expected_out[r.id], limits.max_model_len - r.prompt_tokens))
    assert all(r.status is Status.REJECTED and r.reject_reason for r in rejected)
    assert sum(len(p.preempted) for p in plans) > 0  # the pressure is real
    assert any(len({r.id for r in p.scheduled}) > 1 and max(p.num_new_tokens) > 1 for p in plans)
    assert policy.drain() == []


def test_drain_returns_everything_held_and_frees_blocks():
    policy = SarathiPolicy(LIMITS, chunk_size=8)
    for r in (req("A", 10, 0), req("B", 5, 1), req("C", 30, 2)):
        policy.add_request(r)
    plan = policy.schedule()
    emit_tokens(plan)
    policy.finish_step(plan, [])
    assert (policy.num_running, policy.num_waiting, policy.kv_blocks_used()) == (1, 2, 3)
    assert sorted(r.id for r in policy.drain()) == ["A", "B", "C"]
    assert policy.kv_blocks_used() == 0 and not policy.has_work()
    policy.blocks.check()
