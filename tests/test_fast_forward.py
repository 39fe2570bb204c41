"""Fast-forward through pure-decode stretches is exact: runs with it on and off agree bit for bit.

For every policy and a range of workloads (prefix caching with shared prompts, preemption
pressure, priority scheduling, a waiting queue held back by max_num_seqs, arrivals that tie with
step ends, max_model_len cut-offs, several replicas, a horizon) the same simulation runs with
fast-forward on and off: the steps frames must be identical, every request's row and token times
identical, and the summaries equal. The policy hook itself (``advance_decodes``) is checked
against single steps on the complete scheduler state (block tables, free queue, prefix-cache
registry and hash ids), and the engine's numeric building blocks (landing time, cumulative
sums, decode step shapes, ITL order statistics) each against their step-by-step definition.
"""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pandas as pd
import pytest

from policies.base import EngineLimits, Request, StepPlan, emit_tokens
from policies.registry import POLICIES, make_policy
from sim.engine import Simulation, fast_step_shape, landing_delay
from sim.hardware.gpus import get_gpu
from sim.hardware.models import get_model
from sim.latency.base import step_shape
from sim.latency.constant import ConstantLatency
from sim.latency.roofline import RooflineLatency
from sim.metrics.recorder import weighted_stats
from sim.metrics.summary import PERCENTILES, stats, summarize
from sim.workload.request_spec import RequestSpec
from tests.helpers import FAKE_GPU, FAKE_MODEL, FAKE_SPEC

MODEL, GPU = get_model("llama-3-8b"), get_gpu("h200")


