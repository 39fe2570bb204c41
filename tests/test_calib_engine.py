"""calib's real engine (issue 6): the same policy decisions as the simulator, and real blocks conserved.

What is asserted:

- With every request arriving at t = 0 no decision depends on time, so the real engine must make
  exactly the simulator's decisions: step for step the same requests, each with the same number of
  new tokens on the same context, the same preemptions, and in the end the same tokens per request.
  Checked for every policy family (vLLM V1 with recompute preemptions and with prefix caching,
  vLLM V0 recompute and swap, Sarathi, Orca, static batching with padding).
- Blocks are conserved at every step (``RealEngine(check=True)``): V1's block tables are the
  cache's; the other policies' requests map onto real blocks that never overlap, never exceed
  what the policy accounts for, and are all returned at the end (host swap blocks too). The check
  itself is shown to catch a double mapping.
- The decode-graph padding (static buffers, padding rows in the null block) gives the same next
  tokens as an ordinary step (run eagerly on the CPU: capture needs CUDA).
- A swap out and back in restores a request's K/V exactly, into other blocks.
- The engine's clock hands a request to the policy only once its arrival time has passed.
"""

from __future__ import annotations

import random

import pytest
import torch

from calib.engine import Clock, RealEngine, SideBlocks, prompt_token_ids
from calib.executor import DecodeGraphs, HostKVPool, StepExecutor
from calib.step import BlockAllocator, SeqInput, make_runner, synthetic_batch
from policies.base import EngineLimits, Request
from policies.registry import make_policy
from sim.engine import Simulation
from sim.hardware.gpus import get_gpu
from sim.hardware.models import get_model
from sim.latency.constant import ConstantLatency
from sim.workload.request_spec import RequestSpec

LIMITS = dict(block_size=16, num_gpu_blocks=14, num_cpu_blocks=64, max_num_seqs=6, max_num_batched_tokens=96,
              max_model_len=256)

