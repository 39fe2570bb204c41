"""bench/cycle_bound.py: the share of a corpus row's measured closed-loop cycle that its own prompts'
prefill needs, in closed form (issue 26): the cycle from the row's means, the peak bound from the
prompt's FLOPs, the all-reduce bound from its bytes, the kernel-db price from the table's own steps."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None,
    reason="kernel-db tables need the optional extra cbsim[gpu-data]",
)


def test_allreduce_bound_is_two_per_layer_of_the_prompts_activations_over_one_link():
    from bench.cycle_bound import allreduce_bound
    from sim.hardware.models import get_model

    spec = get_model("meta-llama/Meta-Llama-3.1-8B")
    assert allreduce_bound(spec, 8000, 1, 450e9) == 0.0
    # 2 x 32 layers x 8000 tokens x 4096 x 2 bytes = 4.19 GB over 450 GB/s
    assert allreduce_bound(spec, 8000, 8, 450e9) == pytest.approx(2 * 32 * 8000 * 4096 * 2 / 450e9)


def test_a_row_whose_cycle_cannot_hold_its_prompts_at_the_database_rates(tmp_path):
    """H200 vLLM nvidia/Llama-3.1-8B-Instruct-FP8, 8000 x 100 tokens, 40 clients, TP 8: one client's
    measured cycle is 169.8 + 99 x 7.46 = 908 ms, in which the engine prefills 40 prompts of 8,000
    tokens; at the FP8 peak with the all-reduces over NVLink that is 0.77 of the cycle, at the
    database's own GEMM, attention and all-reduce rows 2.2 cycles."""
    from bench.cycle_bound import row_bound
    from bench.silicon_accuracy import Row, build_one, classify, code_hash
    from sim.hardware.gpus import get_gpu
    from sim.hardware.models import get_model

    row = Row(id="r", engine="vllm", version="0.12.0", model="nvidia/Llama-3.1-8B-Instruct-FP8", system="h200_sxm",
              precision="fp8", tp=8, isl=8000, osl=100, concurrency=40, ttft_ms=169.81, tpot_ms=7.46)
    classify([row])
    assert not row.skip, row.skip
    _, table, err = build_one((row.table_key, code_hash()))
    assert table, err
    b = row_bound(row, table)
    assert b.cycle_s == pytest.approx((169.81 + 99 * 7.46) * 1e-3)
    spec, gpu = get_model("nvidia/Llama-3.1-8B-Instruct-FP8"), get_gpu("h200")
    # linear layers at TP 8 shard shapes (no LM head but the prompt's last position), causal attention
    linear = 8000 * spec.layer_flops_per_token(8) + spec.lm_head_flops(8)
    attention = spec.attention_flops_per_pair(8) * 8000 * 8001 / 2
    assert b.peak_s == pytest.approx((linear + attention) / gpu.fp8_flops, rel=0.02)
    assert 0.7 < b.share(b.peak_s + b.allreduce_s, 40) < 0.85
    assert b.share(b.db_s, 40) > 2.0
