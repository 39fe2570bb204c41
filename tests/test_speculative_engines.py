"""Speculative decoding in SGLang's and TensorRT-LLM's schedulers (issue #32, the engines beside vLLM V1).

Closed forms on a constant clock (every step 1 s), for each engine: with every draft accepted
(rate 1) and k = 3 a request gains four tokens per step; with none accepted one token per step
while the step still computes the 1 + k verification tokens. Each engine's budget rule: SGLang
has no per-step token budget (a verify batch is every running request's 1 + k tokens) but its
decode memory check asks for ``num_draft_tokens + topk · num_steps`` slots per request;
TensorRT-LLM counts ``1 + k`` per generation request against ``max_num_tokens`` and the first
that overflows stops the pass, and it cuts the drafts to the request's max_tokens reservation.
Conservation: every token emitted once, rejected slots freed (SGLang) or overwritten (TRT-LLM),
no block leaked, on random workloads through the engine (vLLM V1 too). Methods an engine lacks are
refused. The drafter priced from a kernel-database table of its own shapes equals the sum of that
table's rows.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.base import EngineLimits, Request
from policies.registry import make_policy
from sim.engine import Simulation
from sim.errors import ScenarioError
from sim.latency.constant import ConstantLatency
from sim.metrics.requests import emit_caught_up
from sim.scenario.schema import load_scenario
from sim.speculative.acceptance import Acceptance
from sim.workload.request_spec import RequestSpec
from tests.fuzz_profiles import examples
from tests.helpers import FAKE_GPU, FAKE_MODEL, TINY_SCENARIO, records_for, wall_clock_limit
from tests.test_speculative import assert_four_tokens_per_step

LIMITS = EngineLimits(
    block_size=4, num_gpu_blocks=400, max_num_seqs=64, max_num_batched_tokens=512, max_model_len=2048
)
ENGINES = ["sglang", "trtllm"]


def knobs_for(name: str, limits: EngineLimits, **knobs) -> dict:
    if name == "trtllm":
        return {"tokens_per_block": limits.block_size, **knobs}
    return knobs


def make(name, limits=LIMITS, k=3, lookahead=None, **knobs):
    pol = make_policy(name, limits, **knobs_for(name, limits, **knobs))
    pol.enable_speculation(k, k if lookahead is None else lookahead)
    return pol


def run(name, specs, k=3, rate=1.0, limits=LIMITS, seed=0, check=None, **knobs):
    pol = make(name, limits, k, **knobs)
    if check is not None:
        finish = pol.finish_step

        def checked(plan, finished):
            finish(plan, finished)
            check(pol, plan)

        pol.finish_step = checked
    latency = ConstantLatency(1.0, FAKE_MODEL, FAKE_GPU, 1, limits.block_size)
    rec = Simulation(specs, [(pol, latency)], limits.max_model_len, acceptance=Acceptance((rate,) * k, seed)).run()
    return rec.requests_frame(), rec.steps_frame(), pol


def spec(i, prompt, out, arrival=0.0, max_tokens=None):
    return RequestSpec(f"R{i}", arrival, prompt, out, max_tokens or out)



# --- closed forms, each engine ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ENGINES)
def test_every_draft_accepted_gives_four_tokens_per_step(name):
    reqs, steps, _ = run(name, [spec(1, 4, 13), spec(2, 4, 13)], k=3, rate=1.0)
    assert_four_tokens_per_step(reqs, steps)


@pytest.mark.parametrize("name", ENGINES)
def test_no_draft_accepted_gives_one_token_per_step_and_the_verify_cost(name):
    reqs, steps, _ = run(name, [spec(1, 4, 10, max_tokens=40)], k=3, rate=0.0)
    assert list(reqs["token_times_s"][0]) == [float(t) for t in range(1, 11)]
    assert list(steps["batch_tokens"]) == [4] + [4] * 9  # each verify still computes 1 + 3 tokens
    assert list(steps["spec_proposed"]) == [0] + [3] * 9
    assert int(steps["spec_accepted"].sum()) == 0
    assert int(reqs["spec_steps"][0]) == 9 and int(reqs["spec_proposed"][0]) == 27


# --- SGLang: no token budget on a verify batch, the buffer multiplier in the memory check -------------
def test_sglang_verify_batch_is_every_running_request_uncut_by_the_token_budget():
    limits = EngineLimits(block_size=1, num_gpu_blocks=400, max_num_seqs=8, max_num_batched_tokens=6,
                          max_model_len=256)
    pol = make("sglang", limits, k=3)
    a, b = Request("A", 0.0, 2, 50), Request("B", 0.0, 2, 50)
    pol.add_request(a)
    pol.add_request(b)
    plan = pol.schedule()  # the prefill batch: no drafts
    assert plan.num_new_tokens == [2, 2] and plan.spec_tokens == [0, 0]
    records = records_for(a, b)
    emit_caught_up(plan.scheduled, records, 0, 1.0)
    pol.finish_step(plan, [])
    plan = pol.schedule()
    assert plan.num_new_tokens == [4, 4] and plan.spec_tokens == [3, 3]  # 8 > max_num_batched_tokens 6
    # k + 1 slots each up front; after the verify the rejected ones go back to the pool
    assert pol.kv_tokens_reserved_and_used() == (2 * 6, 2 * 6)
    pol.reject_drafts(plan, [3, 1])  # A accepted none, B two
    assert (a.num_computed_tokens, b.num_computed_tokens) == (3, 5)
    assert pol.slots_held(a) == 3 and pol.slots_held(b) == 5
    assert pol.cache.private == (3 - 2) + (5 - 2)  # the prompts sit in the radix tree, locked
    pol.check_invariants()


def test_sglang_decode_memory_check_asks_for_num_draft_tokens_plus_the_draft_steps():
    """Two running requests, k = 3: the check needs 2 × (4 + 3) = 14 free slots; with fewer it
    retracts one, though 2 × 4 = 8 verify slots would fit."""
    def after_prefill(pool_tokens):
        limits = EngineLimits(block_size=1, num_gpu_blocks=pool_tokens, max_num_seqs=8,
                              max_num_batched_tokens=512, max_model_len=64)
        pol = make("sglang", limits, k=3, disable_radix_cache=True, init_new_token_ratio=0.0)
        a, b = Request("A", 0.0, 10, 3), Request("B", 0.0, 10, 3)  # admitted: 10 + 3 + 1 < what is left
        for r in (a, b):
            pol.add_request(r)
        plan = pol.schedule()
        assert plan.num_new_tokens == [10, 10]
        emit_caught_up(plan.scheduled, records_for(a, b), 0, 1.0)
        pol.finish_step(plan, [])
        return pol, pol.schedule()

    pol, plan = after_prefill(20 + 14)  # 14 free after the prompts: both verify
    assert plan.spec_tokens == [3, 3] and not plan.preempted
    pol, plan = after_prefill(20 + 13)  # 13 free: one is retracted
    assert len(plan.preempted) == 1 and plan.spec_tokens == [3]
    assert pol.num_retractions == 1


def test_sglang_speculation_turns_mixed_chunk_off_and_sizes_the_buffer_by_drafter():
    pol = make("sglang", enable_mixed_chunk=True)
    assert pol.mixed is False
    assert pol.spec_buf == (3 + 1) + 1 * 3  # EAGLE chain: num_draft_tokens + topk · num_steps
    assert make("sglang", lookahead=0).spec_buf == (3 + 1) + 1  # NGRAM: steps and top-k unset (1)


# --- TensorRT-LLM: 1 + k per generation request against max_num_tokens, drafts within max_tokens ------
def test_trtllm_a_generation_request_that_overflows_max_num_tokens_stops_the_pass():
    limits = EngineLimits(block_size=4, num_gpu_blocks=100, max_num_seqs=8, max_num_batched_tokens=6,
                          max_model_len=256)
    pol = make("trtllm", limits, k=3)
    a, b = Request("A", 0.0, 2, 50), Request("B", 0.0, 2, 50)
    pol.add_request(a)
    pol.add_request(b)
    plan = pol.schedule()
    assert plan.num_new_tokens == [2, 2] and plan.spec_tokens == [0, 0]
    emit_caught_up(plan.scheduled, records_for(a, b), 0, 1.0)
    pol.finish_step(plan, [])
    plan = pol.schedule()
    # A: 1 + 3 = 4 tokens; B would make 8 > 6: the micro-batch pass stops (drafts are not cut)
    assert [r.id for r in plan.scheduled] == ["A"] and plan.num_new_tokens == [4] and plan.spec_tokens == [3]


def test_trtllm_drafts_stop_at_the_max_tokens_reservation():
    reqs, steps, pol = run("trtllm", [spec(1, 4, 6, max_tokens=6)], k=3, rate=1.0)
    # prefill (token 1); 1 + 3 (tokens 2-5); then only 1 + 1: max_new_tokens - generated = 1 draft
    assert list(steps["batch_tokens"]) == [4, 4, 2]
    assert list(steps["spec_proposed"]) == [0, 3, 1]
    assert list(reqs["token_times_s"][0]) == [1.0, 2.0, 2.0, 2.0, 2.0, 3.0]
    assert pol.kv_blocks_used() == 0


def test_trtllm_no_evict_never_overcommits_while_speculating():
    """GUARANTEED_NO_EVICT counts the blocks a generating request really holds (rewound slots
    included), so every admitted request's allocations fit: a tight pool finishes everything."""
    limits = EngineLimits(block_size=4, num_gpu_blocks=30, max_num_seqs=8, max_num_batched_tokens=64,
                          max_model_len=256)
    specs = [spec(i, 9 + 3 * i, 25 + 2 * i, arrival=0.3 * i) for i in range(10)]
    reqs, _, pol = run("trtllm", specs, k=4, rate=0.5, limits=limits, enable_block_reuse=False)
    assert (reqs["state"] == "finished").all() and int(reqs["preemptions"].sum()) == 0
    assert pol.kv_blocks_used() == 0


