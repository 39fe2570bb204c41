"""Property-based tests: every policy keeps its invariants on random workloads and knobs.

Hypothesis draws engine limits (block size, pool size, token budget, max_num_seqs,
max_model_len, swap pool), a policy's knobs and a handful of requests (arrival step, prompt,
true output length, max_tokens, priority, a shared prompt prefix), then runs the policy with
every check of tests/policy_invariants.py on: blocks conserved at every step and all free at the
end, no request scheduled beyond its length, token budget and max_num_seqs never exceeded, every
request finished (with the right token count) or rejected with a reason, recompute victims
recompute prompt + generated tokens, swap victims get their blocks back, and no endless
preempt/readmit loop (a step cap and a wall-clock alarm). The same checks run through
``sim.engine`` for fewer examples, where TTFT <= E2E is checked on the results too.

Budget: ``tests/fuzz_profiles.py`` (``make test``: fixed examples; ``make fuzz``: deep).
"""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from policies.base import EngineLimits, Request
from policies.registry import POLICIES, make_policy
from sim.engine import Simulation
from sim.latency.constant import ConstantLatency
from sim.workload.request_spec import RequestSpec
from tests.fuzz_profiles import examples
from tests.helpers import FAKE_GPU, FAKE_MODEL, wall_clock_limit
from tests.policy_invariants import Checked, InvariantChecker, drive

POLICY_NAMES = ["static", "orca", "vllm-v1", "vllm-v0", "sarathi", "sglang", "tgi", "trtllm"]
WALL_LIMIT_S = 20  # one example; far above what any takes (an endless loop is caught here)


def test_every_registered_policy_is_covered():
    assert sorted(POLICIES) == sorted(POLICY_NAMES)


# --- strategies --------------------------------------------------------------------------------
@st.composite
def limits_st(draw) -> EngineLimits:
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    return EngineLimits(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(1, 40)) * (16 // block_size if draw(st.booleans()) else 1),
        num_cpu_blocks=draw(st.sampled_from([0, 4, 64])),
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(block_size, 400)),
        max_model_len=draw(st.integers(2, 400)),
    )


def knobs_st(name: str):
    wm = st.sampled_from([0.0, 0.01, 0.1, 0.3])
    if name == "static":
        return st.fixed_dictionaries({"batch_size": st.one_of(st.none(), st.integers(1, 5))})
    if name == "orca":
        return st.just({})
    if name == "vllm-v1":
        return st.fixed_dictionaries({
            "watermark": wm,
            "long_prefill_token_threshold": st.sampled_from([0, 1, 7, 64]),
            "scheduling_policy": st.sampled_from(["fcfs", "priority"]),
            "enable_prefix_caching": st.booleans(),
            "scheduler_reserve_full_isl": st.booleans(),
            "enable_chunked_prefill": st.booleans(),
        })
    if name == "vllm-v0":
        return st.fixed_dictionaries({"preemption": st.sampled_from(["recompute", "swap"]), "watermark": wm})
    if name == "sarathi":
        return st.fixed_dictionaries({"chunk_size": st.sampled_from([3, 16, 64, 512]), "watermark": wm})
    if name == "sglang":
        return st.fixed_dictionaries({
            "schedule_policy": st.sampled_from(["fcfs", "lpm", "dfs-weight", "lof", "random"]),
            "chunked_prefill_size": st.sampled_from([None, -1, 7, 64]),
            "max_prefill_tokens": st.sampled_from([16, 16384]),
            "enable_mixed_chunk": st.booleans(),
            "disable_radix_cache": st.booleans(),
            "page_size": st.sampled_from([1, 1, 2, 4]),
            "init_new_token_ratio": st.sampled_from([0.0, 0.7]),
        })
    if name == "tgi":
        return st.fixed_dictionaries({
            "max_batch_prefill_tokens": st.sampled_from([3, 16, 64, 4096]),
            "prefill_chunking": st.booleans(),
            "waiting_served_ratio": st.sampled_from([0.0, 0.3, 1.2]),
            "max_waiting_tokens": st.sampled_from([0, 2, 20]),
            "prefix_caching": st.booleans(),
            "block_size": st.sampled_from([1, 1, 2, 4]),
            "max_concurrent_requests": st.sampled_from([3, 128, 128]),
        })
    if name == "trtllm":
        return st.fixed_dictionaries({
            "capacity_scheduler_policy": st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH"]),
            "enable_chunked_prefill": st.booleans(),
            "context_chunking_policy": st.sampled_from(["FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"]),
            "enable_block_reuse": st.booleans(),
        })
    raise AssertionError(name)


def fitted(name: str, limits: EngineLimits, knobs: dict) -> dict:
    """trtllm's blocks are those of the drawn limits (tokens_per_block = block_size), so that the
    checker's "fits every limit" reads the pool in the policy's own blocks."""
    if name == "trtllm":
        return {**knobs, "tokens_per_block": limits.block_size}
    return knobs