CASES = [
    ("vllm-v1", {}),
    ("vllm-v1", {"enable_prefix_caching": True}),
    ("vllm-v0", {"preemption": "recompute"}),
    ("vllm-v0", {"preemption": "swap"}),
    ("sarathi", {"chunk_size": 48}),
    ("orca", {}),
    ("static", {"batch_size": 3}),
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def workload(seed: int = 0, n: int = 9, shared_prefix: bool = False) -> list[RequestSpec]:
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        prompt = rng.randint(8, 70)
        out = rng.randint(2, 40)
        runs = None
        if shared_prefix:
            runs = ((("group", i % 2), 32), (("req", i), prompt))
            prompt += 32
        specs.append(RequestSpec(f"r{i}", 0.0, prompt, out, out, prompt_runs=runs))
    return specs


def recording(policy):
    """Wrap ``policy.schedule`` to log each plan's composition and preemptions."""
    log = []
    inner = policy.schedule

    def schedule():
        plan = inner()
        if plan.scheduled or plan.padding_tokens:
            log.append((tuple((r.id, n, c) for r, n, c in zip(plan.scheduled, plan.num_new_tokens, plan.context)),
                        tuple(r.id for r in plan.preempted)))
        return plan

    policy.schedule = schedule
    return log


def real_engine(name: str, knobs: dict, limits: EngineLimits, *, check: bool = True) -> RealEngine:
    runner = make_runner("tiny", num_blocks=limits.num_gpu_blocks + 1, block_size=limits.block_size, num_layers=1)
    executor = StepExecutor(runner, max_model_len=limits.max_model_len, max_batch=limits.max_num_seqs)
    return RealEngine(make_policy(name, limits, **knobs), executor, max_model_len=limits.max_model_len,
                      num_cpu_blocks=limits.num_cpu_blocks, check=check, clock=Clock("thread"))


@pytest.mark.parametrize("name,knobs", CASES, ids=[f"{n}-{'-'.join(map(str, k.values())) or 'default'}"
                                                   for n, k in CASES])
def test_real_engine_makes_the_simulators_decisions(name, knobs):
    limits = EngineLimits(**LIMITS)
    specs = workload(seed=11, shared_prefix=bool(knobs.get("enable_prefix_caching")))

    sim_policy = make_policy(name, limits, **knobs)
    sim_log = recording(sim_policy)
    latency = ConstantLatency(0.01, get_model("tiny"), get_gpu("cpu"), 1, limits.block_size)
    recorder = Simulation(specs, [(sim_policy, latency)], limits.max_model_len, fast_forward=False).run()
    sim_requests = recorder.requests_frame()

    engine = real_engine(name, knobs, limits)
    run = engine.run(specs)
    real_log = [(step.batch, step.preempted) for step in run.steps]
    real_requests = run.requests_frame()

    assert real_log == sim_log
    assert (real_requests["state"] == "finished").all()
    for column in ("generated", "preemptions", "swaps", "state"):
        assert real_requests[column].tolist() == sim_requests[column].tolist(), column
    assert len(run.steps) == len(recorder.steps_frame())
    if knobs.get("preemption") == "swap":
        assert run.steps and sum(s.swap_blocks for s in run.steps) > 0  # the swap path really ran
    if name in ("vllm-v1", "vllm-v0", "sarathi"):
        assert real_requests["preemptions"].sum() > 0  # the pool is small enough to preempt


def test_block_check_catches_a_block_mapped_twice():
    limits = EngineLimits(**LIMITS)
    engine = real_engine("vllm-v0", {}, limits)
    side = engine.blocks
    assert isinstance(side, SideBlocks)
    side.table(Request("a", 0.0, 20, 4), 20)
    side.tables["b"] = list(side.tables["a"])  # corrupt: b shares a's blocks
    engine.records = {}
    with pytest.raises(AssertionError, match="two requests"):
        engine.check_blocks()


def test_prompt_ids_follow_the_prompt_runs():
    a = Request("a", 0.0, 40, 4, prompt_runs=((("sys", 0), 24), (("req", "a"), 16)))
    b = Request("b", 0.0, 40, 4, prompt_runs=((("sys", 0), 24), (("req", "b"), 16)))
    ia, ib = prompt_token_ids(a, 1000), prompt_token_ids(b, 1000)
    assert len(ia) == 40 and ia[:24] == ib[:24] and ia[24:] != ib[24:]


def test_decode_graph_buffers_give_the_same_tokens_as_a_step():
    runner = make_runner("tiny", num_blocks=300, block_size=16, num_layers=2)
    allocator = BlockAllocator(300, shuffle_seed=3)
    batch = synthetic_batch([(1, 3 + 41 * i) for i in range(5)], allocator, 16)
    batch = [SeqInput(s.num_new_tokens, s.context_len, s.block_table, [11 + 7 * i]) for i, s in enumerate(batch)]
    graphs = DecodeGraphs(runner, max_model_len=256, batch_sizes=[1, 2, 8], capture=False)
    assert graphs.fits(batch) and graphs.size_for(5) == 8
    expected = runner.step(batch)
    assert graphs.run(batch).tolist() == expected
    assert graphs.run(batch[:2]).tolist() == expected[:2]  # a smaller size reuses the same buffers


def test_swap_out_and_in_restores_the_kv_exactly():
    runner = make_runner("tiny", num_blocks=40, block_size=16, num_layers=2)
    cache = runner.cache
    pool = HostKVPool(cache, max_blocks=16, initial_blocks=2)  # grows on demand
    before = cache.data[:, :, [3, 9, 4]].clone()
    host = pool.swap_out([3, 9, 4])
    cache.data[:, :, [3, 9, 4]] = 0.0
    pool.swap_in(host, [20, 21, 30])
    assert torch.equal(cache.data[:, :, [20, 21, 30]], before)
    assert pool.num_used == 0


def test_requests_reach_the_policy_only_after_they_arrive():
    limits = EngineLimits(**LIMITS)
    specs = [RequestSpec("early", 0.0, 30, 6, 6), RequestSpec("late", 0.5, 30, 6, 6)]
    run = real_engine("vllm-v1", {}, limits).run(specs)
    first_late = next(s for s in run.steps if any(rid == "late" for rid, _, _ in s.batch))
    assert first_late.start_s >= 0.5
    frame = run.requests_frame().set_index("id")
    assert frame.loc["late", "ttft_s"] > 0 and frame.loc["late", "first_token_s"] > 0.5
    assert (frame["state"] == "finished").all()