def workload(seed: int, n: int = 120, rate: float = 40.0, max_prompt: int = 600, max_out: int = 120,
             groups: int = 0, prefix_len: int = 0, extra_max_tokens: int = 0, arrival_grid: float = 0.0,
             priorities: int = 0) -> list[RequestSpec]:
    """Random requests; ``groups`` > 0 gives shared prompt prefixes (prefix-cache hits);
    ``arrival_grid`` > 0 puts arrivals on a grid (ties with constant-latency step ends)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        arrival = round(t / arrival_grid) * arrival_grid if arrival_grid else t
        prompt = rng.randint(1, max_prompt)
        runs = None
        if groups:
            shared = min(prefix_len, prompt)
            runs = tuple(r for r in ((("group", rng.randrange(groups)), shared), (("own", i), prompt - shared))
                         if r[1] > 0)
        o = rng.randint(1, max_out)
        out.append(RequestSpec(f"r{i:04d}", arrival, prompt, o, o + rng.randint(0, extra_max_tokens),
                               rng.randrange(priorities) if priorities else 0, runs))
    out.sort(key=lambda s: s.arrival_s)
    return out


def latency(kind: str, block_size: int):
    if kind == "roofline":
        return RooflineLatency(MODEL, GPU, 1, block_size)
    if kind == "fake-roofline":
        # the per-operator roofline needs a real spec: the fake model's shapes as a ModelSpec
        return RooflineLatency(FAKE_SPEC, FAKE_GPU, 1, block_size)
    return ConstantLatency(0.25, FAKE_MODEL, FAKE_GPU, 1, block_size)


def simulate(name, specs, limits, lat="roofline", replicas=1, horizon_s=None, fast_forward=True, router=None,
             clients=None, drain_s=None, **knobs):
    from sim.routing import make_router

    pairs = [(make_policy(name, limits, **knobs), latency(lat, limits.block_size)) for _ in range(replicas)]
    sim = Simulation(specs, pairs, limits.max_model_len, horizon_s=horizon_s, fast_forward=fast_forward,
                     router=make_router(router) if router else None, clients=clients, drain_s=drain_s)
    rec = sim.run()
    requests, steps = rec.requests_frame(), rec.steps_frame()
    pol = pairs[0][0]
    summary = summarize(requests, steps, max_slots=pol.max_slots * replicas,
                        token_budget=pol.token_budget * replicas if pol.token_budget else None,
                        kv_blocks_total=pol.kv_blocks_total() * replicas, peak_flops=GPU.peak_flops,
                        hbm_bandwidth=GPU.hbm_bandwidth)
    stretched = sum(r.stretch_steps for r in sim.replicas)
    return requests, steps, summary, stretched, rec


def assert_same_run(a, b):
    (ra, sa, suma, *_), (rb, sb, sumb, *_) = a, b
    pd.testing.assert_frame_equal(sa, sb, check_exact=True)
    pd.testing.assert_frame_equal(ra.drop(columns="token_times_s"), rb.drop(columns="token_times_s"),
                                  check_exact=True)
    for x, y in zip(ra["token_times_s"], rb["token_times_s"]):
        assert np.array_equal(x, y)  # exact floats, not approximately
    assert_summaries_close(suma, sumb)


def assert_summaries_close(a, b, rel=1e-9):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_summaries_close(a[k], b[k], rel)
        elif isinstance(a[k], float) and isinstance(b[k], float):
            assert a[k] == pytest.approx(b[k], rel=rel, abs=0), k
        else:
            assert a[k] == b[k], k


LIMITS = EngineLimits(block_size=16, num_gpu_blocks=4000, max_num_seqs=64, max_num_batched_tokens=2048,
                      max_model_len=4096)
TIGHT = EngineLimits(block_size=16, num_gpu_blocks=180, num_cpu_blocks=200, max_num_seqs=32,
                     max_num_batched_tokens=512, max_model_len=1024)

CASES = {
    # name: (specs, limits, simulate kwargs)
    "plain": (lambda: workload(1), LIMITS, {}),
    "prefix-caching": (lambda: workload(2, groups=3, prefix_len=200), LIMITS, {"enable_prefix_caching": True}),
    "prefix-caching-pressure": (lambda: workload(3, groups=2, prefix_len=120, max_prompt=300, max_out=200),
                                TIGHT, {"enable_prefix_caching": True}),
    "preemption-pressure": (lambda: workload(4, max_prompt=300, max_out=250), TIGHT, {}),
    "priority": (lambda: workload(5, max_prompt=300, max_out=200, priorities=3), TIGHT,
                 {"scheduling_policy": "priority"}),
    "queue-held-by-max-num-seqs": (lambda: workload(6, n=150, rate=400.0, max_out=200),
                                   EngineLimits(block_size=16, num_gpu_blocks=4000, max_num_seqs=8,
                                                max_num_batched_tokens=2048, max_model_len=4096), {}),
    "arrivals-tie-step-ends": (lambda: workload(7, rate=3.0, arrival_grid=0.25), LIMITS, {"lat": "constant"}),
    "max-model-len-cut": (lambda: workload(8, max_prompt=200, max_out=400, extra_max_tokens=50),
                          EngineLimits(block_size=16, num_gpu_blocks=4000, max_num_seqs=64,
                                       max_num_batched_tokens=2048, max_model_len=256), {}),
    "replicas": (lambda: workload(9, n=200, rate=80.0), LIMITS, {"replicas": 3}),
    # routers that read the replicas' state when a request arrives
    "replicas-least-kv": (lambda: workload(15, n=200, rate=60.0), TIGHT, {"replicas": 2, "router": "least-kv"}),
    "replicas-least-outstanding": (lambda: workload(16, n=200, rate=60.0), LIMITS,
                                   {"replicas": 3, "router": "least-outstanding"}),
    "replicas-prefix-affinity": (lambda: workload(17, n=200, rate=60.0, groups=4, prefix_len=150), LIMITS,
                                 {"replicas": 2, "router": "prefix-affinity", "enable_prefix_caching": True}),
    "horizon": (lambda: workload(10, n=200, rate=80.0), LIMITS, {"horizon_s": 1.7}),
    "horizon-on-a-step-end": (lambda: workload(14, rate=3.0, arrival_grid=0.25), LIMITS,
                              {"lat": "constant", "horizon_s": 20.0}),
    "fake-model-watermark": (lambda: workload(11), TIGHT, {"lat": "fake-roofline", "watermark": 0.05}),
    "block-size-1": (lambda: workload(12, n=60, max_prompt=40, max_out=60),
                     EngineLimits(block_size=1, num_gpu_blocks=900, max_num_seqs=16,
                                  max_num_batched_tokens=256, max_model_len=512),
                     {"enable_prefix_caching": True}),
}


def run_with_and_without_fast_forward(case):
    """Simulate a case (specs maker, limits, simulate kwargs) with and without fast-forward on vLLM V1,
    check that it fast-forwarded and that both runs agree exactly; returns (on, off, specs, kwargs)."""
    make_specs, limits, kw = case
    specs = make_specs()
    on = simulate("vllm-v1", specs, limits, fast_forward=True, **kw)
    off = simulate("vllm-v1", specs, limits, fast_forward=False, **kw)
    assert on[3] > 0, "the workload never fast-forwarded: the comparison would prove nothing"
    assert_same_run(on, off)
    return on, off, specs, kw


@pytest.mark.parametrize("case", sorted(CASES))
def test_vllm_v1_fast_forward_is_exact(case):
    on, off, _, _ = run_with_and_without_fast_forward(CASES[case])
    assert off[3] == 0
    assert len(on[1]) > on[3]  # some steps were still taken one by one


def clients(concurrency: int, n: int, think: float | str = 0.0, ramp_s: float = 0.0, seed: int = 0,
            start: str = "even"):
    """Closed-loop clients (sim.workload.closed_loop): fixed or exponential think times; first sends
    even over ramp_s, or random (seeded) over it."""
    from sim.workload.closed_loop import ClosedLoop

    rng = np.random.default_rng(seed)
    thinks = rng.exponential(0.3, n) if think == "exp" else np.full(n, float(think))
    if start == "random":  # workload.arrival.start: random, as sim.workload.closed_loop draws it
        from types import SimpleNamespace

        from sim.workload.closed_loop import first_sends

        arrival = SimpleNamespace(start="random", ramp_s=ramp_s, concurrency=concurrency)
        first = first_sends(arrival, min(concurrency, n), seed)
    else:
        first = tuple(c * ramp_s / concurrency for c in range(min(concurrency, n)))
    return ClosedLoop(concurrency, first, thinks)


CLOSED_CASES = {
    # name: (specs, limits, simulate kwargs): the next arrival depends on a finish (sim.clients)
    "closed": (lambda: workload(20), LIMITS, {"clients": clients(12, 120)}),
    "closed-think": (lambda: workload(21), LIMITS, {"clients": clients(16, 120, think="exp", seed=1)}),
    "closed-ramp-fixed-think": (lambda: workload(22), LIMITS, {"clients": clients(10, 120, 0.05, ramp_s=1.0)}),
    "closed-random-start": (lambda: workload(33), LIMITS,
                            {"clients": clients(16, 120, ramp_s=0.7, seed=4, start="random")}),
    "closed-pressure": (lambda: workload(23, max_prompt=300, max_out=250), TIGHT, {"clients": clients(24, 120)}),
    "closed-prefix-caching": (lambda: workload(24, groups=3, prefix_len=200), LIMITS,
                              {"clients": clients(12, 120), "enable_prefix_caching": True}),
    "closed-constant-ties": (lambda: workload(25), LIMITS, {"clients": clients(8, 120, 0.25), "lat": "constant"}),
    "closed-replicas": (lambda: workload(26, n=200), LIMITS, {"clients": clients(30, 200), "replicas": 3}),
    "closed-replicas-think": (lambda: workload(27, n=200), LIMITS,
                              {"clients": clients(30, 200, think="exp", seed=2), "replicas": 3,
                               "router": "least-outstanding"}),
    "closed-replicas-least-kv": (lambda: workload(28, n=200), TIGHT,
                                 {"clients": clients(20, 200), "replicas": 2, "router": "least-kv"}),
    "closed-replicas-prefix-affinity": (lambda: workload(32, n=200, groups=4, prefix_len=150), LIMITS,
                                        {"clients": clients(24, 200, think="exp", seed=3), "replicas": 2,
                                         "router": "prefix-affinity", "enable_prefix_caching": True}),
    "closed-horizon": (lambda: workload(29, n=200), LIMITS, {"clients": clients(16, 200), "horizon_s": 2.5}),
    # the moving time cap: each send moves it, it stops the run after a send that did not come
    "closed-cap": (lambda: workload(30, n=200), LIMITS, {"clients": clients(2, 200, think=0.1), "drain_s": 0.6}),
}


@pytest.mark.parametrize("case", sorted(CLOSED_CASES))
def test_closed_loop_fast_forward_is_exact(case):
    on, _, specs, kw = run_with_and_without_fast_forward(CLOSED_CASES[case])
    assert on[0]["client"].max() == min(kw["clients"].concurrency, len(specs)) - 1


def test_closed_loop_cases_exercise_what_they_claim():
    def run(case):
        make_specs, limits, kw = CLOSED_CASES[case]
        return simulate("vllm-v1", make_specs(), limits, **kw)

    assert run("closed-pressure")[0]["preemptions"].sum() > 0
    requests, *_ = run("closed-cap")
    done = requests["state"] == "finished"
    assert done.sum() >= 3 and (requests.loc[~done, "reason"] == "horizon reached").all()
    requests, *_ = run("closed-horizon")
    assert (requests["reason"] == "horizon reached").any()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_a_closed_loop_the_same_with_fast_forward_on_and_off(name):
    specs = workload(31, n=80, max_prompt=300, max_out=150)
    limits = EngineLimits(block_size=16, num_gpu_blocks=400, num_cpu_blocks=200, max_num_seqs=16,
                          max_num_batched_tokens=512, max_model_len=1024)
    on = simulate(name, specs, limits, fast_forward=True, clients=clients(12, 80, think="exp"))
    off = simulate(name, specs, limits, fast_forward=False, clients=clients(12, 80, think="exp"))
    assert_same_run(on, off)
    assert on[0]["arrival_s"].notna().all() and on[0]["client"].nunique() == 12


def test_the_cases_exercise_what_they_claim():
    """Preemptions, prefix hits, queueing, cut-offs and the horizon really happen in the workloads."""
    def run(case):
        make_specs, limits, kw = CASES[case]
        return simulate("vllm-v1", make_specs(), limits, **kw)

    assert run("preemption-pressure")[0]["preemptions"].sum() > 0
    assert run("prefix-caching-pressure")[0]["preemptions"].sum() > 0
    requests, steps, *_ = run("queue-held-by-max-num-seqs")
    assert ((steps["waiting"] > 0) & (steps["running"] == 8) & (steps["prefill_tokens"] == 0)).sum() > 10
    requests, *_ = run("max-model-len-cut")
    cut = requests[requests["generated"] < requests["output_tokens"]]
    assert len(cut) and ((cut["prompt_tokens"] + cut["generated"]) == 256).all()
    requests, *_ = run("horizon")
    assert (requests["reason"] == "horizon reached").any()
    requests, steps, *_ = run("horizon-on-a-step-end")
    ends = steps["start_s"] + steps["duration_s"]
    assert ends.max() == 19.75 and (requests["reason"] == "horizon reached").any()  # the step ending at 20 is cut
    requests, steps, *_ = run("arrivals-tie-step-ends")
    assert np.isin(requests["arrival_s"], steps["start_s"] + steps["duration_s"]).sum() > 10
    _, steps, *_ = run("replicas")
    assert steps["replica"].nunique() == 3


@pytest.mark.parametrize("case, crosses", [("plain", True), ("replicas", True), ("replicas-least-outstanding", True),
                                           ("queue-held-by-max-num-seqs", True), ("arrivals-tie-step-ends", False),
                                           ("horizon", True), ("replicas-least-kv", False)])
def test_a_stretch_ends_with_the_step_an_arrival_falls_in(case, crosses, monkeypatch):
    """A stretch's last step may contain the next arrival (it was scheduled before it, the arrival
    only queues a request), and a stretch that ends with finishes is followed by the next one
    in the same timeout: the runs stay exact, the arrivals in that step count in its row's
    ``waiting`` only. An arrival on a step's end is not inside it (arrivals-tie-step-ends: every
    arrival ties with a step end, which SimPy orders by event id), and a router that reads KV
    state (least-kv) keeps every stretch's steps before the arrival and one stretch a timeout."""
    import sim.engine
    from sim.metrics.steps import ReplicaSteps

    seen = {"crossing": 0, "chained": 0, "waiting_changed": 0}
    chain = sim.engine.Replica._chain_stretches
    set_waiting = ReplicaSteps.set_last_waiting

    def chained(self, batch, context):
        before = self.stretches
        out = chain(self, batch, context)
        seen["crossing"] += out is not None and out[1]
        seen["chained"] += self.stretches - before > 1
        return out

    def waiting(steps, n):
        seen["waiting_changed"] += 1
        return set_waiting(steps, n)

    monkeypatch.setattr(sim.engine.Replica, "_chain_stretches", chained)
    monkeypatch.setattr(ReplicaSteps, "set_last_waiting", waiting)
    run_with_and_without_fast_forward(CASES[case])
    assert (seen["crossing"] > 0) == crosses
    assert (seen["chained"] > 0) == (case != "replicas-least-kv")
    if case == "queue-held-by-max-num-seqs":  # stretches run with a queue: arrivals lengthen it
        assert seen["waiting_changed"] > 0


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_the_same_with_fast_forward_on_and_off(name):
    specs = workload(13, n=80, max_prompt=300, max_out=150)
    limits = EngineLimits(block_size=16, num_gpu_blocks=400, num_cpu_blocks=200, max_num_seqs=16,
                          max_num_batched_tokens=512, max_model_len=1024)
    on = simulate(name, specs, limits, fast_forward=True)
    off = simulate(name, specs, limits, fast_forward=False)
    assert_same_run(on, off)


