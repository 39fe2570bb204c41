"""Each engine sized as it sizes itself: SGLang's pool by mem_fraction_static and its own running
cap, TGI's pool by its warm-up, vLLM's by gpu_memory_utilization (sim.hardware.engine_memory), and
the batch-vs-memory yardstick in one unit (tokens) for all of them."""

from __future__ import annotations

import pytest

from policies.sglang import sglang_chunk_default, sglang_running_cap
from sim.errors import CbsimError
from sim.hardware.engine_memory import sglang_mem_fraction_static, sglang_pool_tokens, tgi_pool_tokens
from sim.hardware.gpus import get_gpu
from sim.hardware.models import get_model
from sim.runner import run
from sim.scenario.resolved import resolve
from sim.scenario.schema import load_scenario

GIB = 1 << 30


def test_sglang_mem_fraction_static_on_an_h200_in_closed_form():
    h200 = get_gpu("h200")
    mib = h200.memory_bytes / (1 << 20)
    # chunk 8192 and cuda_graph_max_bs 256 below 160 GiB: 512 + 8192 × 1.5 + 256 × 2 + 1/8 × 1024 MiB
    assert sglang_chunk_default(resolve(load_scenario({})).limits.device) == 8192
    assert sglang_mem_fraction_static(h200, 1, 8192) == round((mib - 13440) / mib, 3) == 0.906


def test_sglang_pool_and_running_cap_in_closed_form():
    h200, llama = get_gpu("h200"), get_model("llama-3-8b")
    tokens = sglang_pool_tokens(llama, h200, 1, 1, 8192)
    cell = 32 * 8 * 128 * 2 * 2  # layers × kv heads × head_dim × (K, V) × bf16
    assert tokens == int((h200.memory_bytes * 0.906 - llama.weight_bytes(1, 1)) // cell)
    assert sglang_running_cap(tokens, 8192) == 4096  # tokens / 8192 × 512 far above the 4096 clamp
    assert sglang_running_cap(tokens, 131072) == int(tokens / 131072 * 512)  # inside [2048, 4096]
    assert sglang_running_cap(3000, 8192) == 1500  # a small pool: pool // 2 binds


def test_tgi_pool_and_its_refusal_when_one_request_cannot_fit():
    h200, llama = get_gpu("h200"), get_model("llama-3-8b")
    tokens = tgi_pool_tokens(llama, h200, 1, 1, 4096, 1)
    free = h200.memory_bytes - llama.weight_bytes(1, 1)
    assert 0.88 * free / 131072 < tokens < 0.90 * free / 131072  # 90 % of what weights and warm-up leave
    with pytest.raises(CbsimError, match=r"TGI's KV pool .* fewer than engine\.max_model_len \(10,000,000"):
        tgi_pool_tokens(llama, h200, 1, 1, 4096, 1, max_model_len=10_000_000)


def test_sglang_on_llama_3_8b_h200_defaults_to_its_own_cap_and_pool_stated_in_meta():
    scn = {"name": "sizing", "model": "llama-3-8b", "hardware": {"gpu": "h200"},
           "workload": {"num_requests": 20, "arrival": {"rate": 5.0}},
           "policies": [{"name": "vllm-v1"}, {"name": "sglang"}, {"name": "tgi"}]}
    res = run(scn)
    dep = resolve(load_scenario(scn))
    sg, tgi, vl = (res.meta[k] for k in ("sglang", "tgi", "vllm-v1"))
    assert sg["max_num_seqs"] >= 2048 and sg["max_num_seqs"] == 4096
    assert sg["kv_tokens"] == sglang_pool_tokens(dep.model, dep.gpu, 1, 1, 8192) // 16 * 16
    assert vl["max_num_seqs"] == 1024 and vl["kv_tokens"] == dep.limits_for("vllm-v1").num_gpu_blocks * 16
    assert tgi["max_num_seqs"] == 128 and tgi["kv_tokens"] != vl["kv_tokens"]
    assert len({sg["kv_tokens"], tgi["kv_tokens"], vl["kv_tokens"]}) == 3, "three rules, three pools"


def test_batch_vs_memory_measures_every_policy_against_the_same_pool_in_tokens():
    scn = {"name": "yardstick", "model": "tiny", "hardware": {"gpu": "cpu"},
           "latency": {"backend": "constant", "step_s": 0.01},
           "workload": {"num_requests": 50, "arrival": {"rate": 20.0},
                        "prompt_tokens": {"dist": "fixed", "value": 100},
                        "output_tokens": {"dist": "fixed", "value": 20}},
           "engine": {"num_gpu_blocks": 200, "max_model_len": 1024, "max_num_seqs": 16},
           "policies": [{"name": "vllm-v1"}, {"name": "sglang"}, {"name": "tgi"}]}
    res = run(scn)
    # a pinned pool of 200 blocks × 16 tokens; footprint = 100 + 20 / 2 tokens
    for label in res.labels:
        assert res.meta[label]["kv_tokens"] == 3200, label
        assert res.summaries[label]["memory_sequences"] == pytest.approx(3200 / 110), label
