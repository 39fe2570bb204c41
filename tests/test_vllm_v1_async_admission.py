"""vllm-v1's ``async_admission`` knob: vLLM's async scheduling admits a request one step late.

With async scheduling, ``EngineCore.step_with_batch_queue`` schedules batch n + 1 as batch n starts
and adds new requests only after batch n's output is processed, so a request arriving while batch n
runs first runs in batch n + 2; an idle engine schedules it at once (policies/vllm_v1.py, module
doc). Checked here on the policy driven by hand, in closed form on a constant-step simulation, and
for the fast-forward, which must leave every run with the knob on exactly as stepped.
"""

from __future__ import annotations

import pytest

from policies.base import EngineLimits, Request, emit_tokens
from policies.registry import make_policy
from sim.workload.request_spec import RequestSpec
from tests.helpers import first_step_of
from tests.helpers import simulate as simulate_constant
from tests.test_fast_forward import CASES, CLOSED_CASES, assert_same_run
from tests.test_fast_forward import simulate as simulate_ff

LIMITS = EngineLimits(block_size=4, num_gpu_blocks=200, max_num_seqs=8, max_num_batched_tokens=256,
                      max_model_len=512)




@pytest.mark.parametrize("on", [False, True])
@pytest.mark.parametrize("when", ["in_flight", "between"])
def test_a_request_arriving_during_a_step_enters_the_step_after_next(on, when):
    """A decodes for 20 steps; B arrives during step 2, or after it ended. Synchronous vLLM puts B in
    step 3; with async scheduling step 3 was scheduled when step 2 started, B enters step 4."""
    policy = make_policy("vllm-v1", LIMITS, async_admission=on)
    policy.add_request(Request("a", 0.0, 8, 20, seq=0))
    waiting = []

    def arrive(k, in_flight):
        if k == 2 and in_flight == (when == "in_flight"):
            policy.add_request(Request("b", 0.0, 8, 4, seq=1))
            waiting.append(policy.num_waiting)

    assert first_step_of(policy, "b", arrive, 10) == (4 if on else 3)
    assert waiting == [1]  # counted as waiting from its arrival on, fetched or not


@pytest.mark.parametrize("on", [False, True])
def test_an_idle_engine_takes_a_request_at_once(on):
    """A lone request enters the first step; one arriving in (or after) the step in which the only
    running request finishes enters the next step: the step scheduled behind it was empty."""
    policy = make_policy("vllm-v1", LIMITS, async_admission=on)
    policy.add_request(Request("a", 0.0, 8, 2, seq=0))
    plan = policy.schedule()
    assert [r.id for r in plan.scheduled] == ["a"]

    policy = make_policy("vllm-v1", LIMITS, async_admission=on)
    policy.add_request(Request("a", 0.0, 8, 2, seq=0))

    def arrive(k, in_flight):
        if k == 2 and in_flight:  # a emits its second and last token in step 2
            policy.add_request(Request("b", 0.0, 8, 1, seq=1))

    assert first_step_of(policy, "b", arrive, 10) == 3


def test_requests_held_for_a_step_keep_their_order_and_are_drained():
    """Several arrivals during one step join the waiting queue together, in arrival order, behind
    the requests already waiting; drain() hands back the held ones too."""
    limits = EngineLimits(block_size=4, num_gpu_blocks=200, max_num_seqs=1, max_num_batched_tokens=256,
                          max_model_len=512)
    policy = make_policy("vllm-v1", limits, async_admission=True)
    policy.add_request(Request("a", 0.0, 8, 30, seq=0))
    policy.add_request(Request("w", 0.0, 8, 30, seq=1))  # waits: max_num_seqs 1
    plan = policy.schedule()  # step 1: a's prompt
    policy.add_request(Request("b", 0.0, 8, 3, seq=2))
    policy.add_request(Request("c", 0.0, 8, 3, seq=3))
    assert policy.num_waiting == 3 and [r.id for r in policy.waiting_requests()] == ["w"]
    emit_tokens(plan)
    policy.finish_step(plan, [])
    plan = policy.schedule()  # step 2: b and c not yet fetched
    assert [r.id for r in plan.scheduled] == ["a"]
    assert [r.id for r in policy.waiting_requests()] == ["w"]
    emit_tokens(plan)
    policy.finish_step(plan, [])
    policy.schedule()  # step 3: fetched, behind w
    assert [r.id for r in policy.waiting_requests()] == ["w", "b", "c"]
    policy.add_request(Request("d", 0.0, 8, 3, seq=4))
    assert sorted(r.id for r in policy.drain()) == ["a", "b", "c", "d", "w"]
    assert policy.num_waiting == 0 and not policy.has_work()


