"""MLA + MoE (DeepSeek-V3/R1, Kimi-K2/K2.5) and gpt-oss, read from their config.json (issue #30).

The configs are the copies cbsim ships (sim/hardware/configs/, each naming its source), so these
tests need neither the network nor the optional aiconfigurator-core package.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.base import StepPlan
from sim.errors import CbsimError
from sim.hardware.gpus import get_gpu
from sim.hardware.kv_capacity import GIB, num_gpu_blocks
from sim.hardware.model_sources import SHIPPED_DIR
from sim.hardware.models import from_hf_config
from sim.latency.base import step_shape
from sim.latency.roofline import RooflineLatency


def shipped(name: str):
    return from_hf_config(SHIPPED_DIR / f"{name.replace('/', '--')}_config.json", name=name)


DSV3 = "deepseek-ai/DeepSeek-V3"


# --- parameter counts against the model cards ------------------------------------------------------
@pytest.mark.parametrize(
    "name,total,active,rel",
    [
        # DeepSeek-V3 model card (huggingface.co/deepseek-ai/DeepSeek-V3): "671B total parameters with 37B
        # activated for each token" (the 14B of its MTP module are not counted, nor loaded without MTP)
        (DSV3, 671e9, 37e9, 0.02),
        ("deepseek-ai/DeepSeek-R1", 671e9, 37e9, 0.02),
        # Kimi-K2 model card (github.com/MoonshotAI/Kimi-K2): "1 trillion total parameters", "32 billion
        # activated"; K2.5 keeps the language model's shapes
        ("moonshotai/Kimi-K2-Instruct", 1.0e12, 32e9, 0.03),
        ("moonshotai/Kimi-K2.5", 1.0e12, 32e9, 0.03),
    ],
)
def test_mla_models_have_their_model_cards_parameters(name, total, active, rel):
    spec = shipped(name)
    assert spec.num_params() == pytest.approx(total, rel=rel)
    assert spec.active_params() == pytest.approx(active, rel=rel)


@pytest.mark.parametrize(
    "name,total,active",
    [
        # gpt-oss model card (OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", table 1): total 116.83B and
        # 20.91B; active per token 5.13B and 3.61B (the input embedding not counted as active). cbsim leaves
        # out the attention and expert biases (about 0.05 % of the weights).
        ("openai/gpt-oss-120b", 116.83e9, 5.13e9),
        ("openai/gpt-oss-20b", 20.91e9, 3.61e9),
    ],
)
def test_gpt_oss_has_its_model_cards_parameters(name, total, active):
    spec = shipped(name)
    embedding = spec.vocab_size * spec.hidden_size
    assert spec.num_params() == pytest.approx(total, rel=0.002)
    assert spec.active_params() - embedding == pytest.approx(active, rel=0.005)


# --- the shapes read from config.json --------------------------------------------------------------
def test_deepseek_v3_layout_as_the_engines_load_it():
    m = shipped(DSV3)
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.q_lora_rank) == (
        512,
        64,
        128,
        128,
        1536,
    )
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (256, 8, 2048)
    assert m.shared_expert_intermediate_size == 2048 and m.first_k_dense_layers == 3 and m.moe_layers == 58
    assert m.quantization == "fp8" and m.mtp_layers == 1  # recorded, not loaded
    names = {op.name: op for op in m.dense_linears(8)}
    assert names["fused_qkv_a_proj"].n == 1536 + 576  # replicated on every rank
    assert (
        names["q_b_proj"].n == 16 * 192 and names["kv_b_proj"].n == 16 * 256 and names["o_proj"].k == 16 * 128
    )
    assert names["mlp.gate_up_proj"].layers == 3 and names["router"].layers == 58
    assert all(op.layers == 58 for op in m.expert_linears(8))


def test_gpt_oss_layout_as_the_engines_load_it():
    m = shipped("openai/gpt-oss-120b")
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (128, 4, 2880)
    assert (m.sliding_window, m.num_sliding_layers, m.num_layers) == (128, 18, 36)  # alternating
    assert m.attention_sinks and m.quantization is None and m.expert_quantization == "mxfp4"
    # MXFP4: 4-bit values + one 8-bit scale per 32 = 4.25 bits for the experts; attention stays bf16
    expert = m.expert_linears()[0]
    assert expert.weight_bytes == 4.25 / 8
    assert {op.weight_bytes for op in m.dense_linears()} == {2}
    k25 = shipped("moonshotai/Kimi-K2.5")
    assert (
        k25.expert_quantization == "int4" and k25.quantization is None
    )  # int4 + a bf16 scale per 32: 4.5 bits
    assert k25.expert_linears()[0].weight_bytes == 4.5 / 8


# --- KV cache -----------------------------------------------------------------------------------
def test_mla_caches_the_latent_once_per_token_and_layer_on_every_rank():
    m = shipped(DSV3)
    for tp in (1, 8):  # the latent is not split over the heads: every rank holds it whole
        assert m.kv_layer_bytes_per_token(tp) == (512 + 64) * 2
    fp8 = replace(m, kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token(8) == 576 * 61
    # grouped-query attention with 128 heads of 128 K + 128 V would cache 57 times as much per layer
    assert 2 * 128 * 128 * 2 / m.kv_layer_bytes_per_token() == pytest.approx(56.9, abs=0.1)


class _Hw:
    def __init__(self, util, reserve_gib):
        self.gpu_memory_utilization, self.activation_reserve_gib = util, reserve_gib
        self.expert_parallel, self.tensor_parallel, self.data_parallel = False, 8, 1


def test_deepseek_v3_fp8_kv_blocks_on_8x_h200_match_vllms_formula():
    """vLLM's own arithmetic for DeepSeek-V3 (FP8 weights, --kv-cache-dtype fp8) at tensor parallel 8
    on H200, at its defaults (gpu_memory_utilization 0.9):

    - KV page of one layer: ``MLAAttentionSpec.real_page_size_bytes`` = block_size × num_kv_heads ×
      head_size × dtype bytes (vllm/v1/kv_cache_interface.py), with ``num_kv_heads`` 1 and
      ``head_size`` = kv_lora_rank + qk_rope_head_dim (``MLAAttention.get_kv_cache_spec``,
      vllm/model_executor/layers/attention/mla_attention.py); the block size is forced to 64 for
      FlashMLA (vllm/platforms/cuda.py, ``check_and_update_config``: "Forcing kv cache block size to
      64 for FlashMLA backend");
    - blocks = (total × utilization − weights − activation peak) // (page × layers)
      (``Worker.determine_available_memory``, then ``get_kv_cache_config``: one page per layer per
      block, vllm/v1/core/kv_cache_utils.py);
    - weights per GPU: the model card's 671B parameters at one byte (FP8) split over 8 ranks, plus the
      second byte of the bf16 embedding and LM head.

    cbsim's weight bytes come from its own per-operator shapes (replicated latent projections and
    router included); the activation reserve is pinned to the same 4 GiB on both sides.
    """
    m = replace(shipped(DSV3), kv_cache_dtype="fp8")
    gpu = get_gpu("h200")
    block_size, util, reserve = 64, 0.9, 4 * GIB
    page = block_size * 1 * (m.kv_lora_rank + m.qk_rope_head_dim) * 1  # fp8: one byte
    weights = (671e9 + 2 * m.vocab_size * m.hidden_size) / 8
    engine = int((gpu.memory_bytes * util - weights - reserve) // (page * m.num_layers))
    ours = num_gpu_blocks(m, gpu, _Hw(util, 4.0), block_size, tp=8)
    assert ours == pytest.approx(engine, rel=0.05)
    assert 20_000 < ours < 25_000  # ~1.4 M tokens of 64-token blocks: an order of magnitude above GQA


# --- roofline ------------------------------------------------------------------------------------
def roofline(name, tp=1, **kw) -> RooflineLatency:
    return RooflineLatency(shipped(name), get_gpu("h200"), tp, 64, **kw)


def test_mla_decode_attention_is_absorbed_and_prefill_is_not():
    lat = roofline(DSV3, tp=8)
    m = lat.model
    heads = 16  # 128 / 8
    # prefill: multi-head, 192-wide keys and 128-wide values; decode: multi-query over the 576 latent
    assert m.attention_flops_per_pair(8) == 2 * heads * (192 + 128) * 61
    assert m.decode_attention_flops_per_pair(8) == 2 * heads * (576 + 512) * 61
    b, ctx = 32, 4096
    plan = StepPlan(scheduled=list(range(b)), num_new_tokens=[1] * b, context=[ctx] * b)
    _, flops, bytes_ = lat.price(step_shape(plan), plan)
    plan0 = StepPlan(scheduled=list(range(b)), num_new_tokens=[1] * b, context=[1] * b)
    _, flops0, bytes0 = lat.price(step_shape(plan0), plan0)
    keys = b * (ctx - 1)  # the extra keys the long contexts read
    assert flops - flops0 == pytest.approx(m.decode_attention_flops_per_pair(8) * keys, rel=1e-9)
    assert bytes_ - bytes0 == pytest.approx(576 * 2 * 61 * keys, rel=1e-9)  # the latent, bf16, once per layer


def test_mla_prefill_up_projects_its_cached_prefix():
    lat = roofline(DSV3, tp=8)
    m = lat.model
    fresh = StepPlan(scheduled=[0], num_new_tokens=[512], context=[0])
    after = StepPlan(scheduled=[0], num_new_tokens=[512], context=[4096])
    _, f0, _ = lat.price(step_shape(fresh), fresh)
    _, f1, _ = lat.price(step_shape(after), after)
    pairs = 512 * 4096  # each of the 512 queries sees 4096 more keys
    up = 2 * 16 * (128 + 128) * 512 * 61 * 4096  # kv_b_proj over the 4096 cached latents
    assert f1 - f0 == pytest.approx(m.attention_flops_per_pair(8) * pairs + up, rel=1e-9)


def test_first_k_dense_layers_and_experts_in_the_flops():
    m = shipped(DSV3)
    h = 7168
    dense = 3 * 3 * h * 18432  # three dense layers
    moe = 58 * (3 * h * 2048 * (8 + 1) + h * 256)  # 8 routed + 1 shared expert, router
    attn = 61 * sum(op.n * op.k for op in m.attention_linears())
    assert m.layer_flops_per_token() == 2.0 * (dense + moe + attn)


def test_mxfp4_experts_read_a_quarter_of_their_bf16_bytes():
    lat = roofline("openai/gpt-oss-120b")
    m = lat.model
    bf16 = RooflineLatency(replace(m, expert_quantization=None), get_gpu("h200"), 1, 64)
    # one decode token hits 4 of 128 experts per layer: their weights are read at 4.25 bits, not 16
    plan = StepPlan(scheduled=[0], num_new_tokens=[1], context=[100])
    _, _, b4 = lat.price(step_shape(plan), plan)
    _, _, b16 = bf16.price(step_shape(plan), plan)
    expert = sum(op.n * op.k * op.layers for op in m.expert_linears())  # one expert's weights, all layers
    assert b16 - b4 == pytest.approx(4 * expert * (2 - 4.25 / 8), rel=1e-6)


def test_vectorized_decodes_equal_step_by_step_pricing_for_mla():
    lat = roofline(DSV3, tp=8)
    secs, flops, bytes_ = lat.price_decodes(16, 16 * 300, 4)
    for j in (1, 4):
        plan = StepPlan(scheduled=list(range(16)), num_new_tokens=[1] * 16, context=[300 + j - 1] * 16)
        assert (secs[j - 1], flops[j - 1], bytes_[j - 1]) == pytest.approx(
            lat.price(step_shape(plan), plan), rel=1e-12
        )


# --- refusals ---------------------------------------------------------------------------------------
def test_mla_fields_without_a_latent_are_one_error():
    from sim.hardware.models import get_model

    small = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "intermediate_size": 128, "vocab_size": 100}
    with pytest.raises(CbsimError, match="need kv_lora_rank > 0"):
        get_model({**small, "qk_rope_head_dim": 64})
    with pytest.raises(CbsimError, match="expert_quantization 'nf4' is not one of mxfp4, int4"):
        get_model({**small, "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
                   "expert_quantization": "nf4"})


def test_every_config_left_out_says_why():
    """``cbsim models --all``: a local config.json cbsim cannot price names its architecture's reason
    (hf_config.UNSUPPORTED) or the quantization it does not price; none fails another way."""
    from sim.hardware.hf_config import UNSUPPORTED
    from sim.hardware.model_sources import available_models

    reasons = {}
    for src in available_models():
        try:
            from_hf_config(src.path, name=src.name)
        except CbsimError as exc:
            msg = str(exc)
            assert (
                any(f"'{arch}' is not one cbsim can price: {why}" in msg for arch, why in UNSUPPORTED.items())
                or "quantization_config" in msg
            ), msg
            reasons[src.name] = msg
    names = {s.name for s in available_models()}
    assert {"deepseek-ai/DeepSeek-V3", "openai/gpt-oss-120b", "moonshotai/Kimi-K2.5"} <= names - set(reasons)


def test_dp_without_ep_splits_each_expert_over_tp_times_dp_gpus():
    """vLLM's MoE layers form one tp × dp tensor-parallel group when attention is data-parallel and
    expert parallelism is off: DeepSeek-V3 on 8 GPUs as DP 8 holds one eighth of every expert (and
    the whole attention), so it fits where a replicated MoE would not."""
    m = shipped(DSV3)
    experts = sum(op.weight_bytes_total for op in m.expert_linears(1, 1, moe_tp=8)) * m.num_experts
    assert experts == sum(op.weight_bytes_total for op in m.expert_linears(8)) * m.num_experts
    whole = sum(op.weight_bytes_total for op in m.expert_linears(1)) * m.num_experts
    assert m.weight_bytes(1) - m.weight_bytes(1, 1, moe_tp=8) == whole - experts  # only the experts are split
    from sim.scenario.resolved import resolve
    from sim.scenario.schema import load_scenario

    dep = resolve(
        load_scenario(
            {
                "model": DSV3,
                "hardware": {"gpu": "h200", "data_parallel": 8},
                "engine": {"max_model_len": 4096},
                "workload": {"num_requests": 1, "arrival": {"rate": 1.0}},
            }
        )
    )
    assert dep.lockstep == 8 and dep.limits.num_gpu_blocks > 0


def test_an_inline_mla_moe_spec_in_a_scenario():
    from sim.errors import ScenarioError
    from sim.hardware.models import get_model
    from sim.scenario.schema import load_scenario

    dense = {"num_layers": 4, "hidden_size": 512, "num_heads": 8, "intermediate_size": 1024, "vocab_size": 1000}
    workload = {"num_requests": 1, "arrival": {"rate": 1.0}}
    scn = load_scenario(
        {
            "model": {
                **dense,
                "kv_lora_rank": 64,
                "qk_rope_head_dim": 16,
                "qk_nope_head_dim": 32,
                "v_head_dim": 32,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 256,
                "first_k_dense_layers": 1,
                "expert_quantization": "mxfp4",
                "context_length": 8192,  # what engine.max_model_len defaults to
            },
            "workload": workload,
        }
    )
    m = get_model(scn.model)
    assert m.kv_layer_bytes_per_token() == (64 + 16) * 2 and m.moe_layers == 3
    with pytest.raises(ScenarioError, match="model: .*need kv_lora_rank > 0"):
        load_scenario({"model": {**dense, "v_head_dim": 32}, "workload": workload})


def test_the_shipped_copies_resolve_without_aiconfigurator_or_a_cache(tmp_path, monkeypatch):
    from sim.hardware import model_sources
    from sim.hardware.models import get_model

    monkeypatch.setattr(model_sources, "aiconfigurator_configs_dir", lambda: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    assert model_sources.find_config(DSV3).origin == "cbsim"
    assert get_model("openai/gpt-oss-20b").num_experts == 32
    assert {s.name for s in model_sources.available_models()} == {
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-R1",
        "moonshotai/Kimi-K2-Instruct",
        "moonshotai/Kimi-K2.5",
        "openai/gpt-oss-20b",
        "openai/gpt-oss-120b",
        "nvidia/Llama-3.1-8B-Instruct-FP8",
    }


def _spec_scenario(model, method="mtp"):
    from sim.scenario.schema import load_scenario

    return load_scenario(
        {
            "model": model,
            "hardware": {"gpu": "h200", "tensor_parallel": 8},
            "engine": {"max_model_len": 4096},
            "workload": {
                "num_requests": 8,
                "arrival": {"rate": 4.0},
                "prompt_tokens": {"dist": "fixed", "value": 512},
                "output_tokens": {"dist": "fixed", "value": 32},
            },
            "policies": [
                {
                    "name": "vllm-v1",
                    "speculative": {
                        "method": method,
                        "num_speculative_tokens": 1,
                        "acceptance": {"rate": 0.8},
                    },
                }
            ],
        }
    )


def test_deepseek_mtp_drafts_with_its_own_moe_layer_and_kimi_k2_has_none():
    """DeepSeek-V3's MTP module is one more MLA + MoE layer; Kimi-K2 ships none (num_nextn_predict_layers
    0), so method mtp on it is one error."""
    from sim import run
    from sim.speculative.draft_cost import draft_spec

    head = draft_spec("mtp", shipped(DSV3))
    assert head.num_layers == 1 and head.is_mla and head.moe_layers == 1 and head.first_k_dense_layers == 0
    eagle = draft_spec("eagle", shipped("openai/gpt-oss-120b"))
    assert not eagle.is_moe and eagle.expert_quantization is None
    summary = run(_spec_scenario(DSV3)).summaries["vllm-v1"]
    assert summary["requests_finished"] == 8
    with pytest.raises(CbsimError, match="ships no multi-token-prediction layer"):
        run(_spec_scenario("moonshotai/Kimi-K2-Instruct"))


def test_models_all_lists_every_architecture_it_leaves_out_with_the_reason(capsys, monkeypatch):
    """Issue #30, "must show": ``cbsim models --all`` names every architecture cbsim leaves out beside
    its reason (hf_config.UNSUPPORTED, all of them, whether or not a local config has it), and every
    local config.json it cannot price says why (the architecture's reason or the weight format)."""
    from sim.hardware.hf_config import UNSUPPORTED
    from tests.helpers import run_cli

    monkeypatch.setenv("COLUMNS", "1000")  # one line per table row: the reason is never wrapped
    code, out, _ = run_cli(capsys, "models", "--all")
    assert code == 0
    lines = out.splitlines()
    for arch, why in UNSUPPORTED.items():
        assert any(arch in line and why in line for line in lines), f"{arch}: {why!r} not listed"
    assert any("NVFP4, AWQ, GPTQ" in line for line in lines)
    code, out, _ = run_cli(capsys, "models", "--all", "--json")
    import json

    left = [r for r in json.loads(out) if not r["priced"]]
    import importlib.util

    if importlib.util.find_spec("aiconfigurator_core") is not None:  # its configs include DeepSeek-V3.2
        assert any("DeepseekV32ForCausalLM" in r["notes"] for r in left)
    for r in left:
        reason = r["notes"].removeprefix("not priced: ")
        assert r["notes"].startswith("not priced: ") and reason, r
        assert any(why in reason for why in UNSUPPORTED.values()) or "quantization" in reason, r