@st.composite
def workload_st(draw, max_requests: int = 14):
    """(arrival step, prompt, true output, max_tokens, priority, prefix group, prefix length) rows."""
    n = draw(st.integers(1, max_requests))
    prefix_len = draw(st.sampled_from([0, 8, 40]))
    rows = []
    for _ in range(n):
        out = draw(st.integers(1, 60))
        rows.append((
            draw(st.integers(0, 25)),
            draw(st.one_of(st.integers(1, 40), st.integers(1, 300))),
            out,
            out + draw(st.sampled_from([0, 0, 5, 50])),
            draw(st.integers(0, 2)),
            draw(st.integers(0, 1)),
            prefix_len,
        ))
    return rows


def arrival_time(step: int, i: int) -> float:
    """Distinct arrival times, in request order within a step. Why not ``float(step)``: vLLM V1's
    priority policy preempts ``max(running, key=(priority, arrival))``, the *first* of tied
    requests, and two tied requests that together overflow the pool can then preempt each other
    forever (test_vllm_v1_priority_ties_can_livelock_and_the_cap_ends_it). Real arrival clocks
    never tie; the property holds for them."""
    return step + i * 1e-4


def make_requests(rows) -> list[tuple[int, Request, int]]:
    out = []
    for i, (step, prompt, true_out, max_tokens, prio, group, plen) in enumerate(rows):
        rid = f"r{i:03d}"
        shared = min(plen, prompt)
        runs = ((("group", group), shared),) if shared else ()
        if prompt > shared:
            runs += ((("req", rid), prompt - shared),)
        out.append((step, Request(rid, arrival_time(step, i), prompt, max_tokens, prio, runs, seq=i), true_out))
    return out


# --- the pure driver: every policy, every knob ----------------------------------------------
def _check_policy(name, limits, knobs, rows):
    knobs = fitted(name, limits, knobs)
    policy = make_policy(name, limits, **knobs)
    with wall_clock_limit(WALL_LIMIT_S):
        checker = drive(policy, make_requests(rows), limits)
    for what, n in checker.seen.items():  # `--hypothesis-show-statistics` shows what was covered
        if n:
            event(what)


@pytest.mark.parametrize("name", POLICY_NAMES)
@examples(ci=250)
@given(data=st.data())
def test_property_policy_invariants_hold_on_random_workloads(name, data):
    limits = data.draw(limits_st(), label="limits")
    knobs = data.draw(knobs_st(name), label="knobs")
    rows = data.draw(workload_st(), label="requests")
    _check_policy(name, limits, knobs, rows)