@pytest.mark.parametrize("name", sorted(n for n, cls in POLICIES.items() if not cls.finish_step_reads_plan))
def test_a_policy_that_reads_no_finish_plan_reads_none(name, monkeypatch):
    """``Policy.finish_step_reads_plan = False`` lets a stretch's last step pass an empty plan to
    ``finish_step``: one that fails on any read proves the claim (the run still equals the stepped one)."""
    import sim.engine

    class Unread:
        def __getattribute__(self, attr):
            raise AssertionError(f"{name}.finish_step read plan.{attr} after a stretch")

    monkeypatch.setattr(sim.engine, "UNREAD_PLAN", Unread())
    specs = workload(13, n=80, max_prompt=300, max_out=150)
    limits = EngineLimits(block_size=16, num_gpu_blocks=400, num_cpu_blocks=200, max_num_seqs=16,
                          max_num_batched_tokens=512, max_model_len=1024)
    on = simulate(name, specs, limits, fast_forward=True)
    assert on[3] > 100  # stretches ran (and ended requests in their last steps)
    assert_same_run(on, simulate(name, specs, limits, fast_forward=False))


def test_environment_variable_turns_fast_forward_off(monkeypatch):
    specs = workload(1, n=40)
    monkeypatch.setenv("CBSIM_NO_FAST_FORWARD", "1")
    pol = make_policy("vllm-v1", LIMITS)
    sim = Simulation(specs, [(pol, latency("roofline", 16))], LIMITS.max_model_len)
    sim.run()
    assert not sim.fast_forward and sim.replicas[0].stretch_steps == 0
    monkeypatch.delenv("CBSIM_NO_FAST_FORWARD")
    sim = Simulation(specs, [(make_policy("vllm-v1", LIMITS), latency("roofline", 16))], LIMITS.max_model_len)
    sim.run()
    assert sim.replicas[0].stretch_steps > 0


