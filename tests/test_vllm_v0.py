"""vllm-v0 driven step by step without SimPy: exact hand-computed schedules plus invariants.

The driver (``drive_paged_policy`` in tests/helpers.py) is the engine protocol in miniature
(policies/base.py): arrivals, ``schedule``, ``emit_tokens``, then the driver (never the policy)
decides which requests are done from output lengths it keeps to itself, and calls ``finish_step``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

import pytest

from policies.base import EngineLimits, Request, Status, StepPlan, emit_tokens
from policies.v0_blocks import AllocStatus, V0BlockManager, cdiv
from policies.vllm_v0 import VllmV0Policy
from tests.helpers import drive_paged_policy, req


@dataclass
class Step:
    plan: StepPlan
    swapped_before: list[str]  # ids swapped out when the step was scheduled
    free_after_schedule: int

    @property
    def batch(self) -> list[tuple[str, int, int]]:
        p = self.plan
        return [(r.id, n, c) for r, n, c in zip(p.scheduled, p.num_new_tokens, p.context)]


@dataclass
class Run:
    steps: list[Step] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    rejected: list[Request] = field(default_factory=list)


def drive(policy, workload, max_steps=5000, check=None) -> Run:
    """``workload``: (arrival step, Request, output length). Output lengths stay out of the policy.
    ``check(policy, step)`` sees each :class:`Step` right after ``schedule``."""
    run = Run()
    swapped_before: list[str] = []

    def before_schedule() -> None:
        swapped_before[:] = [r.id for r in getattr(policy, "swapped", [])]

    def on_plan(plan: StepPlan) -> None:
        record = Step(plan, list(swapped_before), policy.blocks.free_gpu_blocks)
        if check:
            check(policy, record)
        run.steps.append(record)

    run.finished, run.rejected = drive_paged_policy(policy, workload, max_steps, before_schedule=before_schedule,
                                                    on_plan=on_plan)
    assert policy.cpu_blocks_used() == 0
    assert policy.blocks.free_cpu_blocks == policy.limits.num_cpu_blocks
    return run


def batches(run: Run) -> list[list[tuple[str, int, int]]]:
    return [s.batch for s in run.steps]


# --- exact schedules ------------------------------------------------------------------------


def test_prefill_first_whole_prompts_hand_computed():
    limits = EngineLimits(
        block_size=4, num_gpu_blocks=10, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=16
    )
    a, b, c = req("A", 6, 0), req("B", 5, 1), req("C", 8, 2)
    run = drive(VllmV0Policy(limits), [(0, a, 3), (0, b, 2), (0, c, 2)])
    assert batches(run) == [
        [("A", 6, 0), ("B", 5, 0)],  # C's 8 tokens would make 19 > 16
        [("C", 8, 0)],  # a prefill step: A and B stall
        [("A", 1, 6), ("B", 1, 5), ("C", 1, 8)],  # C's 9th token opens its 3rd block
        [("A", 1, 7)],
    ]
    assert [r.id for r in run.finished] == ["B", "C", "A"]
    assert [[r.id for r in s.plan.admitted] for s in run.steps] == [["A", "B"], ["C"], [], []]


def test_max_num_seqs_counts_running_requests_against_admission():
    limits = EngineLimits(
        block_size=4, num_gpu_blocks=10, max_num_seqs=2, max_num_batched_tokens=16, max_model_len=16
    )
    a, b, c = req("A", 6, 0), req("B", 5, 1), req("C", 8, 2)
    run = drive(VllmV0Policy(limits), [(0, a, 3), (0, b, 2), (0, c, 2)])
    assert batches(run) == [
        [("A", 6, 0), ("B", 5, 0)],
        [("A", 1, 6), ("B", 1, 5)],  # two running: C may not join
        [("C", 8, 0)],
        [("A", 1, 7), ("C", 1, 8)],
    ]


PRESSURE = EngineLimits(
    block_size=2,
    num_gpu_blocks=6,
    num_cpu_blocks=4,
    max_num_seqs=4,
    max_num_batched_tokens=16,
    max_model_len=32,
)


def pressure_workload():
    # A and B fill the pool as they decode; C (one block) arrives while B is preempted.
    return [(0, req("A", 4, 0), 6), (0, req("B", 4, 1), 6), (5, req("C", 2, 2), 1)]


def test_recompute_preempts_newest_and_reprefills_prompt_plus_outputs():
    policy = VllmV0Policy(PRESSURE, preemption="recompute")
    run = drive(policy, pressure_workload())
    assert batches(run) == [
        [("A", 4, 0), ("B", 4, 0)],
        [("A", 1, 4), ("B", 1, 4)],
        [("A", 1, 5), ("B", 1, 5)],
        [("A", 1, 6)],  # A needs a 4th block, none free: B (back of running) is recomputed
        [("A", 1, 7)],  # B needs 4 blocks, 2 free: LATER, so a decode step
        [("A", 1, 8)],  # C arrived behind B and waits with it (FCFS)
        [("B", 7, 0), ("C", 2, 0)],  # B prefills its 4 prompt + 3 generated tokens again
        [("B", 1, 7)],
        [("B", 1, 8)],
    ]
    assert [r.id for r in run.steps[3].plan.preempted] == ["B"]
    assert run.steps[3].plan.swapped_out == [] and run.steps[3].plan.swap_out_blocks == 0
    b = run.finished[-1]
    assert (b.id, b.num_output_tokens, b.num_preemptions, b.num_swaps) == ("B", 6, 1, 0)
    assert sum(s.plan.swap_in_blocks + s.plan.swap_out_blocks for s in run.steps) == 0


def test_swap_moves_blocks_out_and_back_before_new_prefills():
    policy = VllmV0Policy(PRESSURE, preemption="swap")
    cpu_used = []
    run = drive(policy, pressure_workload(), check=lambda p, s: cpu_used.append(p.cpu_blocks_used()))
    assert batches(run) == [
        [("A", 4, 0), ("B", 4, 0)],
        [("A", 1, 4), ("B", 1, 4)],
        [("A", 1, 5), ("B", 1, 5)],
        [("A", 1, 6)],  # B's 3 blocks go to the CPU pool
        [("A", 1, 7)],  # B needs 4 GPU blocks to resume, 2 free
        [("A", 1, 8)],  # C arrived, but nothing is admitted while B is swapped out
        [("B", 1, 6)],  # A finished: B swaps in and decodes on, no re-prefill
        [("C", 2, 0)],  # only now C, and its prefill stalls B (prefill-first)
        [("B", 1, 7)],
        [("B", 1, 8)],
    ]
    plans = [s.plan for s in run.steps]
    assert [p.swap_out_blocks for p in plans] == [0, 0, 0, 3, 0, 0, 0, 0, 0, 0]
    assert [p.swap_in_blocks for p in plans] == [0, 0, 0, 0, 0, 0, 3, 0, 0, 0]
    assert cpu_used == [0, 0, 0, 3, 3, 3, 0, 0, 0, 0]
    assert [r.id for r in plans[3].swapped_out] == ["B"] and [r.id for r in plans[3].preempted] == ["B"]
    assert [r.id for r in plans[6].swapped_in] == ["B"]
    b = next(r for r in run.finished if r.id == "B")
    assert (b.num_output_tokens, b.num_preemptions, b.num_swaps) == (6, 1, 1)
    assert policy.num_swap_fallbacks == 0


def test_swap_status_while_out():
    policy = VllmV0Policy(PRESSURE, preemption="swap")
    seen = []
    drive(policy, pressure_workload(), check=lambda p, s: seen.append([r.status for r in p.swapped]))
    assert seen[3] == [Status.SWAPPED] and seen[6] == []


def test_swap_falls_back_to_recompute_when_cpu_pool_is_full():
    limits = dataclasses.replace(PRESSURE, num_cpu_blocks=2)  # B's 3 blocks do not fit
    policy = VllmV0Policy(limits, preemption="swap")
    run = drive(policy, pressure_workload())
    recompute = drive(VllmV0Policy(PRESSURE), pressure_workload())
    assert batches(run) == batches(recompute)
    assert policy.num_swap_fallbacks == 1
    assert run.steps[3].plan.swapped_out == [] and [r.id for r in run.steps[3].plan.preempted] == ["B"]


THREE = EngineLimits(
    block_size=2,
    num_gpu_blocks=4,
    num_cpu_blocks=4,
    max_num_seqs=4,
    max_num_batched_tokens=16,
    max_model_len=32,
)


def three_running_and_one_waiting():
    # A, B and C take all 4 blocks; D waits. A's 5th token needs a 3rd block.
    return [(0, req("A", 4, 0), 2), (0, req("B", 1, 1), 3), (0, req("C", 1, 2), 3), (0, req("D", 3, 3), 1)]


def test_recompute_victim_is_the_back_of_running_and_goes_before_waiting_requests():
    run = drive(VllmV0Policy(THREE), three_running_and_one_waiting())
    assert batches(run) == [
        [("A", 4, 0), ("B", 1, 0), ("C", 1, 0)],  # D's 2 blocks do not fit
        [("A", 1, 4), ("B", 1, 1)],  # C, the back of running, is preempted, not B
        [("C", 2, 0), ("D", 3, 0)],  # C went to the front of waiting, ahead of D
        [("B", 1, 2), ("C", 1, 2)],
    ]
    assert [[r.id for r in s.plan.preempted] for s in run.steps] == [[], ["C"], [], []]


def test_swap_victim_is_the_back_of_running_and_resumes_before_waiting_prefills():
    run = drive(VllmV0Policy(THREE, preemption="swap"), three_running_and_one_waiting())
    assert batches(run) == [
        [("A", 4, 0), ("B", 1, 0), ("C", 1, 0)],
        [("A", 1, 4), ("B", 1, 1)],  # C's one block goes to the CPU pool
        [("B", 1, 2), ("C", 1, 1)],  # C swaps back in; D, waiting longer, is not admitted
        [("D", 3, 0)],
        [("C", 1, 2)],
    ]
    plans = [s.plan for s in run.steps]
    assert [(p.swap_out_blocks, p.swap_in_blocks) for p in plans] == [(0, 0), (1, 0), (0, 1), (0, 0), (0, 0)]


# --- admission: watermark, prompt limit, rejection -------------------------------------------

WATERMARK = EngineLimits(
    block_size=1, num_gpu_blocks=100, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256
)


@pytest.mark.parametrize(
    ("watermark", "b_prompt", "b_admitted_at"),
    [
        (0.1, 6, 5),  # 15 free - 6 = 9 < 10 watermark blocks: B waits until A is done
        (0.1, 5, 0),  # 15 - 5 = 10 >= 10: B joins A's prefill step
        (0.0, 6, 0),
    ],
)
def test_watermark_blocks_admission(watermark, b_prompt, b_admitted_at):
    policy = VllmV0Policy(WATERMARK, watermark=watermark)
    run = drive(policy, [(0, req("A", 85, 0), 5), (0, req("B", b_prompt, 1), 1)])
    admitted = [i for i, s in enumerate(run.steps) if any(r.id == "B" for r in s.plan.admitted)]
    assert admitted == [b_admitted_at]


def test_swapped_request_that_fits_only_below_the_watermark_resumes_once_the_gpu_is_empty():
    # A is swapped out holding 91 of 100 blocks; resuming needs 92, which leaves 8 < 10 watermark
    # blocks free even in an empty pool. vLLM would wait forever; we swap it in once B is done.
    limits = dataclasses.replace(WATERMARK, num_cpu_blocks=100)
    run = drive(
        VllmV0Policy(limits, preemption="swap", watermark=0.1),
        [(0, req("B", 4, 0), 8), (0, req("A", 86, 1), 9)],
    )
    plans = [s.plan for s in run.steps]
    assert [r.id for r in plans[6].swapped_out] == ["A"] and plans[6].swap_out_blocks == 91
    assert [batch for batch in batches(run)[6:9]] == [[("B", 1, 9)], [("B", 1, 10)], [("A", 1, 91)]]
    assert plans[8].swap_in_blocks == 91
    assert [r.id for r in run.finished] == ["B", "A"]


def test_watermark_does_not_limit_decode_growth():
    policy = VllmV0Policy(WATERMARK, watermark=0.1)
    run = drive(policy, [(0, req("A", 89, 0), 12)])  # grows to 100 blocks: all of the pool
    assert [s.free_after_schedule for s in run.steps][-1] == 0
    assert run.finished[0].num_preemptions == 0


def test_blocks_that_never_fit_are_rejected_and_the_queue_moves_on():
    policy = VllmV0Policy(WATERMARK, watermark=0.1)
    run = drive(policy, [(0, req("X", 91, 0), 1), (0, req("A", 4, 1), 1)])
    (x,) = run.rejected
    assert x.status is Status.REJECTED and "91 tokens need 91 KV blocks" in x.reject_reason
    assert "10 kept free (watermark)" in x.reject_reason
    assert batches(run) == [[("A", 4, 0)]]
    assert run.steps[0].plan.rejected == [x]


def test_prompts_over_the_prompt_limit_are_rejected():
    limits = EngineLimits(block_size=4, num_gpu_blocks=100, max_num_batched_tokens=32, max_model_len=64)
    policy = VllmV0Policy(limits)
    assert policy.prompt_limit == 32
    run = drive(policy, [(0, req("long", 33, 0), 1), (0, req("ok", 32, 1), 1)])
    assert [r.id for r in run.rejected] == ["long"]
    assert "exceed the prompt limit of 32" in run.rejected[0].reject_reason
    assert batches(run) == [[("ok", 32, 0)]]


def test_recompute_victim_past_the_prompt_limit_is_rejected_not_looped():
    # V0 semantics: a recompute victim's "prompt" is prompt + outputs, checked against the limit.
    # B is preempted with 5 outputs (9 tokens > 8) when both need a 5th block of 2.
    limits = EngineLimits(
        block_size=2, num_gpu_blocks=8, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64
    )
    run = drive(VllmV0Policy(limits), [(0, req("A", 4, 0), 10), (0, req("B", 4, 1), 10)])
    (b,) = run.rejected
    assert b.id == "B" and b.num_output_tokens == 5 and "9 tokens" in b.reject_reason
    assert [r.id for r in run.finished] == ["A"]


def test_lone_request_larger_than_the_pool_ends_rejected():
    for mode in ("recompute", "swap"):
        limits = EngineLimits(block_size=2, num_gpu_blocks=4, num_cpu_blocks=8, max_model_len=64)
        run = drive(VllmV0Policy(limits, preemption=mode), [(0, req("A", 6, 0), 20)])
        (a,) = run.rejected
        assert a.num_output_tokens == 3 and a.num_preemptions == 1, mode
        last = run.steps[-1].plan  # recompute: rejected in the step that preempted it
        assert last.rejected == [a] and last.preempted == ([a] if mode == "recompute" else []), mode


def test_knobs_are_validated():
    with pytest.raises(ValueError, match="preemption must be one of"):
        VllmV0Policy(EngineLimits(), preemption="swapp")
    with pytest.raises(ValueError, match="no setting"):
        VllmV0Policy(EngineLimits(), chunk_size=512)
    assert VllmV0Policy.KNOBS["preemption"].default == "recompute"
    assert VllmV0Policy.KNOBS["watermark"].default == 0.01
    assert VllmV0Policy(EngineLimits(num_gpu_blocks=1000)).blocks.watermark_blocks == 10


# --- the block manager alone ----------------------------------------------------------------


def test_block_manager_statuses_and_swap_counts():
    bm = V0BlockManager(block_size=4, num_gpu_blocks=10, num_cpu_blocks=3, watermark=0.2)  # 2 kept
    a = req("a", 23)  # 6 blocks
    assert bm.can_allocate(a) is AllocStatus.OK
    bm.allocate(a)
    assert bm.can_allocate(req("b", 12)) is AllocStatus.LATER  # 4 free - 3 = 1 < 2
    assert bm.can_allocate(req("b", 8)) is AllocStatus.OK  # 4 - 2 = 2
    assert bm.can_allocate(req("c", 33)) is AllocStatus.NEVER  # 10 - 9 = 1 < 2
    a.num_output_tokens = 1  # 24 tokens: still 6 blocks
    assert bm.append_slots(a) == 0
    a.num_output_tokens = 2  # 25 tokens: a 7th block
    assert bm.can_append_slots(a) and bm.append_slots(a) == 1
    assert not bm.can_swap_out(a)  # 7 blocks, CPU pool of 3
    bm.check()
    small = req("s", 9)  # 3 blocks
    bm.allocate(small)
    assert bm.swap_out(small) == 3 and (bm.free_gpu_blocks, bm.free_cpu_blocks) == (3, 0)
    assert bm.can_swap_in(small) is AllocStatus.LATER  # 3 - 3 = 0 < 2
    bm.free(a)
    assert bm.can_swap_in(small) is AllocStatus.OK and bm.swap_in(small) == 3
    bm.check()
    bm.free(small)
    assert (bm.free_gpu_blocks, bm.free_cpu_blocks, bm.used_gpu_blocks) == (10, 3, 0)
    assert cdiv(0, 4) == 0 and cdiv(1, 4) == 1 and cdiv(8, 4) == 2


# --- invariants under random traffic and memory pressure -------------------------------------


def random_workload(rng: random.Random, n: int, max_prompt: int, max_out: int):
    work, t = [], 0
    for i in range(n):
        t += rng.choice([0, 0, 1, 2, 5])
        work.append((t, req(f"r{i}", rng.randint(1, max_prompt), i), rng.randint(1, max_out)))
    return work


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("seed", range(8))
def test_invariants_under_memory_pressure(mode, seed):
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    limits = EngineLimits(  # room for a few hundred tokens: requests must be preempted
        block_size=block_size,
        num_gpu_blocks=rng.randint(100, 200) // block_size,
        num_cpu_blocks=rng.choice([0, 48, 200]) // block_size,
        max_num_seqs=rng.randint(3, 8),
        max_num_batched_tokens=rng.choice([48, 64, 96]),
        max_model_len=rng.choice([64, 128, 200]),
    )
    policy = VllmV0Policy(limits, preemption=mode, watermark=rng.choice([0.0, 0.01, 0.1]))
    bs = limits.block_size
    workload = random_workload(rng, 40, max_prompt=40, max_out=80)
    expected_out = {r.id: n for _, r, n in workload}
    outputs_at_preemption: dict[str, int] = {}
    swapped_blocks: dict[str, int] = {}

    def check(p: VllmV0Policy, step: Step):
        plan = step.plan
        kinds = set()
        for r, n, ctx in zip(plan.scheduled, plan.num_new_tokens, plan.context):
            if ctx == 0:  # a whole prompt (plus outputs, after a recompute)
                assert n == r.num_tokens
                kinds.add("prefill")
                if r.id in outputs_at_preemption:
                    assert n == r.prompt_tokens + outputs_at_preemption.pop(r.id)
            else:
                assert (n, ctx + 1) == (1, r.num_tokens)
                kinds.add("decode")
        assert len(kinds) <= 1, "V0 never mixes prefills and decodes in one step"
        if "prefill" in kinds:
            assert step.swapped_before == [], "no prefill while requests are swapped out"
            assert step.free_after_schedule >= p.blocks.watermark_blocks
        assert plan.total_tokens <= limits.max_num_batched_tokens
        assert len(plan.scheduled) <= limits.max_num_seqs and p.num_running <= limits.max_num_seqs
        for r in p.running:  # stalled decodes have not yet been given their next token's slot
            assert p.blocks.gpu_blocks_of(r) == cdiv(r.num_computed_tokens, bs)
            assert r.status is Status.RUNNING
        for r in plan.preempted:
            assert r.status in (Status.PREEMPTED, Status.SWAPPED, Status.REJECTED)
            if r.status is Status.REJECTED:  # a recompute victim that can never be re-admitted
                assert r in plan.rejected and p.blocks.gpu_blocks_of(r) == 0
            if r.status is Status.PREEMPTED:
                assert r.num_computed_tokens == 0 and p.blocks.gpu_blocks_of(r) == 0
                outputs_at_preemption[r.id] = r.num_output_tokens
        for r in plan.swapped_out:
            swapped_blocks[r.id] = p.blocks.cpu_blocks_of(r)
            assert swapped_blocks[r.id] == cdiv(r.num_computed_tokens, bs)
        assert plan.swap_out_blocks == sum(p.blocks.cpu_blocks_of(r) for r in plan.swapped_out)
        for r in plan.rejected:
            swapped_blocks.pop(r.id, None)
            outputs_at_preemption.pop(r.id, None)
        assert plan.swap_in_blocks == sum(swapped_blocks.pop(r.id) for r in plan.swapped_in)
        assert p.blocks.used_cpu_blocks == sum(swapped_blocks.values())
        if plan.swapped_in:
            assert not plan.preempted
        if mode == "recompute" or limits.num_cpu_blocks == 0:
            assert not plan.swapped_out
        reserved, stored = p.kv_tokens_reserved_and_used()
        assert reserved == p.kv_blocks_used() * bs and stored <= reserved

    run = drive(policy, workload, check=check)
    assert len(run.finished) + len(run.rejected) == len(workload)
    assert {r.id for r in run.finished}.isdisjoint(r.id for r in run.rejected)
    for r in run.finished:
        assert r.status is Status.FINISHED
        assert r.num_output_tokens == max(1, min(expected_out[r.id], limits.max_model_len - r.prompt_tokens))
    for r in run.rejected:
        assert r.status is Status.REJECTED and r.reject_reason
    assert policy.drain() == []
    assert sum(len(s.plan.preempted) for s in run.steps) > 0  # the pressure is real
    recomputed_swap_victims = sum(len(s.plan.preempted) - len(s.plan.swapped_out) for s in run.steps)
    assert policy.num_swap_fallbacks == (recomputed_swap_victims if mode == "swap" else 0)
    if mode == "swap" and limits.num_cpu_blocks:
        assert sum(s.plan.swap_out_blocks for s in run.steps) > 0


def test_drain_returns_everything_held_and_frees_blocks():
    policy = VllmV0Policy(PRESSURE, preemption="swap")
    (a, b, c) = (r for _, r, _ in pressure_workload())
    policy.add_request(a)
    policy.add_request(b)
    for _ in range(4):  # through B's swap-out
        plan = policy.schedule()
        emit_tokens(plan)
        policy.finish_step(plan, [])
    policy.add_request(c)
    assert policy.cpu_blocks_used() == 3 and policy.num_waiting == 2  # C waiting, B swapped
    held = policy.drain()
    assert sorted(r.id for r in held) == ["A", "B", "C"]
    assert policy.kv_blocks_used() == policy.cpu_blocks_used() == 0 and not policy.has_work()
    policy.blocks.check()