# --- methods ----------------------------------------------------------------------------------------
def _scenario(method, policy):
    section = {"method": method, "num_speculative_tokens": 2, "acceptance": {"rate": 0.5}}
    if method == "draft":
        section["draft_model"] = "llama-3-8b"
    return {**TINY_SCENARIO, "policies": [{"name": policy, "speculative": section}]}


@pytest.mark.parametrize("method", ["ngram", "eagle", "eagle3", "mtp", "draft"])
def test_sglang_has_every_method(method):
    assert load_scenario(_scenario(method, "sglang")).policies[0].speculative.method == method


@pytest.mark.parametrize("method", ["ngram", "eagle3", "mtp", "draft"])
def test_trtllm_has_its_pytorch_backend_methods(method):
    assert load_scenario(_scenario(method, "trtllm")).policies[0].speculative.method == method


def test_a_method_the_engine_lacks_is_a_one_line_error_naming_what_it_supports():
    with pytest.raises(ScenarioError) as info:
        load_scenario(_scenario("eagle", "trtllm"))
    text = str(info.value)
    assert "policy 'trtllm' has no 'eagle' drafter; it supports ngram, eagle3, mtp, draft" in text
    assert "\n" not in text
    with pytest.raises(ScenarioError, match="policy 'tgi' does not model speculative decoding"):
        load_scenario(_scenario("eagle3", "tgi"))


