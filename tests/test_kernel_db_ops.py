"""Which of AIConfigurator's compiled operators each table component prices (calib/sources/kernel_db.py
``spec_op_names``): positions read from the compiled lists themselves, so a model with two operators
of one name (gpt-oss: sliding-window and full-attention layers) prices both where they belong."""

from __future__ import annotations

import pytest

from tests.helpers import require_aic


@pytest.fixture(scope="module")
def oss():
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import Layout, MoeKernelDb

    return MoeKernelDb(resolve_model("openai/gpt-oss-120b"), "h200", Layout(1, 1, False), engine="vllm")


def _direct(evaluate, names, wanted, **shape) -> tuple[float, int]:
    """The database's own price of every operator named ``wanted`` (seconds) and how many there are."""
    idx = [i for i, n in enumerate(names) if n == wanted]
    return sum(ms for _n, ms, *_ in evaluate(idx, **shape)) * 1e-3, len(idx)


def test_both_attention_operators_of_gpt_oss_are_attention_and_the_lm_head_is_per_seq(oss):
    from calib.sources.kernel_db import spec_op_names

    ctx = spec_op_names(oss.handle.evaluate_context_ops)
    gen = spec_op_names(oss.handle.evaluate_generation_ops)
    assert ctx.count("context_attention") == 2 and gen.count("generation_attention") == 2
    # prefill: a 1,024-token chunk over 1,024 cached tokens holds both attention operators
    want, n = _direct(
        oss.handle.evaluate_context_ops, ctx, "context_attention", batch_size=1, s=1024, prefix=1024
    )
    assert n == 2
    assert sum(op.seconds for op in oss.prefill_attn_ops(1024, 1024).values()) == pytest.approx(
        want, rel=1e-9
    )
    # decode: 8 sequences at 2,000 keys (no DRAM floor at this size), both operators
    want, _ = _direct(oss.handle.evaluate_generation_ops, gen, "generation_attention", batch_size=8, s=2001)
    got = oss.decode_attn_ops(8, 2000, floor=False)
    assert sum(op.seconds for op in got.values()) == pytest.approx(want, rel=1e-9)
    # linear holds no attention; per_seq is the LM head, not the MoE combine next to it
    assert "attention" not in oss.linear_ops(8)
    head, _ = _direct(oss.handle.evaluate_generation_ops, gen, "generation_logits_gemm", batch_size=8, s=1)
    per_seq = oss.per_seq_ops(8)
    assert list(per_seq) == ["logits_gemm"] and per_seq["logits_gemm"].seconds == pytest.approx(
        head, rel=1e-9
    )
    assert head > 1e-4  # 0.32 ms at 8 sequences: not the 0 ms of the combine


def test_the_operator_list_reads_to_its_end(oss):
    from calib.sources.kernel_db import spec_op_names

    names = spec_op_names(oss.handle.evaluate_context_ops)
    with pytest.raises(ValueError):
        oss.handle.evaluate_context_ops([len(names)], batch_size=1, s=16)
    assert oss.context_ops == names


def test_deepseek_shared_experts_overlap_the_routed_ones_up_to_1024_tokens():
    """SGLang's dual-stream MoE (DeepseekV2MoE.forward, <= 1024 tokens): linear(T) takes the MoE block
    as the database's generation list prices it, the slower of shared and routed experts (so less than
    the context list's sum of both); above 1024 tokens, the sum."""
    require_aic()
    from calib.sources.kernel_db import resolve_model, spec_op_names
    from calib.sources.kernel_db_moe import MOE_OVERLAP_MAX_TOKENS, Layout, MoeKernelDb

    db = MoeKernelDb(
        resolve_model("deepseek-ai/DeepSeek-V3"), "h200", Layout(8, 1, False), engine="sglang", dtype="fp8"
    )
    gen = spec_op_names(db.handle.evaluate_generation_ops)
    assert "generation_moe_overlap" in gen
    small = db.linear_ops(4)
    assert "moe_overlap" in small and "shared_gate_up_gemm" not in small
    overlap = (
        db.handle.evaluate_generation_ops([gen.index("generation_moe_overlap")], batch_size=4, s=1)[0][1]
        * 1e-3
    )
    # over the 58 MoE layers: DeepSeek's first 3 are dense (kernel_db_moe.MoeKernelDb.with_dense_layers)
    assert small["moe_overlap"].seconds == pytest.approx(overlap * 58 / 61, rel=1e-9)
    serial = db._ops(db.handle.evaluate_context_ops(db._linear, batch_size=1, s=4))
    moe_block = sum(op.seconds for n, op in serial.items() if n.startswith(("shared_", "router", "moe")))
    assert 0.5e-3 < moe_block - overlap < moe_block  # the shared experts' time, hidden
    big = db.linear_ops(MOE_OVERLAP_MAX_TOKENS + 1)
    assert "moe" in big and "moe_overlap" not in big
    # SGLang with expert-parallel experts runs forward_deepep: shared experts first, no overlap
    wide = MoeKernelDb(
        resolve_model("deepseek-ai/DeepSeek-V3"), "h200", Layout(1, 8, True), engine="sglang", dtype="fp8"
    )
    assert not wide.overlaps_shared_experts and "moe" in wide.linear_ops(4)
