"""The stepped path's shortcuts decide exactly what a full scan of the batch decides.

vllm-v1's bulk decode step finds the requests at a KV block edge from an *edge calendar* kept
across consecutive bulk steps (``VllmV1Policy._bulk_decodes``) instead of scanning every running
request; the reference is the same engine rebuilding the calendar from the whole running list at
every bulk step (``_keep_edges = False``: a full scan). Both must give identical step and request
frames, with and without the fast-forward, with shared prefixes (blocks hashed and registered at
their edge), preemptions, a block size of one and prefix caching off.
"""

from __future__ import annotations

import pytest

from policies.base import EngineLimits
from policies.vllm_v1 import VllmV1Policy
from tests.test_fast_forward import LIMITS, TIGHT, assert_same_run, simulate, workload

CASES = {
    # name: (specs, limits, knobs)
    "plain": (lambda: workload(1, n=200, rate=60.0), LIMITS, {}),
    "no-caching": (lambda: workload(2, n=200, rate=60.0), LIMITS, {"enable_prefix_caching": False}),
    "shared-prefixes": (lambda: workload(3, n=200, rate=60.0, groups=3, prefix_len=200), LIMITS, {}),
    "pressure": (lambda: workload(4, max_prompt=300, max_out=250, groups=2, prefix_len=100), TIGHT, {}),
    # arrivals every few steps: with the fast-forward on, bulk steps in a row (the calendar kept)
    # happen only while arrivals come faster than a stretch (each stretch crosses a block edge here)
    "block-size-1": (lambda: workload(5, n=200, rate=300.0, max_prompt=40, max_out=60, groups=2, prefix_len=10),
                     EngineLimits(block_size=1, num_gpu_blocks=900, max_num_seqs=16,
                                  max_num_batched_tokens=256, max_model_len=512), {}),
}


class CalendarUse:
    """Counts bulk steps that found their edges in a kept calendar (not rebuilt that step)."""

    def __init__(self, monkeypatch):
        self.kept = 0
        original = VllmV1Policy._bulk_decodes

        def spy(policy, budget):
            had = policy._edges is not None
            out = original(policy, budget)
            self.kept += had and out is not None
            return out

        monkeypatch.setattr(VllmV1Policy, "_bulk_decodes", spy)


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_edge_calendar_decides_what_a_full_scan_decides(case, fast_forward, monkeypatch):
    make_specs, limits, knobs = CASES[case]
    specs = make_specs()
    use = CalendarUse(monkeypatch)
    kept = simulate("vllm-v1", specs, limits, fast_forward=fast_forward, **knobs)
    assert use.kept > 50, "the calendar was rebuilt at almost every step: the comparison proves little"
    with monkeypatch.context() as m:
        m.setattr(VllmV1Policy, "_keep_edges", False)
        scanned = simulate("vllm-v1", specs, limits, fast_forward=fast_forward, **knobs)
    assert_same_run(kept, scanned)
    if case == "pressure":
        assert kept[0]["preemptions"].sum() > 0


@pytest.mark.parametrize("case", ["plain", "pressure", "shared-prefixes"])
def test_bulk_decode_emission_is_what_the_full_check_gives(case, monkeypatch):
    """``StepPlan.num_decodes`` lets the engine emit the bulk decodes' tokens without checking
    each one's prompt, first token and run; the reference checks every request."""
    import sim.engine as engine
    from sim.metrics import requests

    make_specs, limits, knobs = CASES[case]
    specs = make_specs()
    seen = []

    def counting(scheduled, records, step, now, on_token=None, decodes=0):
        seen.append(decodes)
        return requests.emit_step_tokens(scheduled, records, step, now, on_token, decodes)

    monkeypatch.setattr(engine, "emit_step_tokens", counting)
    short = simulate("vllm-v1", specs, limits, fast_forward=False, **knobs)
    assert sum(seen) > 1000, "hardly any bulk decodes: the comparison proves little"
    monkeypatch.setattr(engine, "emit_step_tokens",
                        lambda scheduled, records, step, now, on_token=None, decodes=0:
                        requests.emit_step_tokens(scheduled, records, step, now, on_token))
    checked = simulate("vllm-v1", specs, limits, fast_forward=False, **knobs)
    assert_same_run(short, checked)


def test_step_shape_of_a_plan_with_leading_decodes_equals_step_shape():
    """``fast_step_shape`` trusts ``num_decodes`` and classifies only the rest, one by one: the
    same shape, floats included, as ``step_shape`` visiting every request."""
    import random

    from policies.base import Request, StepPlan
    from sim.engine import fast_step_shape
    from sim.latency.base import step_shape

    rng = random.Random(8)
    for _ in range(500):
        plan = StepPlan()
        nd = rng.randint(1, 30)
        for i in range(nd):
            plan.add(Request(f"d{i}", 0.0, 10, 10), 1, rng.randint(1, 5000))
        for i in range(rng.choice([0, 0, 1, 3])):  # admissions after the bulk: chunks, 1-token prompts
            plan.add(Request(f"p{i}", 0.0, 10, 10), rng.choice([1, rng.randint(1, 4000)]), rng.choice([0, 0, 17]))
        plan.num_decodes = nd
        assert fast_step_shape(plan) == step_shape(plan)


@pytest.mark.parametrize("backend", ["native", "lmcache"])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_bulk_decodes_write_filled_blocks_through_to_the_cpu_tier(backend, fast_forward, monkeypatch):
    """With KV offloading every block a decode fills is written through to the CPU tier (its own
    content too: it takes room there), as the request-by-request pass's ``allocate_slots`` does;
    the bulk pass once skipped the own blocks' writes, so the tier's LRU (and later hits) differed
    from the reference and between fast-forward on and off."""
    import random

    import pandas as pd

    from sim.workload.request_spec import RequestSpec
    from tests.test_kv_tiers import limits as tier_limits
    from tests.test_kv_tiers import simulate as tier_simulate

    rng = random.Random(101)
    specs, t = [], 0.0
    for i in range(40):
        t += rng.expovariate(4.0)
        own = rng.randint(1, 200)
        out = rng.randint(20, 120)
        specs.append(RequestSpec(f"r{i:03d}", t, 300 + own, out, out,
                                 prompt_runs=((("group", rng.randrange(3)), 300), (("own", i), own))))
    lim = tier_limits(backend, gpu_blocks=90, cpu_blocks=200)
    bulk = tier_simulate(lim, specs, fast_forward=fast_forward)
    monkeypatch.setattr(VllmV1Policy, "_bulk_decodes", lambda policy, budget: None)
    reference = tier_simulate(lim, specs, fast_forward=False)  # request by request
    assert bulk[2].kv.tiers.written_blocks == reference[2].kv.tiers.written_blocks
    pd.testing.assert_frame_equal(bulk[1], reference[1], check_exact=True)
    pd.testing.assert_frame_equal(bulk[0].drop(columns="token_times_s"),
                                  reference[0].drop(columns="token_times_s"), check_exact=True)
