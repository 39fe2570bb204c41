"""Models from Hugging Face config.json files: every family cbsim prices, the errors for those it
cannot, and ``ORG/NAME`` resolution against local files only (the fixtures in tests/data/hf_configs/
are written from the models' published config.json shapes)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from sim.errors import CbsimError, ScenarioError
from sim.hardware import model_sources
from sim.hardware.models import MODELS, from_hf_config, get_model
from sim.hardware.moe import expected_active_experts
from sim.scenario.schema import load_scenario

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def cfg(name: str) -> Path:
    return CONFIGS / f"{name}.json"


@pytest.mark.parametrize("name,params", [
    # parameter counts the model cards publish (to their rounding)
    ("llama-3.1-8b", 8.03e9), ("llama-3.1-70b", 70.55e9), ("mixtral-8x7b", 46.70e9),
    ("qwen3-30b-a3b", 30.53e9), ("qwen3-32b", 32.76e9), ("gemma-2-9b", 9.24e9), ("gemma-3-1b", 1.00e9),
])
def test_parameter_counts_match_the_model_cards(name, params):
    assert from_hf_config(cfg(name)).num_params() == pytest.approx(params, rel=2e-3)


def test_a_dense_config_is_the_builtin_spec():
    # Llama-3.1-8B has Llama-3-8B's shapes: the config reads to the same numbers as the registry id
    spec = from_hf_config(cfg("llama-3.1-8b"))
    ref = MODELS["llama-3-8b"]
    assert spec.weight_bytes(2) == ref.weight_bytes(2) and spec.kv_bytes_per_token(2) == ref.kv_bytes_per_token(2)
    assert spec.name == "llama-3.1-8b" and spec.dtype == "bf16" and not spec.is_moe
    assert from_hf_config(cfg("llama-2-7b")).dtype == "fp16"


def test_moe_fields():
    mx = from_hf_config(cfg("mixtral-8x7b"))
    assert (mx.num_experts, mx.num_experts_per_tok, mx.moe_intermediate_size) == (8, 2, 14336)
    q = from_hf_config(cfg("qwen3-30b-a3b"))
    assert (q.num_experts, q.num_experts_per_tok, q.moe_intermediate_size, q.head_dim) == (128, 8, 768, 128)
    # each token uses its top-k experts: Mixtral's "12.9B active" per token (model card)
    active = (mx.layer_flops_per_token() + mx.lm_head_flops()) / 2 + mx.vocab_size * mx.hidden_size
    assert active == pytest.approx(12.9e9, rel=5e-3)


def test_head_dim_grouped_kv_and_tied_embeddings():
    q = from_hf_config(cfg("qwen3-32b"))  # 64 heads × 128 = 8192, wider than hidden 5120
    assert q.q_size == 8192 and q.num_kv_heads == 8
    g = from_hf_config(cfg("gemma-3-1b"))  # no tie_word_embeddings key: Gemma's default is tied
    assert g.tied_embeddings and g.head_dim == 256 and g.num_kv_heads == 1


def test_sliding_window_layers():
    assert (from_hf_config(cfg("mistral-7b-v0.1")).num_sliding_layers) == 32  # every layer
    g2 = from_hf_config(cfg("gemma-2-9b"))
    assert (g2.sliding_window, g2.num_sliding_layers) == (4096, 21)  # even layers of 42
    g3 = from_hf_config(cfg("gemma-3-1b"))
    assert (g3.sliding_window, g3.num_sliding_layers) == (512, 22)  # 26 layers, global at 6, 12, 18, 24
    assert from_hf_config(cfg("qwen2.5-7b")).sliding_window == 0  # use_sliding_window: false
    # capacity: a 32k request holds 512 tokens in each of the 22 sliding layers
    layer = 2 * 1 * 256 * 2
    assert g3.kv_capacity_bytes_per_token(1, 32768) == pytest.approx(layer * (4 + 22 * 512 / 32768))
    assert g3.kv_capacity_bytes_per_token(1, 512) == g3.kv_bytes_per_token(1) == layer * 26
    # and the Gemma 2 config's float32 is served in bf16, as vLLM's --dtype auto does
    assert g2.dtype == "bf16"


def test_layer_types_override_the_family_rule(tmp_path):
    data = json.loads(cfg("gemma-3-1b").read_text())
    data["layer_types"] = ["sliding_attention"] * 20 + ["full_attention"] * 6
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert from_hf_config(tmp_path).num_sliding_layers == 20


def test_fp8_checkpoints_and_kv_cache():
    bf16, fp8 = from_hf_config(cfg("qwen3-32b")), from_hf_config(cfg("qwen3-32b-fp8"))
    assert fp8.quantization == "fp8" and fp8.dtype == "bf16"
    # the decoder's linear layers take one byte per weight; embeddings, LM head and norms stay bf16
    h, v, L = 5120, 151936, 64
    kept = (2 * v * h + (2 * L + 1) * h) * 2
    assert fp8.weight_bytes() == (bf16.weight_bytes() - kept) // 2 + kept
    assert fp8.kv_bytes_per_token() == bf16.kv_bytes_per_token()  # KV follows engine.kv_cache_dtype
    assert get_model({"hf_config": str(cfg("qwen3-32b")), "kv_cache_dtype": "fp8"}).kv_bytes_per_token() * 2 == \
        bf16.kv_bytes_per_token()


@pytest.mark.parametrize("edit,message", [
    ({"architectures": ["DeepseekV32ForCausalLM"]},
     "architectures 'DeepseekV32ForCausalLM' is not one cbsim can price: DeepSeek sparse attention"),
    ({"architectures": ["FalconForCausalLM"]}, "architectures 'FalconForCausalLM' is not one cbsim can price"),
    ({"architectures": None}, "field 'architectures' must be a list"),
    ({"num_hidden_layers": None}, "field 'num_hidden_layers' is missing"),
    ({"hidden_size": "4096"}, "field 'hidden_size' must be an integer"),
    ({"torch_dtype": "int8"}, "field 'torch_dtype' 'int8' is not one of"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method 'awq' is not one cbsim"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok (9) exceeds the number of experts (8)"),
])
def test_bad_configs_are_one_error_naming_the_field(tmp_path, edit, message):
    data = {**json.loads(cfg("mixtral-8x7b").read_text()), **edit}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CbsimError) as info:
        from_hf_config(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unsupported_moe_layouts_and_files(tmp_path):
    data = {**json.loads(cfg("qwen3-30b-a3b").read_text()), "mlp_only_layers": [0, 1]}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(CbsimError, match="mlp_only_layers"):
        from_hf_config(tmp_path)
    with pytest.raises(CbsimError, match="is not valid JSON"):
        (tmp_path / "bad.json").write_text("{")
        from_hf_config(tmp_path / "bad.json")
    with pytest.raises(CbsimError, match="does not exist"):
        from_hf_config(tmp_path / "missing.json")
    with pytest.raises(CbsimError, match="architectures 'DeepseekV32ForCausalLM'"):
        from_hf_config(cfg("deepseek-v3.2-unsupported"))


def test_scenario_takes_an_hf_config_beside_it(tmp_path):
    shutil.copy(cfg("mixtral-8x7b"), tmp_path / "mixtral.json")
    (tmp_path / "s.yaml").write_text("model: {hf_config: mixtral.json}\nhardware: {gpu: h100-sxm, tensor_parallel: 2}\n"
                                     "workload: {num_requests: 1, arrival: {rate: 1.0}}\n")
    scn = load_scenario(tmp_path / "s.yaml")
    assert get_model(scn.model).num_experts == 8
    assert Path(scn.to_dict()["model"]["hf_config"]).is_absolute()  # the saved scenario re-runs anywhere
    with pytest.raises(ScenarioError, match="model: .*architectures 'DeepseekV32ForCausalLM'"):
        load_scenario({"model": {"hf_config": str(cfg("deepseek-v3.2-unsupported"))}})
    with pytest.raises(CbsimError, match="only name, quantization, kv_cache_dtype"):
        get_model({"hf_config": str(cfg("mixtral-8x7b")), "num_layers": 3})


def test_org_name_resolves_from_the_hf_cache_only(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--acme--Tiny-MoE" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(cfg("qwen3-30b-a3b"), snap / "config.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(model_sources, "aiconfigurator_configs_dir", lambda: None)
    monkeypatch.setattr(model_sources, "SHIPPED_DIR", tmp_path / "no-shipped-copies")
    spec = get_model("acme/Tiny-MoE")
    assert spec.name == "acme/Tiny-MoE" and spec.num_experts == 128
    assert [s.name for s in model_sources.available_models()] == ["acme/Tiny-MoE"]
    with pytest.raises(CbsimError, match="no config.json found locally.*cbsim never downloads"):
        get_model("acme/Other")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert model_sources.hf_cache_dir() == tmp_path / "hub"


def test_org_name_resolves_from_aiconfigurator_core_when_installed():
    if model_sources.aiconfigurator_configs_dir() is None:
        pytest.skip("aiconfigurator-core is not installed (pip install 'cbsim[gpu-data]')")
    spec = get_model("mistralai/Mixtral-8x7B-v0.1")
    assert (spec.num_experts, spec.num_experts_per_tok, spec.num_layers) == (8, 2, 32)
    assert get_model("nvidia/Llama-3.1-70B-Instruct-FP8").quantization == "fp8"  # hf_quant_config.json side file
    names = {s.name for s in model_sources.available_models()}
    assert {"Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B", "meta-llama/Meta-Llama-3.1-70B"} <= names


def test_expected_active_experts_is_the_exact_expectation():
    # enumerate every routing of T tokens, each to k distinct experts of E, equally likely
    for E, k, T in [(4, 2, 1), (4, 2, 3), (5, 1, 4), (6, 3, 2)]:
        choices = list(itertools.combinations(range(E), k))
        routings = list(itertools.product(choices, repeat=T))
        mean = sum(len(set().union(*r)) for r in routings) / len(routings)
        assert expected_active_experts(E, k, T) == pytest.approx(mean, rel=1e-12)
    assert expected_active_experts(8, 2, 1) == 2 and expected_active_experts(8, 2, 0) == 0
    assert expected_active_experts(8, 2, 64) == pytest.approx(8, rel=1e-6)