# --- the policy hook against single steps, on the whole scheduler state ------------------------

def policy_state(policy) -> tuple:
    kv, pool = policy.kv, policy.kv.pool
    reqs = sorted(kv.request_states().items(), key=lambda kv_: kv_[0].id)
    return (
        [(r.id, r.num_computed_tokens, r.num_output_tokens, r.status, list(st.blocks), st.num_cached_blocks,
          list(st.hashes.hashes) if st.hashes else None) for r, st in reqs],
        [r.id for r in policy.running], [r.id for r in policy.waiting_requests()],
        pool.free_queue(), list(pool.ref_cnt), list(pool.block_hash),
        {h: list(c) for h, c in sorted(pool._cached.items())},
        dict(kv.hasher._ids) if kv.hasher else None,
        kv.held_token_slots, policy.kv_tokens_reserved_and_used(), policy.kv_blocks_used(),
    )


@pytest.mark.parametrize("seed", range(12))
def test_advance_decodes_equals_single_steps(seed):
    rng = random.Random(seed)
    caching = seed % 3 != 0
    limits = EngineLimits(block_size=rng.choice([1, 4, 16]), num_gpu_blocks=rng.randint(60, 400),
                          max_num_seqs=rng.randint(2, 12), max_num_batched_tokens=rng.choice([64, 256]),
                          max_model_len=rng.choice([128, 512]))
    policy = make_policy("vllm-v1", limits, enable_prefix_caching=caching)
    prompts = [(("shared",), rng.randint(1, 40))]
    for i in range(rng.randint(2, 14)):
        n = rng.randint(1, 60)
        runs = ((prompts[0][0], min(n, prompts[0][1])),) + (((("own", i), n - prompts[0][1]),)
                                                          if n > prompts[0][1] else ())
        policy.add_request(Request(f"q{i}", 0.0, n, 10**6, prompt_runs=runs, output_key=("out", i % 3), seq=i))
    checked = 0
    for _ in range(300):
        if not policy.has_work():
            break
        got = policy.decode_stretch()
        if got is not None:
            batch, ctx = got
            assert ctx == sum(r.num_computed_tokens for r in batch)
            assert all(r.num_computed_tokens == r.num_tokens - 1 for r in batch)
            k_room = min(limits.max_model_len - r.num_tokens for r in batch) - 1
            k = policy.decode_stretch_limit(batch, max(k_room, 0))
            if k >= 1:
                twin = copy.deepcopy(policy)
                expected = ([], [], [])
                for _ in range(k):
                    plan = twin.schedule()
                    assert plan.num_new_tokens == [1] * len(batch) and not plan.preempted and not plan.admitted
                    assert len(emit_tokens(plan)) == len(batch)
                    twin.finish_step(plan, [])
                    reserved, used = twin.kv_tokens_reserved_and_used()
                    for lst, v in zip(expected, (twin.kv_blocks_used(), reserved, used)):
                        lst.append(v)
                got_stats = policy.advance_decodes(list(batch), k)
                assert tuple(map(list, got_stats)) == expected
                assert policy_state(policy) == policy_state(twin)
                checked += 1
                if k < k_room:  # the limit is tight: one more step would not fit the free blocks
                    assert policy.kv.decode_blocks_needed(batch, 1) > policy.num_free_blocks or \
                        policy.decode_stretch_limit(batch, 1) == 0
        plan = policy.schedule()
        finished = [r for r in emit_tokens(plan) if r.num_tokens >= limits.max_model_len
                    or rng.random() < 0.02]
        policy.finish_step(plan, finished)
    assert checked > 0