def test_the_knob_is_listed_and_off_by_default():
    from policies.vllm_v1 import VllmV1Policy

    knob = VllmV1Policy.KNOBS["async_admission"]
    assert knob.default is False and knob.type is bool and "async" in knob.help
    assert make_policy("vllm-v1", LIMITS).knobs["async_admission"] is False


# --- closed form on a simulation: a constant 0.25 s step ------------------------------------------
SPECS = [
    RequestSpec("a", 0.0, 8, 20, 20),  # steps 1-20, [0, 5.0] s: its last token at 5.0 s
    RequestSpec("b", 0.6, 8, 2, 2),  # arrives during step 3 [0.5, 0.75]
    RequestSpec("d", 4.9, 8, 2, 2),  # arrives during a's last step [4.75, 5.0]
    RequestSpec("c", 100.0, 8, 2, 2),  # arrives to an idle engine
]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_closed_form_ttft_with_and_without_async_admission(fast_forward, monkeypatch):
    if not fast_forward:
        monkeypatch.setenv("CBSIM_NO_FAST_FORWARD", "1")
    ttft = {}
    for on in (False, True):
        requests, steps, _, _ = simulate_constant("vllm-v1", SPECS, LIMITS, step_s=0.25, async_admission=on)
        assert (requests["state"] == "finished").all()
        ttft[on] = dict(zip(requests["id"], requests["ttft_s"]))
    # off: b enters step 4 [0.75, 1.0]; on: step 4 was scheduled without it, b enters step 5
    assert ttft[False]["b"] == pytest.approx(1.0 - 0.6)
    assert ttft[True]["b"] == pytest.approx(1.25 - 0.6)
    # d arrives during a's last step: the step scheduled behind it is empty, d enters the next one
    assert ttft[False]["d"] == ttft[True]["d"] == pytest.approx(5.25 - 4.9)
    # an idle engine: at once
    assert ttft[False]["a"] == ttft[True]["a"] == 0.25
    assert ttft[False]["c"] == ttft[True]["c"] == 0.25


# --- fast-forward stays exact with the knob on ----------------------------------------------------
# every fast-forward case of tests/test_fast_forward.py (open and closed loops)
FF_CASES = {**CASES, **CLOSED_CASES}


@pytest.mark.parametrize("case", sorted(FF_CASES))
def test_fast_forward_is_exact_with_async_admission(case):
    make_specs, limits, kw = FF_CASES[case]
    specs = make_specs()
    on = simulate_ff("vllm-v1", specs, limits, fast_forward=True, async_admission=True, **kw)
    off = simulate_ff("vllm-v1", specs, limits, fast_forward=False, async_admission=True, **kw)
    assert on[3] > 0, "the workload never fast-forwarded: the comparison would prove nothing"
    assert off[3] == 0
    assert_same_run(on, off)
    if case in ("plain", "closed"):  # the knob changes these runs: the comparison is not of the old runs
        sync = simulate_ff("vllm-v1", specs, limits, fast_forward=True, **kw)
        assert sync[0]["ttft_s"].mean() < on[0]["ttft_s"].mean()


