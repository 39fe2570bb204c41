"""KV tiers below the GPU (policies.kv.tiers, vllm-v1's KV offloading).

Closed form on constant step times (s = 0.25), 16-token blocks, a GPU pool of 40 blocks and a CPU
tier whose copy of one block takes exactly 1/64 s (2**20 bytes at 2**26 B/s). One session, two
turns: turn 0 = system prompt S = 512 + message 40, answer 8 (computed KV: 552 + 7 = 559 tokens,
34 full blocks, all written through to the CPU tier). At 3.0 s another request of 639 tokens takes
all 40 GPU blocks, evicting every block of turn 0. Turn 1 (at 4.0 s) = S + 40 + 8 + 40 = 600 tokens:

* no offloading: its history left the GPU, it recomputes all 600 tokens; TTFT = s;
* native (vLLM's OffloadingConnector): 34 blocks (544 tokens) load in 34/64 s between steps, the
  request computes 600 − 544 = 56 tokens in the next step: TTFT = 34/64 + s;
* lmcache: hits are whole 256-token chunks (512 tokens = 32 blocks), loaded on the step:
  600 − 512 = 88 tokens computed, TTFT = s + 32/64.
"""

from __future__ import annotations

import random

import pytest

from policies.base import EngineLimits
from policies.kv.tiers import OffloadConfig, TierSpec, TierStore
from policies.registry import make_policy
from sim.engine import Simulation
from sim.latency.constant import ConstantLatency
from sim.workload.request_spec import RequestSpec
from tests.helpers import FAKE_GPU, FAKE_MODEL, random_sessions
from tests.helpers import two_turn_session_specs as session_specs

STEP = 0.25
BLOCK_BYTES, BPS = 2**20, float(2**26)  # one block: 1/64 s


def limits(backend: str | None, gpu_blocks: int = 40, cpu_blocks: int = 1000, extra=()) -> EngineLimits:
    off = None
    if backend is not None:
        tiers = (TierSpec("cpu", cpu_blocks, BPS, BPS), *extra)
        off = OffloadConfig(backend, tiers, BLOCK_BYTES)
    return EngineLimits(
        block_size=16,
        num_gpu_blocks=gpu_blocks,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        max_model_len=4096,
        kv_offload=off,
    )


def simulate(lim: EngineLimits, specs, fast_forward=True, check=False):
    pol = make_policy("vllm-v1", lim)
    if check:  # conservation after every step
        finish = pol.finish_step

        def checked(plan, finished):
            finish(plan, finished)
            pol.kv.pool.check_invariants()
            if pol.kv.tiers is not None:
                pol.kv.tiers.check_invariants()

        pol.finish_step = checked
    sim = Simulation(
        specs,
        [(pol, ConstantLatency(STEP, FAKE_MODEL, FAKE_GPU, 1, 16))],
        lim.max_model_len,
        fast_forward=fast_forward,
    )
    rec = sim.run()
    return rec.requests_frame().set_index("id"), rec.steps_frame(), pol


def prefill_at(steps, at: float) -> int:
    """Prefill tokens of the first step starting at or after ``at`` that computes any."""
    s = steps[(steps["start_s"] >= at) & (steps["prefill_tokens"] > 0)]
    return int(s["prefill_tokens"].iloc[0])


@pytest.mark.parametrize(
    "backend,hit_blocks,ttft",
    [
        (None, 0, STEP),
        ("native", 34, 34 / 64 + STEP),  # loaded between steps, computed in the next one
        ("lmcache", 32, STEP + 32 / 64),  # whole 256-token chunks, loaded on the step
    ],
)
def test_two_turns_with_the_gpu_flushed_between_them(backend, hit_blocks, ttft):
    req, steps, pol = simulate(limits(backend), session_specs())
    assert (req["state"] == "finished").all()
    assert req.loc["t0", "finish_s"] == 8 * STEP and req.loc["flush", "finish_s"] == 3.0 + STEP
    assert prefill_at(steps, 3.0) == 639
    assert prefill_at(steps, 4.0) == 600 - 16 * hit_blocks  # only what no tier holds is computed
    assert req.loc["t1", "ttft_s"] == ttft  # exact: powers of two
    assert req.loc["t1", "tier_hit_tokens"] == 16 * hit_blocks
    assert req.loc["t1", "kv_load_s"] == hit_blocks / 64
    if backend is not None:
        rep = pol.kv.tiers.report(16)["cpu"]
        assert rep["hit_tokens"] == 16 * hit_blocks and rep["bytes_read"] == hit_blocks * BLOCK_BYTES
        # written through, each full block once: turn 0's 34, the flush request's 39 (639 tokens),
        # turn 1's 37 (603 computed tokens) less the 34 a tier already holds
        assert rep["bytes_written"] == (34 + 39 + 37 - 34) * BLOCK_BYTES
        pol.kv.tiers.check_invariants()