def test_decode_stretch_stops_where_the_free_blocks_end():
    limits = EngineLimits(block_size=4, num_gpu_blocks=12, max_num_seqs=4, max_num_batched_tokens=64,
                          max_model_len=512)
    policy = make_policy("vllm-v1", limits)
    reqs = [Request(f"a{i}", 0.0, 4, 1000, seq=i) for i in range(3)]
    for r in reqs:
        policy.add_request(r)
    plan = policy.schedule()  # three prompts of one full block each: 3 blocks used, 9 free
    policy.finish_step(plan, [])
    emit_tokens(plan)
    batch, ctx = policy.decode_stretch()
    assert ctx == 12 and policy.num_free_blocks == 9
    # each request takes a block at steps 1, 5, 9, 13 (positions 4, 8, 12, 16): 9 blocks last 12 steps
    assert policy.decode_stretch_limit(batch, 100) == 12
    assert policy.kv.decode_blocks_needed(batch, 13) == 12 > 9 == policy.kv.decode_blocks_needed(batch, 12)


def test_no_stretch_while_a_prompt_is_mid_prefill_or_a_request_waits_for_room():
    limits = EngineLimits(block_size=16, num_gpu_blocks=100, max_num_seqs=2, max_num_batched_tokens=32,
                          max_model_len=512)
    policy = make_policy("vllm-v1", limits)
    policy.add_request(Request("long", 0.0, 100, 50, seq=0))
    plan = policy.schedule()
    emit_tokens(plan)
    policy.finish_step(plan, [])
    assert policy.decode_stretch() is None  # 32 of 100 prompt tokens computed
    while policy.running[0].num_output_tokens == 0:
        plan = policy.schedule()
        emit_tokens(plan)
        policy.finish_step(plan, [])
    assert policy.decode_stretch() is not None
    policy.add_request(Request("new", 0.0, 10, 5, seq=1))  # would be admitted next step
    assert policy.decode_stretch() is None


