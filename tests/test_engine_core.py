"""The core loop on the seeds' worked example and on random workloads: exact step counts,
utilizations and join steps, and conservation (every block freed, every token accounted)."""

from __future__ import annotations

import pytest

from policies.base import EngineLimits, Request
from policies.registry import POLICIES
from tests.helpers import random_specs, simulate, specs_from

TOY = [3, 8, 3, 4, 2, 2]
TOY_LIMITS = EngineLimits(block_size=16, num_gpu_blocks=64, max_num_seqs=3, max_model_len=64)


def test_seed_toy_static_takes_12_steps_at_22_of_36():
    requests, steps, _, summary = simulate("static", specs_from(TOY), TOY_LIMITS, batch_size=3)
    assert summary["steps"] == 12
    assert steps["num_seqs"].sum() == 22
    assert summary["utilization"]["slots"] == pytest.approx(22 / 36)
    # R4-R6 wait for the whole first batch (8 steps): their first token ends step 9
    first = dict(zip(requests["id"], requests["first_token_s"]))
    assert [first[f"R{i}"] for i in range(1, 7)] == [1, 1, 1, 9, 9, 9]


def test_seed_toy_orca_takes_8_steps_at_22_of_24_with_refills():
    requests, steps, _, summary = simulate("orca", specs_from(TOY), TOY_LIMITS)
    assert summary["steps"] == 8
    assert summary["utilization"]["slots"] == pytest.approx(22 / 24)
    admitted = dict(zip(requests["id"], requests["admitted_s"]))
    # step k starts at time k-1 with a 1 s step: R4, R5 join at step 4, R6 at step 6
    assert admitted["R4"] == 3 and admitted["R5"] == 3 and admitted["R6"] == 5
    finish = dict(zip(requests["id"], requests["finish_s"]))
    assert finish == {"R1": 3, "R2": 8, "R3": 3, "R4": 7, "R5": 5, "R6": 7}


@pytest.mark.parametrize("name", ["static", "orca"])
@pytest.mark.parametrize("seed", range(4))
def test_conservation_on_random_workloads(name, seed):
    limits = EngineLimits(block_size=16, num_gpu_blocks=120, max_num_seqs=8, max_num_batched_tokens=512,
                          max_model_len=512)
    specs = random_specs(seed, max_tokens_extra=40)
    requests, steps, policy, summary = simulate(name, specs, limits, step_s=0.05)
    assert policy.kv_blocks_used() == 0, "every block reserved must be released by the end"
    assert policy.num_running == 0 and policy.num_waiting == 0
    fin = requests[requests["state"] == "finished"]
    assert len(fin) + summary["requests_rejected"] == len(specs)
    assert (fin["generated"] == fin["output_tokens"]).all()
    assert (requests[requests["state"] == "rejected"]["reason"] != "").all()
    # every prompt token prefilled once, every output token but the first decoded once
    assert steps["prefill_tokens"].sum() == fin["prompt_tokens"].sum()
    assert steps["decode_tokens"].sum() == (fin["generated"] - 1).sum()
    assert (steps["kv_blocks_used"] <= limits.num_gpu_blocks).all()
    assert (steps["num_seqs"] <= policy.max_slots).all()
    assert (fin["ttft_s"] <= fin["e2e_s"]).all()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policies_never_read_output_tokens(name, monkeypatch):
    def forbidden(self):
        raise AssertionError(f"policy {name} read output_tokens")

    monkeypatch.setattr(Request, "output_tokens", property(forbidden), raising=False)
    limits = EngineLimits(block_size=16, num_gpu_blocks=60, num_cpu_blocks=40, max_num_seqs=6,
                          max_num_batched_tokens=256, max_model_len=512)
    requests, *_ = simulate(name, random_specs(1, n=25), limits, step_s=0.05)
    assert (requests["state"] == "finished").sum() > 0


def test_rejects_requests_that_can_never_fit():
    limits = EngineLimits(block_size=16, num_gpu_blocks=10, max_num_seqs=4, max_model_len=1000)
    specs = specs_from([5, 5]) + specs_from([5], prompt=900)
    specs[-1] = type(specs[-1])("big", 0.0, 900, 5, 5)
    requests, _, _, summary = simulate("orca", specs, limits)
    big = requests.set_index("id").loc["big"]
    assert big["state"] == "rejected" and "KV pool" in big["reason"]
    assert summary["requests_finished"] == 2


def test_mfu_counts_useful_flops_not_static_padding():
    """Padding costs a static batch time but is not utilization (MFU as PaLM defines it)."""
    from policies.base import StepPlan
    from sim.latency.base import step_shape
    from sim.latency.roofline import RooflineLatency
    from tests.helpers import FAKE_GPU, FAKE_SPEC

    lat = RooflineLatency(FAKE_SPEC, FAKE_GPU, 1, 16)
    useful, padded = StepPlan(), StepPlan()
    for plan in (useful, padded):
        plan.add(Request("a", 0.0, 8, 8), 1, 40)
        plan.add(Request("b", 0.0, 8, 8), 1, 30)
    padded.padding_tokens, padded.padding_context = 3, 90
    t_useful, f_useful, _ = lat.price(step_shape(useful), useful)
    t_padded, f_padded, _ = lat.price(step_shape(padded), padded)
    assert f_padded == pytest.approx(f_useful, rel=1e-12)
    hw_flops, _ = lat.step_flops_bytes(step_shape(padded))
    assert hw_flops > f_useful and t_padded >= t_useful