@pytest.mark.parametrize("name", POLICY_NAMES)
@examples(ci=80)
@given(data=st.data())
def test_property_memory_pressure_forces_preemption_and_still_conserves(name, data):
    """A small pool and long outputs: preemption (or rejection) on nearly every example."""
    block_size = data.draw(st.sampled_from([1, 4, 16]), label="block_size")
    limits = EngineLimits(block_size=block_size, num_gpu_blocks=data.draw(st.integers(2, 12)) * (16 // block_size),
                          num_cpu_blocks=data.draw(st.sampled_from([0, 8, 200])), max_num_seqs=4,
                          max_num_batched_tokens=256, max_model_len=256)
    knobs = data.draw(knobs_st(name), label="knobs")
    n = data.draw(st.integers(2, 6))
    rows = [(data.draw(st.integers(0, 3)), data.draw(st.integers(1, 60)), out, out, 0, 0, 0)
            for out in data.draw(st.lists(st.integers(20, 120), min_size=n, max_size=n))]
    _check_policy(name, limits, knobs, rows)


# --- hand-picked cases the random draws might miss ---------------------------------------------
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_property_requests_longer_than_the_pool_or_max_model_len_are_rejected_and_counted(name):
    """Too long for max_model_len; more blocks than the whole pool; and one that outgrows the
    pool while decoding: each rejected with a reason (or finished at max_model_len), the rest
    finished, and no endless preempt/readmit loop (step cap and wall-clock alarm)."""
    limits = EngineLimits(block_size=16, num_gpu_blocks=8, num_cpu_blocks=16, max_num_seqs=4,
                          max_num_batched_tokens=512, max_model_len=512)
    rows = [
        (0, 600, 5, 5, 0, 0, 0),      # prompt longer than max_model_len
        (0, 200, 5, 5, 0, 0, 0),      # 13 blocks of prompt: more than the pool of 8
        (0, 20, 400, 400, 0, 0, 0),   # grows past the pool (8 blocks = 128 tokens) while decoding
        (1, 10, 4, 4, 0, 0, 0),       # fits: must finish
        (2, 30, 6, 6, 0, 0, 0),       # fits: must finish
    ]
    knobs = {"vllm-v0": {"preemption": "swap"}}.get(name, {})
    policy = make_policy(name, limits, **knobs)
    with wall_clock_limit(WALL_LIMIT_S):
        checker = drive(policy, make_requests(rows), limits, max_steps=5000)
    states = {rid: (req.status.value, req.reject_reason) for rid, req in checker.requests.items()}
    assert states["r000"][0] == "rejected" and states["r001"][0] == "rejected", states
    assert states["r002"][0] == "rejected", states  # 420 tokens can never fit 128 token slots
    assert states["r003"][0] == "finished" and states["r004"][0] == "finished", states
    assert all(reason for status, reason in states.values() if status == "rejected")


@pytest.mark.parametrize("name", ["vllm-v0", "sarathi", "vllm-v1"])
def test_property_a_lone_request_filling_the_pool_exactly_ends(name):
    """The tightest self-preemption case: one request whose blocks fill the pool exactly
    (watermark 0), still decoding. It must finish or be rejected, within the step cap."""
    limits = EngineLimits(block_size=4, num_gpu_blocks=5, max_num_seqs=2, max_num_batched_tokens=64,
                          max_model_len=64)
    knobs = {"vllm-v1": {}}.get(name, {"watermark": 0.0})
    for prompt in range(1, 21):
        policy = make_policy(name, limits, **knobs)
        with wall_clock_limit(WALL_LIMIT_S):
            drive(policy, make_requests([(0, prompt, 40, 40, 0, 0, 0)]), limits, max_steps=3000)


# --- through the engine ------------------------------------------------------------------------
def _simulate_checked(name, limits, knobs, rows, step_s=0.01):
    """Through sim.engine step by step with every check on; then the same run with the engine's
    fast-forward through pure-decode stretches (the default), which must give the same results."""
    knobs = fitted(name, limits, knobs)
    reqs = make_requests(rows)
    true_out = {req.id: out for _, req, out in reqs}
    specs = [RequestSpec(req.id, req.arrival_s * step_s, req.prompt_tokens, out, req.max_tokens, req.priority,
                         req.prompt_runs) for step, req, out in reqs]
    policy = make_policy(name, limits, **knobs)
    checker = InvariantChecker(policy, limits, true_out)
    latency = ConstantLatency(step_s, FAKE_MODEL, FAKE_GPU, 1, limits.block_size)
    with wall_clock_limit(WALL_LIMIT_S):
        frame = Simulation(specs, [(Checked(policy, checker), latency)], limits.max_model_len,
                           fast_forward=False).run().requests_frame()
        fast = make_policy(name, limits, **knobs)
        fast_checker = InvariantChecker(fast, limits, true_out)
        submit = fast.add_request
        fast.add_request = lambda req: (fast_checker.add(req), submit(req))  # the instance only
        fast_frame = Simulation(specs, [(fast, latency)], limits.max_model_len,
                                fast_forward=True).run().requests_frame()
    checker.at_end()
    fast_checker.at_end()  # end state of the fast-forwarded run: all ended, every block free
    cols = ["id", "state", "reason", "generated", "admitted_s", "first_token_s", "finish_s", "preemptions"]
    assert frame[cols].equals(fast_frame[cols]), "fast-forward changed the results"
    return frame, checker


@pytest.mark.parametrize("name", POLICY_NAMES)
@examples(ci=30)
@given(data=st.data())
def test_property_engine_runs_keep_invariants_and_ttft_le_e2e(name, data):
    limits = data.draw(limits_st(), label="limits")
    knobs = data.draw(knobs_st(name), label="knobs")
    rows = data.draw(workload_st(max_requests=7), label="requests")
    frame, checker = _simulate_checked(name, limits, knobs, rows)
    assert set(frame["state"]) <= {"finished", "rejected"}, frame[["id", "state", "reason"]]
    assert (frame.loc[frame["state"] == "rejected", "reason"] != "").all()
    fin = frame[frame["state"] == "finished"]
    assert (fin["ttft_s"] <= fin["e2e_s"]).all()
    assert (fin["first_token_s"] >= fin["arrival_s"]).all()
    expected = [checker.expected_output(checker.requests[rid]) for rid in fin["id"]]
    assert fin["generated"].tolist() == expected


def test_property_engine_schedules_again_after_an_empty_plan_that_freed_memory():
    """Found by the property test: vllm-v0 preempts its only decode (it outgrew the prompt
    limit) and rejects it in a step that schedules nothing, while another request waits. The
    engine must schedule again at once (the memory is free now), not end the waiting request
    as "stuck" or leave it waiting for an unrelated arrival."""
    limits = EngineLimits(block_size=1, num_gpu_blocks=1, max_num_seqs=1, max_num_batched_tokens=1, max_model_len=3)
    rows = [(0, 1, 2, 2, 0, 0, 0), (0, 1, 1, 1, 0, 0, 0), (50, 1, 1, 1, 0, 0, 0)]
    frame, _ = _simulate_checked("vllm-v0", limits, {"watermark": 0.0}, rows, step_s=1.0)
    by_id = frame.set_index("id")
    assert by_id.loc["r000", "state"] == "rejected"
    assert by_id.loc["r001", "state"] == "finished"
    assert by_id.loc["r001", "finish_s"] < 50  # served right away, not after the next arrival