# --- the engine's building blocks ---------------------------------------------------------------

def test_landing_delay_lands_exactly_or_says_it_cannot():
    rng = random.Random(0)
    impossible = 0
    for _ in range(20000):
        now = rng.uniform(0, 50) * 10 ** rng.randint(-3, 3)
        target = now + rng.uniform(0, 3) * 10 ** rng.randint(-3, 4)
        d = landing_delay(now, target)
        if d is None:
            impossible += 1
            e = target - now  # no float delay near the difference lands there
            for _ in range(64):
                assert now + e != target
                e = math.nextafter(e, math.inf)
        else:
            assert d >= 0 and now + d == target
    assert landing_delay(0, 0.125) == 0.125
    assert impossible < 2000


def test_cumsum_adds_step_times_one_after_another_as_simpy_does():
    rng = np.random.default_rng(1)
    for _ in range(50):
        now = float(rng.uniform(0, 1e4))
        dts = rng.uniform(1e-4, 0.2, size=int(rng.integers(1, 500)))
        times = np.cumsum(np.concatenate(([now], dts)))
        t = now
        for i, dt in enumerate(dts, 1):
            t = t + float(dt)
            assert times[i] == t


def test_decode_pricer_equals_the_models_own_price_step_by_step():
    from sim.engine import DecodePricer

    rng = random.Random(3)
    for lat in (latency("roofline", 16), latency("constant", 16), latency("fake-roofline", 16)):
        pricer = DecodePricer(lat)
        for _ in range(20):
            ctxs = [rng.randint(1, 5000) for _ in range(rng.randint(1, 256))]
            batch = [Request(str(i), 0.0, c, 10**6) for i, c in enumerate(ctxs)]
            for r, c in zip(batch, ctxs):
                r.num_computed_tokens = c
            k = rng.randint(1, 300)
            dts, flops, bytes_ = pricer.price(batch, sum(ctxs), k)
            for j in sorted({0, k - 1, rng.randrange(k)}):
                plan = StepPlan(scheduled=batch, num_new_tokens=[1] * len(batch), context=[c + j for c in ctxs])
                dt, f, by = lat.price(step_shape(plan), plan)
                assert (dts[j], flops[j], bytes_[j]) == (dt, f, by)
                assert type(by) is int or bytes_.dtype.kind == "f"
        assert pricer.custom is not None or pricer.kind is not None  # vectorized: never fell back


