"""A request's own KV blocks are registered by count and hit only by its own recompute, and that
decides exactly what full hashing decides.

``sim.workload.sharing`` tells each request from which token its content is its own (no other
request of the workload holds those run keys); ``policies.kv.paged`` then skips hashing and
indexing those blocks. The reference is the same engine with that knowledge withheld
(``shareable_tokens`` None for every request: every block hashed and registered, as vLLM does):
both runs must give identical step and request frames, in workloads where preempted requests hit
their own blocks again, shared prefixes hit each other, and evictions reorder the free queue.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import sim.disaggregation.topology as topology
import sim.engine as engine
from policies.base import EngineLimits
from policies.kv.paged import PagedKVManager
from sim.workload.request_spec import RequestSpec
from sim.workload.sharing import shareable_tokens
from tests.test_fast_forward import TIGHT, assert_same_run, simulate, workload

CASES = {
    # name: (specs, limits)
    "own-only-preemptions": (lambda: workload(4, max_prompt=300, max_out=250), TIGHT),
    "shared-prefix-preemptions": (lambda: workload(3, groups=2, prefix_len=120, max_prompt=300, max_out=200),
                                  TIGHT),
    "whole-prompt-shared": (lambda: workload(21, groups=3, prefix_len=400, max_prompt=300, max_out=200), TIGHT),
    "block-size-1": (lambda: workload(12, n=60, max_prompt=40, max_out=60, groups=2, prefix_len=10),
                     EngineLimits(block_size=1, num_gpu_blocks=900, max_num_seqs=16,
                                  max_num_batched_tokens=256, max_model_len=512)),
    "watermark": (lambda: workload(11, max_prompt=300, max_out=250, groups=2, prefix_len=100), TIGHT),
}


class OwnHits:
    """Counts the prefix-cache hits that reach into a request's own blocks."""

    def __init__(self, monkeypatch):
        self.own = 0
        original = PagedKVManager.get_computed_blocks

        def spy(kv, req):
            hits, n = original(kv, req)
            st = kv.request_states().get(req)
            if st is not None and len(hits) > st.shared:
                self.own += len(hits) - st.shared
            return hits, n

        monkeypatch.setattr(PagedKVManager, "get_computed_blocks", spy)