def test_sglang_resets_an_unset_running_cap_to_48_and_the_drafter_shares_the_pool():
    from sim.hardware.kv_capacity import block_bytes
    from sim.scenario.resolved import resolve
    from sim.speculative.setup import speculation_for

    for policy, share in (("sglang", 1.0), ("trtllm", 0.9)):
        scn = load_scenario({
            "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "policies": [{"name": policy, "speculative": {"method": "eagle3", "num_speculative_tokens": 3,
                                                          "acceptance": {"rate": 0.8}}}],
        })
        dep = resolve(scn)
        entry = scn.policies[0]
        base = dep.limits_for(entry.name, entry.knobs())
        sp = speculation_for(dep, entry)
        got = sp.limits(base, dep)
        target = block_bytes(dep.model, base.block_size, 1, base.max_model_len)
        head = block_bytes(sp.draft.spec, base.block_size, 1, base.max_model_len)
        assert head * 32 == pytest.approx(target)  # the head's one layer next to the target's 32
        expected = int((base.num_gpu_blocks * target - share * sp.draft.weight_bytes) // (target + head))
        assert got.num_gpu_blocks == expected
        assert got.max_num_seqs == (48 if policy == "sglang" else base.max_num_seqs)
    pinned = load_scenario({**_scenario("eagle3", "sglang"), "engine": {"max_num_seqs": 7}})
    dep = resolve(pinned)
    entry = pinned.policies[0]
    assert speculation_for(dep, entry).limits(dep.limits_for("sglang", {}), dep).max_num_seqs == 7


# --- conservation on random workloads, through the engine ---------------------------------------------
def _engine_knobs(name):
    if name == "vllm-v1":
        return st.fixed_dictionaries({
            "long_prefill_token_threshold": st.sampled_from([0, 7]),
            "enable_prefix_caching": st.booleans(),
            "enable_chunked_prefill": st.booleans(),
        })
    if name == "sglang":
        return st.fixed_dictionaries({
            "schedule_policy": st.sampled_from(["fcfs", "lpm", "lof"]),
            "chunked_prefill_size": st.sampled_from([None, -1, 7, 64]),
            "disable_radix_cache": st.booleans(),
            "page_size": st.sampled_from([1, 1, 2, 4]),
            "init_new_token_ratio": st.sampled_from([0.0, 0.7]),
            "enable_mixed_chunk": st.booleans(),
        })
    return st.fixed_dictionaries({
        "capacity_scheduler_policy": st.sampled_from(["GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH"]),
        "enable_chunked_prefill": st.booleans(),
        "context_chunking_policy": st.sampled_from(["FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"]),
        "enable_block_reuse": st.booleans(),
    })


def _per_step_check(name, limits):
    def check(pol, plan):
        assert plan.spec_tokens is not None and len(plan.spec_tokens) == len(plan.scheduled)
        for n, d in zip(plan.num_new_tokens, plan.spec_tokens):
            assert 0 <= d <= pol.num_speculative_tokens and (d == 0 or n == 1 + d)
        if name == "sglang":
            pol.check_invariants()
            assert len(plan.scheduled) <= pol.max_running
        elif name == "vllm-v1":
            assert plan.total_tokens <= limits.max_num_batched_tokens
            pol.kv.pool.check_invariants()
        else:
            assert plan.total_tokens <= limits.max_num_batched_tokens
            pol.kv.pool.check_invariants()
            held, stored = pol.kv_tokens_reserved_and_used()
            assert stored <= held
    return check


@pytest.mark.parametrize("name", [*ENGINES, "vllm-v1"])
@examples(ci=40)
@given(data=st.data())
def test_property_speculation_conserves_tokens_and_blocks(name, data):
    block_size = data.draw(st.sampled_from([1, 2, 4, 8]), label="block_size")
    limits = EngineLimits(
        block_size=block_size,
        num_gpu_blocks=data.draw(st.integers(6, 40)) * (8 // block_size),
        max_num_seqs=data.draw(st.integers(1, 6)),
        max_num_batched_tokens=data.draw(st.integers(max(block_size, 8), 300)),
        max_model_len=data.draw(st.integers(24, 300)),
    )
    knobs = data.draw(_engine_knobs(name), label="knobs")
    k = data.draw(st.integers(1, 5), label="k")
    rate = data.draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]), label="rate")
    n = data.draw(st.integers(1, 8))
    specs = []
    for i in range(n):
        out = data.draw(st.integers(1, 80))
        specs.append(RequestSpec(f"r{i:03d}", 0.01 * data.draw(st.integers(0, 25)) + i * 1e-6,
                                 data.draw(st.integers(1, 40)), out, out + data.draw(st.sampled_from([0, 5]))))
    with wall_clock_limit(20):
        reqs, steps, pol = run(name, specs, k=k, rate=rate, limits=limits, seed=3,
                               check=_per_step_check(name, limits), **knobs)
    assert set(reqs["state"]) <= {"finished", "rejected"}, reqs[["id", "state", "reason"]]
    fin = reqs[reqs["state"] == "finished"]
    for _, row in fin.iterrows():
        expected = min(row["output_tokens"], row["max_tokens"], max(limits.max_model_len - row["prompt_tokens"], 1))
        assert row["generated"] == expected
        assert len(row["token_times_s"]) == row["generated"]
    assert int(steps["spec_accepted"].sum()) == int(reqs["spec_accepted"].sum())
    assert (steps["spec_accepted"] <= steps["spec_proposed"]).all()
    assert pol.kv_blocks_used() == 0
    assert pol.kv_tokens_reserved_and_used() == (0, 0)