def test_a_full_cpu_tier_demotes_to_the_next_and_drops_from_the_last():
    disk = TierSpec("disk", 3, 1e9, 1e9)
    store = TierStore([TierSpec("cpu", 2, 1e9, 1e9), disk], 100)
    for h in range(1, 7):
        store.store(h)
    # cpu holds the two newest, disk the three before them, the oldest fell off
    assert [store.tier_of(h) for h in range(1, 7)] == [None, 1, 1, 1, 0, 0]
    assert store.dropped_blocks == 1 and store.written_blocks == [6, 4]
    assert store.lookup([5, 6, 2, 1, 3]) == [0, 0, 1]  # up to the first miss
    assert store.load([5, 6, 2], [0, 0, 1]) == pytest.approx(3 * 100 / 1e9)
    store.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_every_block_is_in_exactly_one_tier_or_free_with_random_sessions(seed):
    """Random multi-turn sessions on a small GPU pool with CPU and disk tiers: after every step the
    GPU pool's queue, counts and registry agree (each block held or free, exactly once) and each
    lower tier's blocks are each in exactly one tier, within capacity, none lost unaccounted."""
    rng = random.Random(seed)
    specs = random_sessions(rng)
    backend = rng.choice(["native", "lmcache"])
    lim = limits(
        backend,
        gpu_blocks=rng.randint(40, 80),
        cpu_blocks=rng.randint(5, 60),
        extra=(TierSpec("disk", rng.randint(5, 60), 1e9, 1e9),),
    )
    req, steps, pol = simulate(lim, specs, check=True)
    assert (req["state"] == "finished").all()
    tiers = pol.kv.tiers
    tiers.check_invariants()
    assert sum(tiers.hit_blocks) * 16 == int(req["tier_hit_tokens"].sum())


@pytest.mark.parametrize("backend", ["native", "lmcache"])
@pytest.mark.parametrize("seed", range(3))
def test_the_fast_forward_stays_exact_with_tiers_on(backend, seed):
    rng = random.Random(100 + seed)
    specs, t = [], 0.0
    for i in range(40):
        t += rng.expovariate(4.0)
        shared = (("group", rng.randrange(3)), 300)
        own = ((("own", i), rng.randint(1, 200)),)
        out = rng.randint(20, 120)
        specs.append(RequestSpec(f"r{i:03d}", t, 300 + own[0][1], out, out, prompt_runs=(shared, *own)))
    # 300 CPU blocks: every seed still hits the tier with each filled block written through
    lim = limits(backend, gpu_blocks=90, cpu_blocks=300)
    a = simulate(lim, specs, fast_forward=True)
    b = simulate(lim, specs, fast_forward=False)
    import pandas as pd

    pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)
    pd.testing.assert_frame_equal(
        a[0].drop(columns="token_times_s"), b[0].drop(columns="token_times_s"), check_exact=True
    )
    assert a[0]["tier_hit_tokens"].sum() > 0  # the tiers were used


def pd_scenario(router="prefix-affinity", **engine) -> dict:
    """One session of two turns (S = 64, n0 = n1 = 50, o0 = 30) on 1P1D or colocated."""
    scn = {
        "name": "pd-sessions",
        "model": "tiny",
        "hardware": {"gpu": "cpu"},
        "latency": {"backend": "constant", "step_s": STEP},
        "engine": {
            "num_gpu_blocks": 4096,
            "max_num_seqs": 64,
            "max_num_batched_tokens": 4096,
            "max_model_len": 4096,
            "block_size": 16,
            **engine,
        },
        "workload": {
            "arrival": {"process": "poisson", "rate": 0.01},
            "sessions": {
                "count": 1,
                "turns": {"dist": "fixed", "value": 2},
                "think_time_s": 2.0,
                "new_tokens": {"dist": "fixed", "value": 50},
                "output_tokens": {"dist": "fixed", "value": 30},
                "system_prompt": {"num_groups": 1, "tokens": 64},
            },
        },
        "policies": [{"name": "vllm-v1"}],
        "disaggregation": {
            "prefill": {"replicas": 1, "policy": {"name": "vllm-v1"}},
            "decode": {"replicas": 1, "policy": {"name": "vllm-v1"}},
            "transfer": {"link": "per-decode", "bandwidth_gbps": 50, "latency_s": 0.001},
            "router": router,
        },
    }
    return scn