@pytest.mark.parametrize("case", ["plain", "replicas-least-outstanding", "prefix-caching-pressure", "horizon"])
def test_the_step_after_an_arrival_is_taken_inside_a_stretch(case, monkeypatch):
    """With the knob the step after the one an arrival falls in is a pure decode of the same batch:
    a stretch that crosses the arrival takes it too, in the same timeout (the arrival counted in both
    rows' ``waiting``, fetched at the schedule after it), or the stretch offered while the request
    waits to be fetched is that one step; nothing is scheduled one by one for it. Both must happen
    in these workloads, and the runs stay exact (stepped: every step scheduled)."""
    import sim.engine
    from policies.vllm_v1 import VllmV1Policy
    from sim.metrics.steps import ReplicaSteps

    seen = {"late": 0, "late_waiting": 0, "one_step_for_a_fetch": 0}
    chain = sim.engine.Replica._chain_stretches
    set_waiting = ReplicaSteps.set_last_waiting
    decode_stretch = VllmV1Policy.decode_stretch

    def chained(self, batch, context):
        unfetched = bool(self.policy._unfetched)
        steps = self.stretch_steps
        out = chain(self, batch, context)
        seen["late"] += out is not None and out[1] == 2
        seen["one_step_for_a_fetch"] += unfetched and self.stretch_steps - steps == 1
        return out

    def waiting(steps, n, rows=1):
        seen["late_waiting"] += rows == 2
        return set_waiting(steps, n, rows)

    def offered(self):
        out = decode_stretch(self)
        # never while the next schedule fetches a request: it may be admitted there
        assert out is None or not self._unfetched or self._unfetched[0][0] > self._steps
        return out

    monkeypatch.setattr(sim.engine.Replica, "_chain_stretches", chained)
    monkeypatch.setattr(ReplicaSteps, "set_last_waiting", waiting)
    monkeypatch.setattr(VllmV1Policy, "decode_stretch", offered)
    make_specs, limits, kw = CASES[case]
    specs = make_specs()
    on = simulate_ff("vllm-v1", specs, limits, fast_forward=True, async_admission=True, **kw)
    assert seen["late"] > 0 and seen["late_waiting"] > 0 and seen["one_step_for_a_fetch"] > 0
    off = simulate_ff("vllm-v1", specs, limits, fast_forward=False, async_admission=True, **kw)
    assert_same_run(on, off)


def test_waiting_of_the_row_before_a_stretchs_last():
    """``set_last_waiting(n, 2)`` sets the last two rows of a stretch (the arrival in the step before
    its last): the column has n there and the stretch's count on its other rows."""
    from sim.metrics.steps import ReplicaSteps

    steps = ReplicaSteps(0)
    times = [0.0, 1.0, 2.0, 3.0, 4.0]
    steps.extend_decodes(times, [1.0] * 4, 3, 5, 3, [7] * 4, 0, [30] * 4, [20] * 4, [1] * 4, [2] * 4)
    steps.set_last_waiting(6, 2)
    steps.extend_decodes([4.0, 5.0, 6.0], [1.0] * 2, 3, 6, 3, [7] * 2, 0, [30] * 2, [20] * 2, [1] * 2, [2] * 2)
    steps.set_last_waiting(8)
    assert steps.column("waiting").tolist() == [5, 5, 6, 6, 6, 8]


@pytest.mark.parametrize("seed", range(12))
def test_fast_forward_is_exact_with_async_admission_on_random_setups(seed):
    """Random rates, arrival grids (ties with constant-latency step ends), latency models, KV sizes,
    horizons, replicas and routers, priorities: with the knob on the fast-forward equals stepping."""
    import random

    from tests.test_fast_forward import LIMITS as FF_LIMITS
    from tests.test_fast_forward import TIGHT, workload

    rng = random.Random(seed)
    grid = rng.choice([0.0, 0.0, 0.01, 0.05, 0.25])
    limits = rng.choice([FF_LIMITS, TIGHT, EngineLimits(block_size=4, num_gpu_blocks=300, max_num_seqs=6,
                                                        max_num_batched_tokens=256, max_model_len=1024)])
    kw = {"lat": rng.choice(["roofline", "constant", "fake-roofline"])}
    if rng.random() < 0.3:
        kw["horizon_s"] = rng.uniform(0.5, 5)
    if rng.random() < 0.3:
        kw["replicas"] = rng.choice([2, 3])
        if rng.random() < 0.5:
            kw["router"] = "least-outstanding"
    priority = rng.random() < 0.3
    if priority:
        kw["scheduling_policy"] = "priority"
    specs = workload(seed, n=rng.choice([60, 150]), rate=rng.choice([5.0, 20.0, 60.0, 200.0]),
                     max_prompt=rng.choice([50, 300, 600]), max_out=rng.choice([20, 120, 300]), arrival_grid=grid,
                     priorities=3 if priority else 0)
    on = simulate_ff("vllm-v1", specs, limits, fast_forward=True, async_admission=True, **kw)
    off = simulate_ff("vllm-v1", specs, limits, fast_forward=False, async_admission=True, **kw)
    assert_same_run(on, off)