# --- the drafter priced from a kernel-database table of its own shapes ----------------------------------
HEAD_TABLE = "kernel-db-llama-3-8b-eagle3-head-h100-sxm-tp1"


def _head_cost():
    from pathlib import Path

    from sim.hardware.gpus import get_gpu
    from sim.hardware.models import get_model
    from sim.latency.table import TableLatency
    from sim.speculative.draft_cost import DraftCost

    target, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    cost = DraftCost("eagle3", 3, target, gpu, 1, 16)
    path = Path(__file__).resolve().parents[1] / "calib/tables" / HEAD_TABLE
    cost.use_table(TableLatency.from_path(path, cost.spec, gpu, 1, 16))
    return cost


def test_the_drafter_on_its_kernel_db_table_is_the_sum_of_the_tables_rows():
    """An EAGLE-3 head (k = 3) proposing for 8 requests after a verify step at context 700: one
    pass over the step's 32 rows (decode rows of context 700), then two one-token passes at
    contexts 704 and 705, each linear + per_seq + decode_attn of the head's table, plus the input
    projection on the roofline; no overhead, step gap or engine CPU time of its own."""
    from calib.sources.kernel_db import interp
    from sim.latency.base import step_shape
    from tests.test_speculative import _decode_plan

    cost = _head_cost()
    t = cost.table.table
    assert t.metadata["model"]["num_layers"] == 1 and t.metadata["model"]["vocab_size"] == 32000
    plan = _decode_plan(8, 700, 3)
    shape = step_shape(plan)
    shape.spec_tokens = 24
    got = cost.price(plan, shape)[0]
    first = interp(t, "linear", 32) + interp(t, "per_seq", 8) + interp(t, "decode_attn", 8, 700)
    later = sum(interp(t, "linear", 8) + interp(t, "per_seq", 8) + interp(t, "decode_attn", 8, 704 + j)
                for j in range(2))
    roof = cost.roof
    fc = max(cost._fc_flops * 32 / roof.linear_rate, (cost._fc_bytes + cost._fc_act * 32) / roof.memory_rate)
    assert got == pytest.approx(first + later + fc, rel=1e-9)
    assert interp(t, "engine_cpu", 8) > 0  # the table has one; the drafter does not pay it