def test_the_prefill_pool_prefix_cache_holds_prompts_not_answers():
    """Turn 1's prompt (64 + 50 + 30 + 50 = 194 tokens) shares 144 tokens with turn 0. Colocated,
    turn 0 computed its prompt and 29 answer tokens (143: 8 full blocks hit, 128 tokens). In P/D
    the prefill pool computed turn 0's prompt only (114 tokens: 7 blocks, 112), the answer was
    generated on the decode pool, so turn 1's prefill hits 112 tokens there."""
    from sim.runner import run

    res = run(pd_scenario())
    req = res.requests
    hits = {
        lb: req[(req["policy"] == lb) & (req["turn"] == 1)]["prefix_hit_tokens"].item() for lb in res.labels
    }
    assert hits == {"vllm-v1": 128, "1P1D": 112}
    assert (
        res.summaries["1P1D"]["kv_tiers"] is None
        and res.summaries["1P1D"]["sessions"]["returning_turns"]["count"] == 1
    )


def test_the_prefill_pool_offloads_and_the_decode_pool_does_not():
    from sim.runner import run
    from sim.scenario.resolved import resolve
    from sim.scenario.schema import load_scenario

    scn = pd_scenario(kv_offloading_size=1.0)
    per_block = resolve(load_scenario(scn)).limits.kv_offload.block_bytes
    res = run(scn)
    tiers = res.summaries["1P1D"]["kv_tiers"]["tiers"]["cpu"]
    # written through by the prefill pool only: turn 0's 7 full prompt blocks, then turn 1's 12
    # full blocks (192 of its 194 tokens) less the 7 already stored
    assert tiers["bytes_written"] == 12 * per_block and tiers["blocks_held"] == 12
    assert tiers["hit_tokens"] == 0  # the GPU cache still held the history: nothing to load
    colocated = res.summaries["vllm-v1"]["kv_tiers"]["tiers"]["cpu"]
    # colocated, answers are computed where prompts are: turn 0's 143 tokens (8 blocks), then turn 1's
    # 194 + 29 = 223 (13 blocks, 8 already stored)
    assert colocated["blocks_held"] == 13


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"kv_tiers": [{"name": "disk", "capacity_gib": 10, "read_gbps": 6, "write_gbps": 3}]},
            "engine.kv_tiers: needs engine.kv_offloading_size",
        ),
        ({"kv_offloading_size": 1e-9}, "engine.kv_offloading_size: 1e-09 GiB holds no KV block"),
        (
            {"kv_offloading_size": 1.0, "kv_offloading_backend": "hicache"},
            "engine.kv_offloading_backend: expected one of",
        ),
    ],
)
def test_bad_tier_keys_are_one_line_errors(change, message):
    from sim.errors import CbsimError
    from sim.runner import run

    scn = pd_scenario(**change)
    scn.pop("disaggregation")
    with pytest.raises(CbsimError, match=message.replace("(", r"\(")):
        run(scn)


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"name": "sglang"}, "KV offloading is modelled for vllm-v1 only"),
        ({"name": "vllm-v1", "enable_prefix_caching": False}, "needs enable_prefix_caching on"),
    ],
)
def test_offloading_refuses_policies_it_cannot_serve(entry, message):
    from sim.errors import CbsimError
    from sim.runner import run

    scn = pd_scenario(kv_offloading_size=1.0)
    scn.pop("disaggregation")
    scn["policies"] = [entry]
    with pytest.raises(CbsimError, match=message):
        run(scn)
    scn["policies"] = [{**entry, "kv_offload": False}] if entry["name"] == "vllm-v1" else scn["policies"]
    if entry["name"] == "vllm-v1":  # the entry that opts out runs
        assert run(scn).summaries["vllm-v1"]["kv_tiers"] is None


class _NoEmptyForwardPass(ConstantLatency):
    """A clock that refuses to price a forward pass of no sequences (a table's ``engine_cpu``
    grid starts at one sequence: pricing zero would extrapolate and warn)."""

    def price(self, shape, plan=None):
        assert shape.num_seqs > 0, "a step of tier copies only has no forward pass to price"
        return super().price(shape, plan)


def test_a_step_of_tier_copies_only_is_the_copy_and_prices_no_forward_pass():
    lim = limits("native")
    pol = make_policy("vllm-v1", lim)
    sim = Simulation(session_specs(), [(pol, _NoEmptyForwardPass(STEP, FAKE_MODEL, FAKE_GPU, 1, 16))],
                     lim.max_model_len)
    steps = sim.run().steps_frame()
    copy = steps[steps["num_seqs"] == 0]
    assert len(copy) == 1 and copy["start_s"].iloc[0] == 4.0
    assert copy["duration_s"].iloc[0] == 34 / 64  # exact: the 34 blocks' copy, nothing more
    assert copy["flops"].iloc[0] == 0 and copy["bytes"].iloc[0] == 0
