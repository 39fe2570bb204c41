"""SGLang's HiCache (policies.kv.hiradix): the radix tree with a host tier, load-back overlapped
layer by layer with the forward pass.

Closed form on constant step times (c = 0.25 s), a GPU pool of 640 tokens (page size 1), a host
pool of 2 × 640 (SGLang's default hicache_ratio) and a host link moving one token in exactly
1/1024 s (2**16 bytes at 2**26 B/s) over a model of L = 4 layers. One session, two turns: turn 0 =
system prompt 512 + message 40, answer 8: its KV in the tree is 552 + 7 = 559 tokens (the last
sampled token has none). At 3.0 s another request of 639 tokens takes the whole pool, evicting
turn 0 from the GPU. Turn 1 (at 4.0 s) = 512 + 40 + 8 + 40 = 600 tokens:

* no HiCache: turn 0's nodes were deleted; turn 1 computes all 600 tokens, TTFT = c;
* write_through (each node written to host when inserted): turn 0's 559 tokens are on the host;
  they are loaded back (h = 559/1024 s) while the 41 new tokens are computed, layer i waiting for
  its copy: TTFT = max(h + c/L, h/L + c) = h + c/4;
* write_through_selective (written on the second hit): the 552-token prompt node was hit twice
  (inserted after the prefill, walked again at the finish), the 7 answer tokens once, so only 552
  tokens are on the host: 48 computed, TTFT = 552/1024 + c/4;
* write_back (written when evicted, and the eviction waits for the copy): the flush request's
  step waits for turn 0's 559 tokens to be written (TTFT c + 559/1024); turn 1's load-back evicts
  the flush request's 639 tokens, written first: TTFT = 639/1024 + 559/1024 + c/4.
"""

from __future__ import annotations

import random

import pandas as pd
import pytest

from policies.base import EngineLimits
from policies.kv.hiradix import HiRadixCache, HostLink, host_pool_tokens, layerwise_overlap
from policies.registry import make_policy
from sim.engine import Simulation
from sim.latency.constant import ConstantLatency
from tests.helpers import FAKE_GPU, FAKE_MODEL, random_sessions
from tests.helpers import two_turn_session_specs as session_specs

STEP = 0.25
LINK = HostLink(
    rank_token_bytes=2**16, token_bytes=2**16, link_bps=float(2**26), layers=4
)  # 1/1024 s a token


def limits(gpu_tokens: int = 640) -> EngineLimits:
    return EngineLimits(
        block_size=16,
        num_gpu_blocks=gpu_tokens // 16,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        max_model_len=4096,
        kv_host_link=LINK,
    )


def simulate(specs, lim=None, fast_forward=True, check=False, **knobs):
    pol = make_policy("sglang", lim or limits(), **knobs)
    if check:  # conservation after every step
        finish = pol.finish_step

        def checked(plan, finished):
            finish(plan, finished)
            pol.check_invariants()

        pol.finish_step = checked
    sim = Simulation(
        specs, [(pol, ConstantLatency(STEP, FAKE_MODEL, FAKE_GPU, 1, 16))], 4096, fast_forward=fast_forward
    )
    rec = sim.run()
    return rec.requests_frame().set_index("id"), rec.steps_frame(), pol


def prefill_at(steps, at: float) -> int:
    s = steps[(steps["start_s"] >= at) & (steps["prefill_tokens"] > 0)]
    return int(s["prefill_tokens"].iloc[0])


H = 1 / 1024  # seconds per token over the host link


@pytest.mark.parametrize(
    "policy,loaded,flush_ttft,ttft",
    [
        (None, 0, STEP, STEP),
        ("write_through", 559, STEP, 559 * H + STEP / 4),
        ("write_through_selective", 552, STEP, 552 * H + STEP / 4),
        ("write_back", 559, STEP + 559 * H, 639 * H + 559 * H + STEP / 4),
    ],
)
def test_two_turns_with_the_gpu_flushed_between_them(policy, loaded, flush_ttft, ttft):
    knobs = {} if policy is None else {"enable_hierarchical_cache": True, "hicache_write_policy": policy}
    req, steps, pol = simulate(session_specs(), check=True, **knobs)
    assert (req["state"] == "finished").all()
    assert req.loc["t0", "finish_s"] == 8 * STEP
    assert prefill_at(steps, 3.0) == 639 and req.loc["flush", "ttft_s"] == flush_ttft
    assert prefill_at(steps, 4.0) == 600 - loaded  # only what neither tier holds is computed
    assert req.loc["t1", "ttft_s"] == ttft  # exact: sums of powers of two
    assert req.loc["t1", "tier_hit_tokens"] == loaded and req.loc["t1", "prefix_hit_tokens"] == loaded
    assert req.loc["t1", "kv_load_s"] == loaded * H
    if policy is not None:
        rep = pol.tier_store.report(16)["host"]
        assert rep["hit_tokens"] == loaded and rep["bytes_read"] == loaded * 2**16
    else:
        assert pol.tier_store is None