def test_draft_table_is_refused_off_the_table_backend_and_for_ngram():
    import sim

    base = {**TINY_SCENARIO, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}}
    section = {"method": "eagle3", "num_speculative_tokens": 3, "acceptance": {"rate": 0.8},
               "draft_table": HEAD_TABLE}
    scn = load_scenario({**base, "latency": {"backend": "roofline"},
                         "policies": [{"name": "vllm-v1", "speculative": section}]})
    from sim.errors import CbsimError

    with pytest.raises(CbsimError, match="speculative.draft_table prices the drafter on latency.backend table"):
        sim.run(scn)
    with pytest.raises(ScenarioError, match="method ngram runs no model to price"):
        load_scenario({**base, "policies": [{"name": "vllm-v1", "speculative": {**section, "method": "ngram"}}]})


def test_the_head_to_compose_is_one_layer_of_the_targets_width_and_bad_draft_flags_are_one_line():
    from calib.sources.kernel_db import draft_source, resolve_model
    from sim.errors import CbsimError

    head = draft_source(resolve_model("llama-3-8b"), "eagle3")
    assert head.config["num_hidden_layers"] == 1 and head.config["vocab_size"] == 32000
    assert head.config["hidden_size"] == 4096 and head.config["intermediate_size"] == 14336
    with pytest.raises(CbsimError, match="--draft 'mtp' is not one of eagle, eagle3"):
        draft_source(resolve_model("llama-3-8b"), "mtp")
    with pytest.raises(CbsimError, match="heads of MoE/MLA models"):
        draft_source(resolve_model("mistralai/Mixtral-8x7B-v0.1"), "eagle3")
