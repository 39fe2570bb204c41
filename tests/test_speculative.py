"""Speculative decoding (issue #32): drafts scheduled inside the token budget, verified, accepted.

Closed forms on a constant clock (every step 1 s): with every draft accepted (rate 1) and k = 3
each request gains four tokens per step, all at the step's end; with none accepted (rate 0) one
token per step, and the step still computes the 1 + k verification tokens. Budget accounting:
a step's scheduled tokens include the drafts, and the budget cuts them as vLLM's Phase A does.
Conservation and KV: every output token is emitted exactly once, rejected drafts stop counting
as stored KV the moment they are rejected, lookahead slots are allocated up front, and no block
is left held when the run ends. The acceptance draws are reproducible and a request's own
(they do not depend on the other requests). The drafter's cost follows its spec on the roofline.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from policies.base import EngineLimits, Request, StepPlan
from policies.registry import make_policy
from sim.engine import Simulation
from sim.errors import ScenarioError
from sim.hardware.gpus import get_gpu
from sim.hardware.models import get_model
from sim.latency.base import step_shape
from sim.latency.constant import ConstantLatency
from sim.latency.roofline import RooflineLatency
from sim.metrics.requests import emit_caught_up
from sim.scenario.schema import load_scenario
from sim.speculative.acceptance import Acceptance, conditional_rates, expected_accepted, geometric_rate
from sim.speculative.draft_cost import DraftCost, draft_spec
from sim.workload.request_spec import RequestSpec
from tests.helpers import FAKE_GPU, FAKE_MODEL, TINY_SCENARIO, records_for

LIMITS = EngineLimits(
    block_size=4, num_gpu_blocks=400, max_num_seqs=64, max_num_batched_tokens=512, max_model_len=2048
)


def run(specs, k, rate=None, rates=None, limits=LIMITS, seed=0, lookahead=None, fast_forward=None, **knobs):
    """One vllm-v1 replica on a 1 s constant clock with ``k`` drafts per step."""
    policy = make_policy("vllm-v1", limits, **knobs)
    policy.enable_speculation(k, k if lookahead is None else lookahead)
    latency = ConstantLatency(1.0, FAKE_MODEL, FAKE_GPU, 1, limits.block_size)
    acc = Acceptance(rates if rates is not None else (rate,) * k, seed)
    sim = Simulation(
        specs, [(policy, latency)], limits.max_model_len, acceptance=acc, fast_forward=fast_forward
    )
    rec = sim.run()
    return rec, rec.requests_frame(), rec.steps_frame(), policy


def spec(i, prompt, out, arrival=0.0, max_tokens=None):
    return RequestSpec(f"R{i}", arrival, prompt, out, max_tokens or out)


def assert_four_tokens_per_step(reqs, steps) -> None:
    """Two 4-token prompts, 13 tokens each, k = 3 drafts all accepted, 1 s steps: the prefill step,
    then four tokens per request per step (the verify batch counts 1 + 3 tokens per request)."""
    for times in reqs["token_times_s"]:
        assert list(times) == [1.0] + [2.0] * 4 + [3.0] * 4 + [4.0] * 4
    assert list(steps["batch_tokens"]) == [8, 8, 8, 8]  # 2 prompts of 4; then 2 x (1 + 3 drafts)
    assert list(steps["spec_proposed"]) == [0, 6, 6, 6]
    assert list(steps["spec_accepted"]) == [0, 6, 6, 6]
    assert list(reqs["tpot_s"]) == [3.0 / 12] * 2


# --- closed forms ---------------------------------------------------------------------------------
def test_every_draft_accepted_gives_k_plus_one_tokens_per_step():
    rec, reqs, steps, _ = run([spec(1, 4, 13), spec(2, 4, 13)], k=3, rate=1.0)
    # step 1 prefills both (first tokens at t = 1); then 4 tokens per request per step
    assert_four_tokens_per_step(reqs, steps)
    # ITL: one 1 s gap into each step's burst, then zeros inside it
    gaps = np.concatenate([np.diff(t) for t in reqs["token_times_s"]])
    expected = {
        "mean": float(np.mean(gaps)),
        **{f"p{p}": float(np.percentile(gaps, p)) for p in (50, 90, 99)},
    }
    got = rec.itl_stats()
    assert {k: got[k] for k in expected} == expected
    assert got["p50"] == 0.0 and got["mean"] == 3 / 12


def test_no_draft_accepted_gives_one_token_per_step_and_the_verify_cost():
    _, reqs, steps, _ = run([spec(1, 4, 10)], k=3, rate=0.0)
    assert list(reqs["token_times_s"][0]) == [float(t) for t in range(1, 11)]
    assert reqs["tpot_s"][0] == 1.0
    # every decode step still computes the sampled token and 3 drafts
    assert list(steps["batch_tokens"]) == [4] + [4] * 9
    assert list(steps["spec_proposed"]) == [0] + [3] * 9
    assert int(steps["spec_accepted"].sum()) == 0
    assert int(reqs["spec_steps"][0]) == 9 and int(reqs["spec_proposed"][0]) == 27


def test_a_burst_stops_at_the_requests_last_token():
    _, reqs, steps, _ = run([spec(1, 4, 6)], k=3, rate=1.0)  # 1 + 4 + (only 1 of 4 needed)
    assert list(reqs["token_times_s"][0]) == [1.0, 2.0, 2.0, 2.0, 2.0, 3.0]
    assert int(reqs["generated"][0]) == 6
    assert int(reqs["spec_accepted"][0]) == 6  # accepted drafts are counted before the stop trims them


def test_the_step_budget_counts_the_drafts():
    limits = EngineLimits(
        block_size=4, num_gpu_blocks=100, max_num_seqs=8, max_num_batched_tokens=6, max_model_len=256
    )
    pol = make_policy("vllm-v1", limits)
    pol.enable_speculation(3, 3)
    a, b = Request("A", 0.0, 2, 50), Request("B", 0.0, 2, 50)
    pol.add_request(a)
    pol.add_request(b)
    plan = pol.schedule()
    assert plan.num_new_tokens == [2, 2] and plan.spec_tokens == [0, 0]
    records = records_for(a, b)
    emit_caught_up(plan.scheduled, records, 0, 1.0)
    pol.finish_step(plan, [])
    plan = pol.schedule()
    # A: 1 + 3 drafts; B: the 2 tokens left of the budget, so 1 draft (vLLM trims spec_token_ids)
    assert plan.num_new_tokens == [4, 2] and plan.spec_tokens == [3, 1]
    assert plan.total_tokens == limits.max_num_batched_tokens
    assert a.num_computed_tokens == 2 + 1 + 3 and b.num_computed_tokens == 2 + 1 + 1


def test_max_model_len_cuts_the_drafts():
    limits = EngineLimits(
        block_size=4, num_gpu_blocks=100, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=8
    )
    _, reqs, steps, _ = run([spec(1, 4, 10)], k=3, rate=1.0, limits=limits)
    # max_model_len - prompt = 4 tokens at most; the decode step may compute up to position 6
    assert int(reqs["generated"][0]) == 4
    assert list(steps["batch_tokens"]) == [4, 3]  # 1 + 2 drafts: max_model_len - 1 - computed
    assert list(reqs["token_times_s"][0]) == [1.0, 2.0, 2.0, 2.0]


# --- KV: slots up front, rejected ones no longer stored, nothing leaked -----------------------------
def test_lookahead_slots_are_allocated_up_front_and_rejected_tokens_leave_the_stored_count():
    limits = EngineLimits(
        block_size=4, num_gpu_blocks=100, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256
    )
    pol = make_policy("vllm-v1", limits)
    pol.enable_speculation(3, 3)
    r = Request("A", 0.0, 4, 50)
    pol.add_request(r)
    plan = pol.schedule()  # a new request's prefill: no lookahead (vLLM: effective_lookahead_tokens)
    assert len(pol.kv.blocks_of(r)) == 1
    records = records_for(r)
    emit_caught_up(plan.scheduled, records, 0, 1.0)
    pol.finish_step(plan, [])
    plan = pol.schedule()
    assert plan.spec_tokens == [3]
    # slots for 4 computed + 4 new + 3 lookahead = 11 tokens: 3 blocks
    assert len(pol.kv.blocks_of(r)) == 3
    assert pol.kv_tokens_reserved_and_used() == (12, 8)
    pol.reject_drafts(plan, [2])  # one accepted, two rejected
    assert r.num_computed_tokens == 6
    assert pol.kv_tokens_reserved_and_used() == (
        12,
        6,
    )  # the blocks stay; the rejected slots are free to overwrite
    emit_caught_up(plan.scheduled, records, 1, 2.0)
    assert r.num_output_tokens == 3 and r.num_computed_tokens == r.num_tokens - 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_conservation_and_no_leak_under_preemption_and_prefix_caching(seed):
    rng = random.Random(seed)
    specs, t = [], 0.0
    for i in range(60):
        t += rng.expovariate(3.0)
        prompt, out = rng.randint(1, 120), rng.randint(1, 80)
        runs = ((("shared", i % 3), 8), (("own", i), prompt - 8)) if i % 2 and prompt > 8 else None
        specs.append(RequestSpec(f"r{i:03d}", t, prompt, out, out + rng.randint(0, 5), prompt_runs=runs))
    limits = EngineLimits(
        block_size=4, num_gpu_blocks=90, max_num_seqs=16, max_num_batched_tokens=64, max_model_len=512
    )
    rec, reqs, steps, pol = run(specs, k=4, rates=(0.9, 0.7, 0.5, 0.3), limits=limits, seed=seed)
    assert int(reqs["preemptions"].sum()) > 0  # the pool is small enough to preempt
    assert (reqs["state"] == "finished").all()
    finish_at = np.minimum(reqs["output_tokens"], reqs["max_tokens"])
    assert (reqs["generated"] == finish_at).all()
    for times, n in zip(reqs["token_times_s"], reqs["generated"]):
        assert len(times) == n and bool(np.all(np.diff(times) >= 0))  # each token once, in order
    # the steps emitted exactly the requests' tokens: prefills' first tokens plus accepted + 1 per verify
    assert int(steps["spec_proposed"].sum()) == int(reqs["spec_proposed"].sum())
    assert int(steps["spec_accepted"].sum()) == int(reqs["spec_accepted"].sum())
    assert (steps["spec_accepted"] <= steps["spec_proposed"]).all()
    assert pol.kv_blocks_used() == 0 and pol.num_free_blocks == limits.num_gpu_blocks
    assert pol.kv_tokens_reserved_and_used() == (0, 0)


def test_stored_tokens_track_the_accepted_positions_every_step():
    """After every step the KV tokens counted as stored are exactly the positions each request
    holds computed: accepted drafts in, rejected ones out (checked inside finish_step)."""
    specs = [spec(i, 10 + i, 30 + 3 * i, arrival=0.5 * i) for i in range(8)]
    pol = make_policy("vllm-v1", LIMITS)
    pol.enable_speculation(3, 3)
    seen = []
    finish_step = pol.finish_step

    def checked(plan, finished):
        finish_step(plan, finished)
        held = sum(r.num_computed_tokens for r in pol.running)
        seen.append(pol.kv_tokens_reserved_and_used()[1] == held)

    pol.finish_step = checked
    latency = ConstantLatency(1.0, FAKE_MODEL, FAKE_GPU, 1, LIMITS.block_size)
    Simulation(specs, [(pol, latency)], LIMITS.max_model_len, acceptance=Acceptance((0.6,) * 3, 5)).run()
    assert len(seen) > 20 and all(seen)


# --- acceptance draws ---------------------------------------------------------------------------------
def test_draws_are_seeded_and_each_requests_own():
    alone = [spec(1, 16, 200)]
    crowd = alone + [spec(i, 30, 150, arrival=0.3 * i) for i in range(2, 12)]
    a1 = run(alone, k=3, rate=0.6, seed=9)[1]
    a2 = run(alone, k=3, rate=0.6, seed=9)[1]
    b = run(crowd, k=3, rate=0.6, seed=9)[1]
    c = run(alone, k=3, rate=0.6, seed=10)[1]
    row = lambda f: tuple(int(f[c][0]) for c in ("spec_steps", "spec_proposed", "spec_accepted"))  # noqa: E731
    assert row(a1) == row(a2) == row(b)  # other requests' timing does not move R1's draws
    assert row(c) != row(a1)  # another seed, other draws


def test_acceptance_forms_and_their_mean():
    assert conditional_rates(3, rate=0.5) == (0.5, 0.5, 0.5)
    assert conditional_rates(3, per_position=[0.8, 0.4, 0.1]) == pytest.approx((0.8, 0.5, 0.25))
    a = geometric_rate(3, 2.5)
    assert 1 + a + a * a + a**3 == pytest.approx(2.5, abs=1e-12)
    assert expected_accepted((0.8, 0.5, 0.25)) == pytest.approx(0.8 + 0.4 + 0.1)
    # the draws reproduce the per-position rates: 20,000 verifications, within 5 standard errors
    acc = Acceptance(conditional_rates(3, per_position=[0.8, 0.4, 0.1]), seed=3)

    class Rec:
        spec = RequestSpec("x", 0.0, 1, 1, 1)
        spec_rng = None

    rec = Rec()
    n = 20_000
    draws = np.array([acc.draw(rec, 3) for _ in range(n)])
    for i, r in enumerate((0.8, 0.4, 0.1), 1):
        assert abs(float(np.mean(draws >= i)) - r) < 5 * math.sqrt(r * (1 - r) / n)
    assert Acceptance((1.0,) * 3, 0).draw(rec, 2) == 2  # never more than the drafts verified


def test_no_fast_forward_while_speculating_and_runs_agree_with_it_off():
    specs = [spec(i, 20, 40, arrival=0.2 * i) for i in range(10)]
    pol = make_policy("vllm-v1", LIMITS)
    pol.enable_speculation(2, 2)
    assert pol.decode_stretch() is None
    on = run(specs, k=2, rate=0.7, fast_forward=True)
    off = run(specs, k=2, rate=0.7, fast_forward=False)
    assert on[2].equals(off[2])
    assert on[1].drop(columns="token_times_s").equals(off[1].drop(columns="token_times_s"))


# --- the drafter's cost -----------------------------------------------------------------------------
def _decode_plan(b: int, context: int, k: int) -> StepPlan:
    reqs = []
    for i in range(b):
        r = Request(f"r{i}", 0.0, context, 100)
        r.num_output_tokens = 1
        r.num_computed_tokens = context + 1 + k  # after schedule: sampled token + k drafts computed
        reqs.append(r)
    plan = StepPlan(scheduled=reqs, num_new_tokens=[1 + k] * b, context=[context] * b, spec_tokens=[k] * b)
    return plan


def test_eagle3_head_cost_is_one_layer_an_input_projection_and_k_passes():
    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    head = draft_spec("eagle3", model)
    assert (head.num_layers, head.hidden_size, head.vocab_size) == (1, 4096, 32000)
    b, ctx = 8, 1000
    plan = _decode_plan(b, ctx, 3)
    roof = RooflineLatency(head, gpu, 1, 16, overhead_s=0.0)
    first = step_shape(plan)
    t1, f1, _ = roof.price(first, None)
    n = first.num_tokens
    fc_f, fc_b = 2.0 * 3 * 4096 * 4096 * n, 3 * 4096 * 4096 * 2 + 4 * 4096 * 2 * n
    fc_t = max(fc_f / roof.linear_rate, fc_b / roof.memory_rate)
    dts, fs, _ = roof.price_decodes(b, b * (ctx + 4), 2)
    t, f, _ = DraftCost("eagle3", 3, model, gpu, 1, 16).price(plan)
    assert t == pytest.approx(t1 + fc_t + float(np.sum(dts)), rel=1e-12)
    assert f == pytest.approx(f1 + fc_f + float(np.sum(fs)), rel=1e-12)
    # one draft token: the first pass only
    t_k1, _, _ = DraftCost("eagle3", 1, model, gpu, 1, 16).price(_decode_plan(b, ctx, 1))
    assert t_k1 < t


def test_ngram_costs_cpu_time_per_proposing_request_and_no_gpu_work():
    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    cost = DraftCost("ngram", 4, model, gpu, 1, 16, propose_s_per_request=2e-5)
    assert cost.price(_decode_plan(5, 100, 4)) == (pytest.approx(1e-4), 0.0, 0.0)


def test_a_draft_model_costs_its_own_layers():
    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    small = get_model("tiny")
    plan = _decode_plan(4, 200, 2)
    assert (
        DraftCost("draft", 2, model, gpu, 1, 16, draft_model=small).price(plan)[0]
        < DraftCost("draft", 2, model, gpu, 1, 16, draft_model=model).price(plan)[0]
    )


def test_verification_computes_logits_at_every_draft():
    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    roof = RooflineLatency(model, gpu, 1, 16)
    shape = step_shape(_decode_plan(16, 500, 3))
    plain = roof.price(shape, None)
    shape.spec_tokens = 48
    assert roof.price(shape, None)[1] - plain[1] == pytest.approx(48 * 2.0 * 4096 * 128256)


# --- scenario keys, the summary ----------------------------------------------------------------------
def _scenario(spec_section, policy="vllm-v1"):
    data = {**TINY_SCENARIO, "policies": [{"name": policy, "speculative": spec_section}]}
    return data


@pytest.mark.parametrize(
    "section, policy, message",
    [
        (
            {"method": "eagle3", "num_speculative_tokens": 3, "acceptance": {"rate": 0.7}},
            "orca",
            "policies.0.speculative: policy 'orca' does not model speculative decoding",
        ),
        (
            {
                "method": "eagle3",
                "num_speculative_tokens": 3,
                "acceptance": {"rate": 0.7, "mean_length": 2.0},
            },
            "vllm-v1",
            "give exactly one of rate, per_position, mean_length",
        ),
        (
            {"method": "eagle3", "num_speculative_tokens": 3, "acceptance": {"per_position": [0.9, 0.5]}},
            "vllm-v1",
            "policies.0.speculative.acceptance.per_position: needs one rate per draft token",
        ),
        (
            {"method": "eagle3", "num_speculative_tokens": 2, "acceptance": {"per_position": [0.5, 0.9]}},
            "vllm-v1",
            "must be non-increasing",
        ),
        (
            {"method": "mtp", "num_speculative_tokens": 2, "acceptance": {"mean_length": 3.5}},
            "vllm-v1",
            "at most num_speculative_tokens + 1 = 3 tokens",
        ),
        (
            {"method": "draft", "num_speculative_tokens": 2, "acceptance": {"rate": 0.5}},
            "vllm-v1",
            "policies.0.speculative.draft_model: required by method draft",
        ),
        (
            {
                "method": "eagle",
                "num_speculative_tokens": 2,
                "acceptance": {"rate": 0.5},
                "propose_s_per_request": 1e-5,
            },
            "vllm-v1",
            "only used by method ngram",
        ),
    ],
)
def test_bad_speculative_sections_are_one_line_errors(section, policy, message):
    with pytest.raises(ScenarioError) as info:
        load_scenario(_scenario(section, policy))
    text = str(info.value)
    assert message in text and "\n" not in text


def test_summary_reports_acceptance_and_tokens_per_step():
    import sim

    data = _scenario({"method": "eagle3", "num_speculative_tokens": 3, "acceptance": {"rate": 1.0}})
    data["workload"] = {**data["workload"], "output_tokens": {"dist": "fixed", "value": 13}}
    s = sim.run(data).summaries["vllm-v1"]["speculative"]
    assert s["acceptance_rate"] == 1.0 and s["mean_acceptance_length"] == 4.0 and s["tokens_per_step"] == 4.0
    assert s["draft_tokens"] == s["accepted_tokens"] == 5 * 3 * 3
    plain = sim.run({**TINY_SCENARIO}).summaries["vllm-v1"]
    assert plain["speculative"] is None



def test_the_sweep_reports_where_speculation_stops_paying():
    import pandas as pd

    from sim.planning.crossing import speculation_crossings

    scn = load_scenario(
        {
            **TINY_SCENARIO,
            "policies": [
                {"name": "vllm-v1"},
                {
                    "name": "vllm-v1",
                    "label": "spec",
                    "speculative": {
                        "method": "ngram",
                        "num_speculative_tokens": 2,
                        "acceptance": {"rate": 0.5},
                    },
                },
            ],
        }
    )
    rows = []
    for rate, base, spec_ in ((1.0, 2.0, 1.0), (2.0, 2.5, 2.0), (3.0, 3.0, 4.0)):
        rows.append({"point": 0, "rate": rate, "key": "k", "policy": "vllm-v1", "tpot_s.p50": base})
        rows.append({"point": 0, "rate": rate, "key": "k", "policy": "spec", "tpot_s.p50": spec_})
    (c,) = speculation_crossings(pd.DataFrame(rows), scn)
    assert (c.label, c.baseline, c.pays_at_lowest) == ("spec", "vllm-v1", True)
    assert c.crossing_rps == pytest.approx(
        2.0 + 0.5 / 1.5
    )  # the TPOT difference -0.5 -> +1.0 between 2 and 3
    assert c.ratio == (0.5, 0.8, 4.0 / 3.0)
    assert "stops paying at about 2.33 req/s" in c.sentence()
    still = pd.DataFrame([r for r in rows if r["rate"] < 3])
    assert speculation_crossings(still, scn)[0].crossing_rps is None


def test_the_drafters_weights_and_kv_come_out_of_the_block_pool():
    from sim.hardware.kv_capacity import block_bytes
    from sim.scenario.resolved import resolve
    from sim.speculative.setup import speculation_for

    scn = load_scenario(
        {
            "model": "llama-3-8b",
            "hardware": {"gpu": "h100-sxm"},
            "policies": [
                {
                    "name": "vllm-v1",
                    "speculative": {
                        "method": "eagle3",
                        "num_speculative_tokens": 3,
                        "acceptance": {"rate": 0.8},
                    },
                }
            ],
        }
    )
    dep = resolve(scn)
    entry = scn.policies[0]
    base = dep.limits_for(entry.name, entry.knobs())
    sp = speculation_for(dep, entry)
    got = sp.limits(base, dep).num_gpu_blocks
    # one more attention layer per block (33 instead of 32), and the head's weights in front
    per_target = block_bytes(dep.model, 16)
    weights_in_blocks = sp.draft.weight_bytes / (per_target * 33 / 32)
    expected = (base.num_gpu_blocks + 1) * 32 / 33 - weights_in_blocks - 1
    assert abs(got - expected) < 2
    assert sp.lookahead == 3 and sp.k == 3


def test_speculation_in_a_disaggregated_pool_is_refused():
    with pytest.raises(ScenarioError) as info:
        load_scenario(
            {
                **TINY_SCENARIO,
                "disaggregation": {
                    "decode": {
                        "policy": {
                            "name": "vllm-v1",
                            "speculative": {
                                "method": "eagle",
                                "num_speculative_tokens": 2,
                                "acceptance": {"rate": 0.5},
                            },
                        }
                    }
                },
            }
        )
    assert "disaggregation.decode.policy.speculative: speculative decoding is not modelled" in str(info.value)


def test_the_shipped_scenario_lowers_tpot_at_low_load():
    """scenarios/speculative.yaml at 5 req/s: EAGLE-3 (rate 0.85, k = 3) cuts TPOT p50 by more
    than half, and the measured acceptance is the configured one."""
    from pathlib import Path

    from sim.runner import run as run_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios/speculative.yaml"
    result = run_scenario(path, overrides=["workload.num_requests=300", "workload.arrival.rate=5.0"])
    base, eagle = result.summaries["vllm-v1"], result.summaries["eagle3"]
    assert eagle["tpot_s"]["p50"] < 0.5 * base["tpot_s"]["p50"]
    spec_ = eagle["speculative"]
    assert spec_["acceptance_rate"] == pytest.approx(expected_accepted((0.85,) * 3) / 3, abs=0.01)
    assert spec_["mean_acceptance_length"] == pytest.approx(1 + 0.85 + 0.85**2 + 0.85**3, abs=0.03)
    assert base["speculative"] is None


def test_the_table_backend_prices_verification_as_a_decode_of_the_same_contexts():
    """A measured table has no 4-token chunks: verification reads each request's KV once, like a
    decode row, and only its extra query rows add linear-layer time."""
    from pathlib import Path

    from sim.latency.table import TableLatency

    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    path = Path(__file__).resolve().parents[1] / "calib/tables/kernel-db-llama-3-8b-h100-sxm-tp1"
    table = TableLatency.from_path(path, model, gpu, 1, 16)
    verify = _decode_plan(8, 700, 3)
    decode = StepPlan(scheduled=verify.scheduled, num_new_tokens=[1] * 8, context=[700] * 8)
    sv, sd = step_shape(verify), step_shape(decode)
    sv.spec_tokens = 24
    tv, td = table.price(sv, verify)[0], table.price(sd, decode)[0]
    assert tv - td == pytest.approx(table._lin(32) - table._lin(8), rel=1e-9)