def test_the_layerwise_overlap_is_the_slower_of_the_two_pipelines():
    # load-bound: every layer waits for its copy, the last layer's compute follows the last copy
    assert layerwise_overlap(0.4, 1.0, 4) == 1.0 + 0.1
    # compute-bound: only the first layer's copy is exposed
    assert layerwise_overlap(1.0, 0.4, 4) == 0.1 + 1.0
    assert layerwise_overlap(0.3, 0.0, 32) == 0.3
    # the load is never hidden entirely nor paid twice
    for c, h in ((0.2, 0.3), (0.3, 0.2), (1.0, 1.0)):
        assert max(c, h) < layerwise_overlap(c, h, 8) < c + h


def test_the_host_pool_is_sized_as_sglang_sizes_it():
    assert host_pool_tokens(1000, 1, 2.0, 0, 2**17) == 2000  # hicache_ratio × the GPU pool
    assert host_pool_tokens(1000, 64, 2.5, 0, 2**17) == 2496  # page aligned
    assert host_pool_tokens(1000, 1, 2.0, 1.0, 2**17) == int(1e9 // 2**17)  # hicache_size GB per rank wins
    with pytest.raises(ValueError, match="hicache_ratio 1 gives 1,000 tokens, not more than the GPU pool"):
        host_pool_tokens(1000, 1, 1.0, 0, 2**17)


@pytest.mark.parametrize("seed", range(8))
def test_every_node_is_in_a_tier_and_every_token_counted_with_random_sessions(seed):
    """Random sessions on a small GPU pool and a host pool barely larger: after every step every
    tree node is on the GPU, on the host or both (never neither), the GPU nodes are closed under
    parents, the GPU pool's tokens are the GPU nodes' plus the requests' private ones plus the free
    ones, and the host pool's are the host copies' (within capacity)."""
    rng = random.Random(seed)
    gpu = rng.choice([896, 960, 1024])  # the longest session (800 + 40 tokens) fits
    knobs = {
        "enable_hierarchical_cache": True,
        "hicache_write_policy": rng.choice(["write_through", "write_through_selective", "write_back"]),
        "hicache_ratio": rng.choice([1.1, 1.5, 3.0]),
        "page_size": rng.choice([1, 16]),
    }
    req, steps, pol = simulate(random_sessions(rng), lim=limits(gpu), check=True, **knobs)
    assert (req["state"] == "finished").all()
    cache: HiRadixCache = pol.cache
    cache.check_invariants()
    assert cache.loaded_tokens == int(req["tier_hit_tokens"].sum())
    assert cache.written_tokens - cache.host_evicted_tokens == cache.host_size


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("seed", range(3))
def test_the_fast_forward_stays_exact_with_hicache_on(policy, seed):
    rng = random.Random(200 + seed)
    specs = random_sessions(rng)
    knobs = {"enable_hierarchical_cache": True, "hicache_write_policy": policy, "hicache_ratio": 1.5}
    a = simulate(specs, lim=limits(640), fast_forward=True, **knobs)
    b = simulate(specs, lim=limits(640), fast_forward=False, **knobs)
    pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)
    pd.testing.assert_frame_equal(
        a[0].drop(columns="token_times_s"), b[0].drop(columns="token_times_s"), check_exact=True
    )
    assert a[0]["tier_hit_tokens"].sum() > 0  # the host tier was used


def test_bad_hicache_knobs_are_errors_naming_the_knob():
    with pytest.raises(ValueError, match="hicache_write_policy must be one of"):
        make_policy("sglang", limits(), enable_hierarchical_cache=True, hicache_write_policy="write_around")
    with pytest.raises(ValueError, match="needs the radix cache"):
        make_policy("sglang", limits(), enable_hierarchical_cache=True, disable_radix_cache=True)


# --- random workloads through the shared policy invariants (tests/policy_invariants.py) --------------
def _hicache_draw(data):
    import dataclasses

    from hypothesis import reject
    from hypothesis import strategies as st

    from tests.test_property_policies import knobs_st, limits_st, workload_st

    limits = dataclasses.replace(data.draw(limits_st(), label="limits"), kv_host_link=LINK)
    knobs = {
        **data.draw(knobs_st("sglang"), label="knobs"),
        "disable_radix_cache": False,
        "enable_hierarchical_cache": True,
        "hicache_write_policy": data.draw(
            st.sampled_from(["write_through", "write_through_selective", "write_back"]), label="write policy"
        ),
        "hicache_ratio": data.draw(st.sampled_from([1.5, 2.0, 4.0]), label="ratio"),
    }
    try:
        make_policy("sglang", limits, **knobs)
    except ValueError:  # a pool too small for SGLang to allow a larger host pool
        reject()
    return limits, knobs, data.draw(workload_st(), label="requests")


def test_property_hicache_keeps_the_policy_invariants_on_random_workloads():
    from hypothesis import given
    from hypothesis import strategies as st

    from tests.fuzz_profiles import examples
    from tests.test_property_policies import _check_policy

    @examples(ci=120)
    @given(data=st.data())
    def run(data):
        _check_policy("sglang", *_hicache_draw(data))

    run()


def test_property_hicache_engine_runs_are_exact_under_the_fast_forward():
    from hypothesis import given
    from hypothesis import strategies as st

    from tests.fuzz_profiles import examples
    from tests.test_property_policies import _simulate_checked

    @examples(ci=30)
    @given(data=st.data())
    def run(data):
        _simulate_checked("sglang", *_hicache_draw(data))

    run()