def test_fast_step_shape_equals_step_shape():
    rng = random.Random(4)
    for _ in range(500):
        b = rng.randint(1, 20)
        decode = rng.random() < 0.5
        plan = StepPlan()
        for i in range(b):
            n = 1 if decode else rng.choice([0, 1, 1, rng.randint(1, 300)])
            plan.add(Request(str(i), 0.0, 10, 10), n, rng.randint(0 if not decode else 1, 900))
        if rng.random() < 0.1:
            plan.padding_tokens, plan.padding_context = rng.randint(0, 5), rng.randint(0, 50)
        assert fast_step_shape(plan) == step_shape(plan)


def test_weighted_order_statistics_equal_numpy_percentile():
    rng = np.random.default_rng(5)
    for _ in range(200):
        distinct = rng.uniform(0, 1, size=int(rng.integers(1, 40)))
        if rng.random() < 0.3:
            distinct = np.round(distinct, 2)  # repeated values
        weights = rng.integers(1, 6, size=len(distinct))
        full = np.repeat(distinct, weights)
        got = weighted_stats(distinct, weights, PERCENTILES)
        want = stats(full)
        for p in PERCENTILES:
            assert got[f"p{p}"] == want[f"p{p}"]
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-12)
    empty = weighted_stats(np.zeros(0), np.zeros(0, dtype=np.int64), PERCENTILES)
    assert empty == {"mean": None, "p50": None, "p90": None, "p99": None}


# --- token times kept as runs of steps -----------------------------------------------------------

def test_itl_from_runs_equals_itl_from_every_token_time():
    specs = workload(4, max_prompt=300, max_out=250)
    requests, steps, summary, _, rec = simulate("vllm-v1", specs, TIGHT)
    assert requests["preemptions"].sum() > 0  # runs broken by recompute preemptions
    assert any(r.runs for r in rec.records)
    from_runs = rec.itl_stats()
    assert {k: from_runs[k] for k in ("p50", "p90", "p99")} == {k: summary["itl_s"][k] for k in ("p50", "p90", "p99")}
    assert from_runs["mean"] == pytest.approx(summary["itl_s"]["mean"], rel=1e-12)
    for i, r in enumerate(rec.records):
        assert np.array_equal(np.asarray(r.token_times), requests["token_times_s"][i])
        assert np.array_equal(rec.token_times(i), requests["token_times_s"][i])
        assert len(r.token_times) == r.generated
        assert not requests["token_times_s"][i].flags.writeable  # views shared by requests of a step


def test_each_request_token_times_are_its_runs_over_every_replica_end_times():
    """``times_per_request``: a request of one run gets a slice of the end times laid end to end
    (replica after replica), one of several runs its runs joined in order, one of none an empty
    array; each equal to the flattened times of its runs."""
    from sim.metrics.token_times import flat_times_of_runs, times_per_request

    class Steps:  # a replica's end times, as sim.metrics.steps.ReplicaSteps gives them
        def __init__(self, ends):
            self.ends = np.asarray(ends, dtype=np.float64)

        def __len__(self):
            return len(self.ends)

        def end_times(self):
            return self.ends

    for replicas in ([Steps([0.5, 1.0, 1.5, 2.0, 2.5])], [Steps([0.5, 1.0, 1.5]), Steps([0.7, 1.1, 1.6, 2.2])]):
        # request 0: steps 0-2; 1: none; 2: steps 1 and 3-4 (two runs); 3: step 4
        starts, lengths, counts = (np.array(a, dtype=np.int64) for a in ([0, 1, 3, 4], [3, 1, 2, 1], [1, 0, 2, 1]))
        got = times_per_request(replicas, starts, lengths, counts)
        flat = flat_times_of_runs(replicas, starts, lengths)
        bounds = np.concatenate(([0], np.cumsum([3, 0, 3, 1])))
        assert len(got) == 4 and got.dtype == object
        for i in range(4):
            assert got[i].dtype == np.float64 and not got[i].flags.writeable
            assert np.array_equal(got[i], flat[bounds[i]:bounds[i + 1]])
        assert np.array_equal(got[2], np.concatenate([flat[3:4], flat[4:6]]))
        assert all(s.ends.flags.writeable for s in replicas)  # the replicas' own buffers are not frozen