def withheld(specs):
    return [None] * len(specs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_own_blocks_decide_what_full_hashing_decides(case, monkeypatch):
    make_specs, limits = CASES[case]
    specs = make_specs()
    knobs = {"enable_prefix_caching": True, **({"watermark": 0.05} if case == "watermark" else {})}
    spy = OwnHits(monkeypatch)
    fast = simulate("vllm-v1", specs, limits, **knobs)
    with monkeypatch.context() as m:
        m.setattr(engine, "shareable_tokens", withheld)
        full = simulate("vllm-v1", specs, limits, **knobs)
    assert_same_run(fast, full)
    if case != "block-size-1":
        assert fast[0]["preemptions"].sum() > 0, "no preemption: own blocks were never looked up again"
    if case in ("own-only-preemptions", "shared-prefix-preemptions"):
        assert spy.own > 0, "no recompute hit its own blocks: the comparison proves less than it claims"


def test_disaggregated_pools_decide_the_same(monkeypatch):
    from tests.test_disaggregation import simulate, tiny

    rng = np.random.default_rng(5)
    requests = [{"arrival_s": float(t), "prompt_tokens": int(p), "output_tokens": int(o)}
                for t, p, o in zip(np.cumsum(rng.exponential(0.1, 80)), rng.integers(40, 700, 80),
                                   rng.integers(50, 300, 80))]
    scn = tiny(requests, prefill={"replicas": 2}, decode={"replicas": 2, "engine": {"num_gpu_blocks": 60}},
               transfer={"bandwidth_gbps": 0.05, "latency_s": 0.01})
    scn["latency"] = {"backend": "roofline"}
    fast = simulate(scn)
    monkeypatch.setattr(topology, "shareable_tokens", withheld)
    full = simulate(scn)
    assert fast[0]["preemptions"].sum() > 0, "no decode-side preemption: nothing was recomputed"
    pd.testing.assert_frame_equal(fast[1], full[1], check_exact=True)
    a, b = fast[0].drop(columns="token_times_s"), full[0].drop(columns="token_times_s")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert all(np.array_equal(x, y) for x, y in zip(fast[0]["token_times_s"], full[0]["token_times_s"]))


def test_shareable_tokens_start_at_the_first_run_nobody_else_holds():
    def spec(i, runs, prompt, out_key=None):
        return RequestSpec(f"r{i}", 0.0, prompt, 5, 5, 0, runs, out_key)

    specs = [
        spec(0, ((("g", 1), 100), (("own", 0), 50)), 150),  # shared system prompt, then its own
        spec(1, ((("g", 1), 100), (("own", 1), 30)), 130),
        spec(2, ((("g", 1), 100),), 100),  # the whole prompt shared: its output is its own
        spec(3, None, 70),  # the default run key ("req", id): its own from token 0
        spec(4, ((("g", 2), 40),), 40, out_key="dup"),  # nothing of its own: prompt and output shared
        spec(5, ((("g", 2), 40),), 40, out_key="dup"),
        spec(6, ((("g", 1), 100), (("g", 1), 20), (("x", 6), 9)), 129),  # a key repeated in one request
    ]
    assert shareable_tokens(specs) == [100, 100, 100, 0, None, None, 120]


@pytest.mark.parametrize("name", ["sglang", "tgi"])
def test_radix_heap_compaction_changes_no_eviction(name, monkeypatch):
    """SGLang's and TGI's radix caches push a heap entry on every touch and pop only on eviction;
    compacting the heap (dropping what eviction would skip) keeps it bounded and must not change
    a single decision: compacting after every few pushes equals never compacting."""
    import policies.kv.radix as radix

    specs = workload(3, n=150, groups=3, prefix_len=120, max_prompt=300, max_out=200)
    monkeypatch.setattr(radix, "_MIN_COMPACT", 10**9)
    never = simulate(name, specs, TIGHT)
    compactions = []
    original = radix.RadixCache._compact

    def counted(cache):
        compactions.append(len(cache._heap))
        original(cache)
        assert len(cache._heap) <= len(cache.nodes())  # at most one live entry per node

    monkeypatch.setattr(radix, "_MIN_COMPACT", 8)
    monkeypatch.setattr(radix.RadixCache, "_compact", counted)
    often = simulate(name, specs, TIGHT)
    assert compactions, "the heap never grew past the bound: nothing was compacted"
    assert_same_run(never, often)


@pytest.mark.parametrize("knobs", [
    {"capacity_scheduler_policy": "MAX_UTILIZATION", "enable_chunked_prefill": True, "tokens_per_block": 16},
    {"tokens_per_block": 16},
], ids=["max-utilization", "no-evict"])
def test_trtllm_block_reuse_decides_the_same(knobs, monkeypatch):
    """TensorRT-LLM's beneficialToSkip reads the block registry for the first uncached block; a
    request's own blocks are never in it, and that only ever changes a hash nobody else holds."""
    specs = workload(3, groups=2, prefix_len=120, max_prompt=300, max_out=200)
    fast = simulate("trtllm", specs, TIGHT, **knobs)
    monkeypatch.setattr(engine, "shareable_tokens", withheld)
    full = simulate("trtllm", specs, TIGHT, **knobs)
    assert_same_run(fast, full)


def assert_scenario_decides_the_same(data: dict, monkeypatch) -> None:
    """Run a whole scenario (sim.run) with each request's own blocks known, then with that knowledge
    withheld (every block hashed, as vLLM does), and require the same steps, requests and summaries
    to the bit."""
    import sim

    fast = sim.run(data)
    monkeypatch.setattr(engine, "shareable_tokens", withheld)
    full = sim.run(data)
    pd.testing.assert_frame_equal(fast.steps, full.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.requests.drop(columns="token_times_s"),
                                  full.requests.drop(columns="token_times_s"), check_exact=True)
    assert fast.summaries == full.summaries


def test_speculative_decoding_decides_the_same(monkeypatch):
    """Drafts take KV slots past the request's tokens and rejected ones step num_computed_tokens
    back; registration counts only verified tokens either way."""
    from tests.test_speculative import _scenario

    data = _scenario({"method": "eagle3", "num_speculative_tokens": 3, "acceptance": {"rate": 0.6}})
    data["workload"] = {**data["workload"], "num_requests": 40}
    data["engine"] = {**data.get("engine", {}), "num_gpu_blocks": 64}
    assert_scenario_decides_the_same(data, monkeypatch)


@pytest.mark.parametrize("policy", ["vllm-v1", "sglang"])
def test_multi_turn_sessions_decide_the_same(policy, monkeypatch):
    """A session's next turn resends the previous turns' prompts and answers (their run keys):
    those are shared with the next turn, only the last turn's answer is its own."""
    from tests.test_sessions import scenario

    data = scenario(count=12, turns=4, think=0.5, new=60, answer=40, system=64, groups=2,
                    arrival={"process": "poisson", "rate": 4.0})
    data["engine"] = {**data["engine"], "num_gpu_blocks": 90}  # small: preemptions and evictions
    data["policies"] = [{"name": policy}]
    assert_scenario_decides_the_same(data, monkeypatch)
