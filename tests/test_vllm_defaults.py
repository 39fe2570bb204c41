"""vllm-v1 runs with vLLM 0.32's own defaults unless the scenario says otherwise.

The documented vLLM values (``vllm/engine/arg_utils.py``, ``EngineArgs.get_batch_defaults`` for the
``OPENAI_API_SERVER`` usage context, then ``_set_default_max_num_seqs_and_batched_tokens_args``;
reference/schedulers.md §1.1) are written out here independently of ``policies.vllm_defaults``:
per GPU class, (max_num_seqs, max_num_batched_tokens) and prefix caching on.
"""

from __future__ import annotations

import pytest

from policies.base import EngineLimits
from policies.registry import make_policy
from policies.vllm_defaults import GIB, VLLM_RELEASE
from sim.hardware.gpus import GPUS
from sim.runner import run
from sim.scenario.resolved import resolve
from sim.scenario.schema import load_scenario

# vLLM's API-server defaults by GPU class, as its source states them
DOCUMENTED = {
    "large": (1024, 8192),  # >= 70 GiB reported and the name has no "a100" (H100 80GB, H200)
    "huge": (1024, 16384),  # >= 160 GiB (B200)
    "small": (256, 2048),  # everything else (A100 of any size, L40S, RTX 4090)
    "cpu": (128, 2048),  # vLLM's CPU backend, per rank
}
# what the shipped GPU ids are, by the vendor's reported memory and name
EXPECTED_CLASS = {"h100-sxm": "large", "h200": "large", "a100-80gb": "small", "l40s": "small", "cpu": "cpu",
                  "b200": "huge", "h100-pcie": "large", "a100-40gb": "small", "rtx-4090": "small",
                  "rtx-pro-6000": "large"}


def _class_of(gpu) -> str:
    if gpu.name == "cpu":
        return "cpu"
    if gpu.memory_bytes >= 160 * GIB:
        return "huge"
    if gpu.memory_bytes >= 70 * GIB and "a100" not in (gpu.description or gpu.name).lower():
        return "large"
    return "small"


def _limits(gpu: str, policy: str = "vllm-v1", **engine):
    scn = load_scenario({"hardware": {"gpu": gpu}, "model": "tiny" if gpu == "cpu" else "llama-3-8b",
                         "engine": engine, "policies": [{"name": policy}]})
    dep = resolve(scn)
    return dep.limits_for(policy, scn.policies[0].knobs())


def test_release_is_the_one_the_golden_logs_were_recorded_with():
    assert VLLM_RELEASE == "0.32"
    assert "0.32" in make_policy("vllm-v1", EngineLimits()).summary


@pytest.mark.parametrize("gpu_id", sorted(GPUS))
def test_vllm_v1_defaults_equal_vllms_for_the_gpu_class(gpu_id):
    gpu = GPUS[gpu_id]
    if gpu_id in EXPECTED_CLASS:
        assert _class_of(gpu) == EXPECTED_CLASS[gpu_id], f"{gpu_id}: {gpu.memory_bytes / GIB:.1f} GiB"
    seqs, tokens = DOCUMENTED[_class_of(gpu)]
    limits = _limits(gpu_id)
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (seqs, tokens)


def test_the_known_gpus_cover_every_class():
    assert {_class_of(GPUS[g]) for g in ("h100-sxm", "h200", "a100-80gb", "l40s", "cpu")} == \
        {"large", "small", "cpu"}


def test_every_other_policy_keeps_256_and_8192():
    for policy in ("orca", "vllm-v0", "sarathi", "static"):
        limits = _limits("h200", policy)
        assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (256, 8192), policy


def test_each_default_is_overridable_and_vllms_adjustments_apply():
    # a set value is kept; the other still comes from the GPU class, adjusted as vLLM does
    assert (lambda lim: (lim.max_num_seqs, lim.max_num_batched_tokens))(_limits("h200", max_num_seqs=64)) == (64, 8192)
    lim = _limits("h200", max_num_batched_tokens=512)
    assert (lim.max_num_seqs, lim.max_num_batched_tokens) == (512, 512)  # max_num_seqs <= token budget
    lim = _limits("h200", max_num_seqs=48, max_num_batched_tokens=4096)
    assert (lim.max_num_seqs, lim.max_num_batched_tokens) == (48, 4096)
    # chunked prefill off: the default budget is raised to max_model_len
    scn = load_scenario({"engine": {"max_model_len": 16384},
                         "policies": [{"name": "vllm-v1", "enable_chunked_prefill": False}]})
    lim = resolve(scn).limits_for("vllm-v1", scn.policies[0].knobs())
    assert (lim.max_num_seqs, lim.max_num_batched_tokens) == (1024, 16384)
    # budget capped at max_num_seqs x max_model_len
    lim = _limits("h200", max_num_seqs=2, max_model_len=1024)
    assert lim.max_num_batched_tokens == 2048


def test_a_run_reports_and_uses_the_resolved_limits():
    scn = {"model": "llama-3-8b", "hardware": {"gpu": "h200"}, "latency": {"backend": "constant", "step_s": 0.01},
           "workload": {"num_requests": 20, "arrival": {"process": "poisson", "rate": 1000.0},
                        "prompt_tokens": {"dist": "fixed", "value": 64},
                        "output_tokens": {"dist": "fixed", "value": 4}},
           "policies": [{"name": "vllm-v1"}, {"name": "orca"}]}
    res = run(scn)
    assert (res.meta["vllm-v1"]["max_num_seqs"], res.meta["vllm-v1"]["max_num_batched_tokens"]) == (1024, 8192)
    assert res.meta["vllm-v1"]["max_slots"] == 1024
    assert (res.meta["orca"]["max_num_seqs"], res.meta["orca"]["max_num_batched_tokens"]) == (256, 8192)
    # a scenario that sets them keeps them for every policy
    res = run(scn, ["engine.max_num_seqs=256", "engine.max_num_batched_tokens=8192"])
    assert res.meta["vllm-v1"]["max_num_seqs"] == 256 and res.meta["vllm-v1"]["max_num_batched_tokens"] == 8192


def test_prefix_caching_is_on_by_default_and_can_be_turned_off():
    scn = {"model": "llama-3-8b", "hardware": {"gpu": "h200"}, "latency": {"backend": "constant", "step_s": 0.01},
           "workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 20.0},
                        "prompt_tokens": {"dist": "fixed", "value": 600},
                        "output_tokens": {"dist": "fixed", "value": 8},
                        "prefix": {"num_groups": 2, "prefix_len": 512}},
           "policies": [{"name": "vllm-v1"}]}
    assert make_policy("vllm-v1", EngineLimits()).knobs["enable_prefix_caching"] is True
    on = run(scn).steps["prefill_tokens"].sum()
    off = run(scn, ["engine.enable_prefix_caching=false"]).steps["prefill_tokens"].sum()
    entry_off = run(scn, ["policies.0.enable_prefix_caching=false"]).steps["prefill_tokens"].sum()
    assert off == entry_off == 40 * 600  # every prompt computed in full
    assert on <= off - 30 * 512  # most prompts found their 512-token prefix (32 full blocks) cached