def test_large_runs_leave_token_times_out_of_memory_and_keep_the_summary(monkeypatch, repo):
    from sim.runner import run

    overrides = ["workload.num_requests=150", "policies=[{name: vllm-v1}]"]
    full = run(repo / "scenarios" / "quickstart.yaml", overrides)
    monkeypatch.setenv("CBSIM_TOKEN_TIMES_LIMIT", "1000")
    lean = run(repo / "scenarios" / "quickstart.yaml", overrides)
    assert "token_times_s" in full.requests and "token_times_s" not in lean.requests
    pd.testing.assert_frame_equal(full.requests.drop(columns="token_times_s"), lean.requests, check_exact=True)
    pd.testing.assert_frame_equal(full.steps, lean.steps, check_exact=True)
    assert_summaries_close(full.summaries["vllm-v1"], lean.summaries["vllm-v1"], rel=1e-12)


def test_steps_of_several_replicas_are_in_the_order_they_ended():
    specs = workload(9, n=200, rate=20.0, arrival_grid=0.25)
    _, steps, *_ = simulate("vllm-v1", specs, LIMITS, lat="constant", replicas=3)
    ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
    assert (np.diff(ends) >= 0).all()
    ties = np.flatnonzero(np.diff(ends) == 0)
    assert len(ties) and (np.diff(steps["replica"].to_numpy())[ties] > 0).all()  # constant steps tie
    assert (steps["step"] == np.arange(len(steps))).all()


def test_runs_are_byte_identical_run_to_run(tmp_path):
    specs = workload(2, groups=3, prefix_len=200)
    paths = []
    for i in range(2):
        requests, steps, summary, *_ = simulate("vllm-v1", specs, LIMITS, replicas=2, enable_prefix_caching=True)
        requests.to_parquet(tmp_path / f"r{i}.parquet")
        steps.to_parquet(tmp_path / f"s{i}.parquet")
        paths.append((tmp_path / f"r{i}.parquet", tmp_path / f"s{i}.parquet"))
    for a, b in zip(*paths):
        assert a.read_bytes() == b.read_bytes()


TRTLLM_CASES = {
    # name: (specs, limits, knobs)
    "no-evict-reservation-holds-the-queue": (lambda: workload(21, n=120, rate=80.0, max_prompt=300, max_out=200,
                                                              extra_max_tokens=200), TIGHT, {}),
    "no-evict-shared-prefixes": (lambda: workload(22, groups=3, prefix_len=160, max_prompt=400, max_out=150),
                                 LIMITS, {"enable_chunked_prefill": True}),
    "max-utilization-pauses": (lambda: workload(23, max_prompt=300, max_out=250), TIGHT,
                               {"capacity_scheduler_policy": "MAX_UTILIZATION"}),
    "max-utilization-equal-progress": (lambda: workload(24, groups=2, prefix_len=120, max_prompt=300, max_out=200),
                                       TIGHT, {"capacity_scheduler_policy": "MAX_UTILIZATION",
                                               "enable_chunked_prefill": True,
                                               "context_chunking_policy": "EQUAL_PROGRESS"}),
    "static-batch": (lambda: workload(25, n=80, rate=60.0, max_out=150), LIMITS,
                     {"capacity_scheduler_policy": "STATIC_BATCH"}),
}


@pytest.mark.parametrize("case", sorted(TRTLLM_CASES))
def test_trtllm_fast_forward_is_exact(case):
    """trtllm's decode_stretch (every started request a decode, nothing able to join: the queue
    empty, the active list full, or under the no-evict policies the first waiting context short
    of blocks, a reservation arithmetic the decodes do not move) leaves every run as it was."""
    make_specs, limits, knobs = TRTLLM_CASES[case]
    knobs = {"tokens_per_block": limits.block_size, **knobs}
    specs = make_specs()
    on = simulate("trtllm", specs, limits, fast_forward=True, **knobs)
    off = simulate("trtllm", specs, limits, fast_forward=False, **knobs)
    assert on[3] > 0, "the workload never fast-forwarded: the comparison would prove nothing"
    assert_same_run(on, off)
    if case.startswith("max-utilization"):
        assert on[0]["preemptions"].sum() > 0  # pauses really happen
    if case == "no-evict-reservation-holds-the-queue":
        steps = on[1]
        assert ((steps["waiting"] > 0) & (steps["prefill_tokens"] == 0)).sum() > 10  # held by KV, decoding
