"""Read a Hugging Face ``config.json`` into the numbers of a :class:`sim.hardware.models.ModelSpec`.

A capacity planner has the ``config.json`` that sits next to the weights they serve; its
architecture fields decide weight bytes, KV bytes per token and FLOPs, so cbsim reads them rather
than asking the user to copy them out. Only families whose layer structure cbsim prices correctly
are accepted (a decoder of grouped-query attention and a gated MLP or a routed mixture of gated
experts); anything else is one error naming the field, never a silently wrong model:

| ``architectures`` | what is read beyond the common fields |
|---|---|
| ``LlamaForCausalLM`` (Llama 2, 3, 3.1, 3.2, 3.3), ``MistralForCausalLM`` | ``sliding_window`` (Mistral 7B v0.1: every layer) |
| ``Qwen2ForCausalLM`` (Qwen2, Qwen2.5), ``Qwen3ForCausalLM`` | ``use_sliding_window`` / ``max_window_layers`` |
| ``MixtralForCausalLM`` | ``num_local_experts``, ``num_experts_per_tok``; an expert is ``intermediate_size`` wide |
| ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM`` | ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, ``shared_expert_intermediate_size`` |
| ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM`` (and the text part of ``Gemma3ForConditionalGeneration``) | ``head_dim``, ``sliding_window`` on alternating (Gemma 2) or 5-of-6 (Gemma 3) layers, or ``layer_types`` |
| ``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM`` (DeepSeek-V2/V3/R1, Kimi-K2), the text part of ``KimiK25ForConditionalGeneration`` | MLA: ``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``; ``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``, ``first_k_dense_replace``, ``moe_layer_freq`` (1 only), ``n_group``/``topk_group``, ``num_nextn_predict_layers`` (recorded, not loaded) |
| ``GptOssForCausalLM`` (gpt-oss-20b, -120b) | ``num_local_experts``, ``num_experts_per_tok``, an expert is ``intermediate_size`` wide, ``layer_types`` (alternating sliding/full), attention sinks, MXFP4 experts |

Common fields: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads`` (absent: no grouping), ``head_dim`` (absent or null:
``hidden_size / num_attention_heads``), ``intermediate_size``, ``vocab_size``,
``tie_word_embeddings`` (absent: the family's own default, as ``transformers`` has it),
``torch_dtype`` (or ``dtype``), ``quantization_config`` (FP8; for the routed experts only, gpt-oss's
MXFP4 and Kimi-K2.5's compressed-tensors INT4).

Rules that follow what vLLM serves (``--dtype auto``): a ``float32`` checkpoint is served in bf16
(vLLM never runs a float32 checkpoint in float32 by default); a ``quantization_config`` of FP8
(``quant_method: fp8``, or compressed-tensors / ModelOpt with 8-bit float weights) is w8a8 FP8.
Left out, each well under 0.1 % of the weights: q/k/v biases (Qwen2) and Gemma's extra norms.
The MoE router (hidden × experts per layer) is counted: it is a real GEMM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.errors import CbsimError

DENSE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MOE = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
MLA = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")
GPT_OSS = ("GptOssForCausalLM",)
SUPPORTED = DENSE + MOE + GEMMA + MLA + GPT_OSS
# multimodal wrappers whose language model is their ``text_config`` (the vision tower is left out)
_TEXT_CONFIG = ("Gemma3ForConditionalGeneration", "KimiK25ForConditionalGeneration")

# Architectures cbsim leaves out, and why (``cbsim models --all`` prints these reasons)
UNSUPPORTED = {
    "DeepseekV32ForCausalLM": "DeepSeek sparse attention (a lightning indexer picks 2048 keys per query) is "
                              "not modelled",
    "DeepseekV4ForCausalLM": "DeepSeek-V4's compressed and sparse attention layers are not modelled",
    "GlmMoeDsaForCausalLM": "DeepSeek sparse attention (indexer-selected keys) is not modelled",
    "KimiK3ForConditionalGeneration": "Kimi-K3's attention layout is not modelled",
    "NemotronHForCausalLM": "hybrid Mamba-2 / attention layers (a recurrent state, not a KV cache) are not "
                            "modelled",
    "Qwen3_5ForConditionalGeneration": "hybrid Gated DeltaNet linear-attention layers are not modelled",
    "Qwen3_5MoeForConditionalGeneration": "hybrid Gated DeltaNet linear-attention layers are not modelled",
    "Qwen3VLForConditionalGeneration": "the vision encoder and its image tokens are not modelled",
    "Qwen3VLMoeForConditionalGeneration": "the vision encoder and its image tokens are not modelled",
    "Llama4ForConditionalGeneration": "chunked local attention and MoE on alternating layers are not modelled",
    "Gemma4ForConditionalGeneration": "Gemma 4's per-layer attention shapes are not modelled",
    "MiniMaxM2ForCausalLM": "MiniMax-M2's per-layer q/k norms and partial rotary are not checked against its "
                            "kernels; not modelled",
    "MiniMaxM3ForCausalLM": "MiniMax-M3's hybrid attention is not modelled",
    "MiniMaxM3SparseForConditionalGeneration": "sparse attention and a vision encoder are not modelled",
    "MiMoForCausalLM": "MiMo's config (a Qwen2-style decoder with its own MTP-layer fields) is not read yet",
    "MiMoV2FlashForCausalLM": "hybrid sliding-window attention with attention sinks on an MoE of its own "
                              "layout is not modelled",
    "Step3p7FlashForCausalLM": "Step-3.7's attention layout is not modelled",
    "DeciLMForCausalLM": "Nemotron-NAS layers differ one by one (skipped attention, varying MLP widths); "
                         "not modelled",
}

# transformers' per-family default of tie_word_embeddings when a config leaves it out
# (LlamaConfig, MistralConfig, MixtralConfig, Qwen2/3(Moe)Config, DeepseekV3Config, GptOssConfig:
# False; Gemma2/3Config: True)
_TIED_DEFAULT = {**{a: False for a in DENSE + MOE + MLA + GPT_OSS}, **{a: True for a in GEMMA}}

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "bf16", "float": "bf16"}


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` at ``path`` (a file, or a folder holding one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise CbsimError(f"model.hf_config: {str(path)!r} does not exist; give the path of a Hugging Face "
                         f"config.json (or of the folder that holds it)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CbsimError(f"model.hf_config: cannot read {p}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise CbsimError(f"model.hf_config: {p} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise CbsimError(f"model.hf_config: {p} holds a {type(data).__name__}, not a config.json mapping")
    side = _quant_side_file(p)
    if side is not None and "quantization_config" not in data:
        data["quantization_config"] = {"quant_method": "modelopt", **side}
    return data


def _quant_side_file(config_path: Path) -> dict[str, Any] | None:
    """ModelOpt checkpoints keep their quantization in ``hf_quant_config.json`` beside config.json
    (aiconfigurator-core ships it as ``ORG--NAME_hf_quant_config.json``); its ``quantization``."""
    candidates = [config_path.parent / "hf_quant_config.json"]
    if config_path.name.endswith("_config.json"):
        candidates.append(config_path.with_name(config_path.name.removesuffix("_config.json")
                                                + "_hf_quant_config.json"))
    for cand in candidates:
        if cand.is_file():
            try:
                quant = json.loads(cand.read_text(encoding="utf-8")).get("quantization")
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                raise CbsimError(f"model.hf_config: {cand} is not a readable hf_quant_config.json") from None
            return quant if isinstance(quant, dict) else None
    return None


def spec_fields(config: dict[str, Any], name: str, where: str = "config.json") -> dict[str, Any]:
    """The :class:`ModelSpec` keyword arguments a ``config.json`` mapping describes.

    ``where`` names the file in error messages. Raises :class:`CbsimError` naming the field for an
    architecture cbsim cannot price or a field that is missing or malformed.
    """
    arch = _architecture(config, where)
    text = config.get("text_config") if arch in _TEXT_CONFIG else config
    if not isinstance(text, dict):
        raise CbsimError(f"{where}: field 'text_config' must be a mapping for {arch}")
    # Gemma 3's multimodal config keeps the language model's dtype and quantization at the top level
    merged = {**config, **text} if text is not config else config
    if arch in MLA or arch in GPT_OSS:
        fields = _mla_or_gpt_oss_fields(arch, merged, name, where)
        if context := context_length(merged, where):
            fields["context_length"] = context
        return fields
    get = _Reader(merged, where)
    layers = get.int("num_hidden_layers")
    hidden = get.int("hidden_size")
    heads = get.int("num_attention_heads")
    fields: dict[str, Any] = {
        "name": name,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": get.int("num_key_value_heads", default=heads),
        "head_dim": get.int("head_dim", default=hidden // heads),
        "intermediate_size": get.int("intermediate_size"),
        "vocab_size": get.int("vocab_size"),
        "dtype": _dtype(merged, where),
        "tied_embeddings": get.bool("tie_word_embeddings", default=_TIED_DEFAULT[arch]),
    }
    quant = _quantization(merged, where)
    if quant:
        fields["quantization"] = quant
    if arch in MOE:
        fields.update(_moe_fields(arch, get))
    context = context_length(merged, where)
    if context:
        fields["context_length"] = context
    window, sliding = _sliding_layers(arch, merged, get, layers)
    if window:
        fields["sliding_window"] = window
        fields["num_sliding_layers"] = sliding
    return fields


# The keys vLLM reads a model's length from, the smallest present winning (vllm/config.py
# ``_get_and_verify_max_len``, e.g. commit 2ac6d0e L1870; vllm/config/model.py in later releases).
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len")
# rope types whose max_position_embeddings already is the scaled length (vLLM leaves them unscaled)
_ROPE_UNSCALED = ("su", "longrope", "llama3")


def context_length(config: dict[str, Any], where: str = "config.json") -> int:
    """The model's length as vLLM derives it when ``--max-model-len`` is not given: the smallest of
    the length keys present, times the rope-scaling ``factor`` unless the rope type already
    counts it (``llama3``, ``longrope``, ``su``); for ``yarn``, ``original_max_position_embeddings``
    × factor. 0 when the config states no length (vLLM then assumes 2048 and warns; cbsim asks
    for ``engine.max_model_len`` instead: :func:`sim.scenario.schema.Scenario`)."""
    found = [v for k in _LENGTH_KEYS if isinstance(v := config.get(k), int) and not isinstance(v, bool) and v > 0]
    if not found:
        return 0
    length: float = min(found)
    rope = config.get("rope_scaling")
    if isinstance(rope, dict):
        kind = rope.get("rope_type", rope.get("type"))
        if kind not in _ROPE_UNSCALED and kind is not None:
            factor = rope.get("factor", 1.0)
            if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 0:
                raise CbsimError(f"{where}: field 'rope_scaling.factor' must be a positive number, got {factor!r}")
            if kind == "yarn" and isinstance(rope.get("original_max_position_embeddings"), int):
                length = rope["original_max_position_embeddings"]
            length *= factor
    return int(length)


def _architecture(config: dict[str, Any], where: str) -> str:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise CbsimError(f"{where}: field 'architectures' must be a list of class names (e.g. "
                         f"[\"LlamaForCausalLM\"]), got {archs!r}")
    arch = archs[0]
    if arch in UNSUPPORTED:
        raise CbsimError(f"{where}: architectures {arch!r} is not one cbsim can price: {UNSUPPORTED[arch]}; "
                         f"supported: {', '.join(SUPPORTED)}")
    if arch not in SUPPORTED:
        raise CbsimError(f"{where}: architectures {arch!r} is not one cbsim can price; supported: "
                         f"{', '.join(SUPPORTED)}. For another decoder, give an inline model spec "
                         f"(num_layers, hidden_size, ...) instead of hf_config")
    return arch


def _dtype(config: dict[str, Any], where: str) -> str:
    raw = config.get("torch_dtype", config.get("dtype", "bfloat16"))
    if raw is None:
        raw = "bfloat16"
    key = str(raw).removeprefix("torch.")
    if key not in _TORCH_DTYPES:
        raise CbsimError(f"{where}: field 'torch_dtype' {raw!r} is not one of bfloat16, float16, float32")
    return _TORCH_DTYPES[key]


def _quantization(config: dict[str, Any], where: str) -> str | None:
    """'fp8' for an FP8 (w8a8) checkpoint, None for an unquantized one; anything else is an error."""
    q = config.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise CbsimError(f"{where}: field 'quantization_config' must be a mapping, got {q!r}")
    method = str(q.get("quant_method") or "").lower()
    if method == "fp8":
        return "fp8"
    if method in ("compressed-tensors", "") and _compressed_tensors_fp8(q):
        return "fp8"
    if method in ("modelopt", "") and str(q.get("quant_algo", "")).upper() == "FP8":
        return "fp8"
    raise CbsimError(f"{where}: quantization_config.quant_method {q.get('quant_method')!r} is not one cbsim "
                     f"prices (FP8 only: quant_method fp8, or compressed-tensors / modelopt with 8-bit float "
                     f"weights); remove quantization_config to price the model unquantized")


def _expert_quantization(arch: str, config: dict[str, Any], where: str) -> tuple[str | None, str | None]:
    """(quantization, expert_quantization) of an MLA or gpt-oss checkpoint.

    FP8 (DeepSeek-V3/R1, Kimi-K2: ``quant_method: fp8``, 128 × 128 weight blocks) covers every
    decoder linear layer; gpt-oss's MXFP4 (``quant_method: mxfp4``, ``modules_to_not_convert``
    naming attention, router, embeddings and LM head) and Kimi-K2.5's compressed-tensors INT4
    (4-bit int weights in groups of 32, ``ignore`` naming attention, shared experts, the dense MLPs
    and LM head) cover the routed experts only."""
    q = config.get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method") or "").lower()
        if method == "mxfp4":
            return None, "mxfp4"
        if method == "compressed-tensors" and _compressed_tensors_int4_experts(q):
            return None, "int4"
    return _quantization(config, where), None


def _compressed_tensors_int4_experts(q: dict[str, Any]) -> bool:
    groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
    weights = [g.get("weights") or {} for g in groups]
    ignore = " ".join(str(x) for x in q.get("ignore") or [])
    return bool(weights) and all(w.get("num_bits") == 4 and w.get("type") == "int" and w.get("group_size") == 32
                                 for w in weights) and "self_attn" in ignore and "shared_experts" in ignore


def _mla_or_gpt_oss_fields(arch: str, config: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    get = _Reader(config, where)
    layers = get.int("num_hidden_layers")
    hidden = get.int("hidden_size")
    heads = get.int("num_attention_heads")
    quant, expert_quant = _expert_quantization(arch, config, where)
    fields: dict[str, Any] = {"name": name, "num_layers": layers, "hidden_size": hidden, "num_heads": heads,
                              "vocab_size": get.int("vocab_size"), "dtype": _dtype(config, where),
                              "tied_embeddings": get.bool("tie_word_embeddings", default=False)}
    if quant:
        fields["quantization"] = quant
    if expert_quant:
        fields["expert_quantization"] = expert_quant
    if arch in GPT_OSS:
        experts = get.int("num_local_experts")
        top_k = get.int("num_experts_per_tok", default=None) or get.int("experts_per_token")
        if top_k > experts:
            raise CbsimError(f"{where}: num_experts_per_tok ({top_k}) exceeds num_local_experts ({experts})")
        width = get.int("intermediate_size")
        fields.update(num_kv_heads=get.int("num_key_value_heads", default=heads),
                      head_dim=get.int("head_dim", default=hidden // heads), intermediate_size=width,
                      num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width,
                      attention_sinks=True)
        window, sliding = _sliding_layers(arch, config, get, layers)
        if window:
            fields.update(sliding_window=window, num_sliding_layers=sliding)
        return fields
    # DeepSeek-V2/V3 layout (vLLM vllm/model_executor/models/deepseek_v2.py)
    freq = get.int("moe_layer_freq", default=1)
    if freq != 1:
        raise CbsimError(f"{where}: moe_layer_freq {freq} (MoE on every {freq}th layer) is not modelled; cbsim prices "
                         f"dense first layers then MoE on every layer (moe_layer_freq 1)")
    experts = get.int("n_routed_experts")
    top_k = get.int("num_experts_per_tok")
    if top_k > experts:
        raise CbsimError(f"{where}: num_experts_per_tok ({top_k}) exceeds n_routed_experts ({experts})")
    groups = get.int("n_group", default=1)
    top_groups = get.int("topk_group", default=1)
    if experts % groups or top_groups > groups or top_k > top_groups * (experts // groups):
        raise CbsimError(f"{where}: grouped routing n_group {groups}, topk_group {top_groups} cannot pick "
                         f"{top_k} of {experts} experts")
    first_k = get.int("first_k_dense_replace", default=0, minimum=0)
    if first_k >= layers:
        raise CbsimError(f"{where}: first_k_dense_replace ({first_k}) leaves no MoE layer of {layers}")
    width = get.int("moe_intermediate_size")
    nope, rope = get.int("qk_nope_head_dim"), get.int("qk_rope_head_dim")
    fields.update(num_kv_heads=heads, head_dim=nope + rope, intermediate_size=get.int("intermediate_size"),
                  num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width,
                  shared_expert_intermediate_size=get.int("n_shared_experts", default=0, minimum=0) * width,
                  first_k_dense_layers=first_k, kv_lora_rank=get.int("kv_lora_rank"), qk_rope_head_dim=rope,
                  qk_nope_head_dim=nope, v_head_dim=get.int("v_head_dim"),
                  q_lora_rank=get.int("q_lora_rank", default=0, minimum=0),
                  mtp_layers=get.int("num_nextn_predict_layers", default=0, minimum=0))
    return fields


def _compressed_tensors_fp8(q: dict[str, Any]) -> bool:
    groups = q.get("config_groups") or {}
    weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
    return bool(weights) and all(w.get("num_bits") == 8 and w.get("type") == "float" for w in weights)


def _moe_fields(arch: str, get: _Reader) -> dict[str, Any]:
    if arch == "MixtralForCausalLM":
        experts = get.int("num_local_experts")
        width = get.int("intermediate_size")
        shared = 0
    else:
        experts = get.int("num_experts")
        width = get.int("moe_intermediate_size")
        shared = get.int("shared_expert_intermediate_size", default=0, minimum=0)
        # every layer must be an MoE layer: cbsim prices one MLP kind per model
        step = get.int("decoder_sparse_step", default=1)
        dense_layers = get.list("mlp_only_layers", default=[])
        if step != 1:
            raise CbsimError(f"{get.where}: decoder_sparse_step {step} (MoE on every {step}th layer) is not "
                             f"modelled; cbsim prices models whose every layer is an MoE layer (step 1)")
        if dense_layers:
            raise CbsimError(f"{get.where}: mlp_only_layers {dense_layers} (dense layers among MoE layers) is "
                             f"not modelled; cbsim prices models whose every layer is an MoE layer")
    top_k = get.int("num_experts_per_tok")
    if top_k > experts:
        raise CbsimError(f"{get.where}: num_experts_per_tok ({top_k}) exceeds the number of experts ({experts})")
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": width,
            "shared_expert_intermediate_size": shared}


def _sliding_layers(arch: str, config: dict[str, Any], get: _Reader, layers: int) -> tuple[int, int]:
    """(window, layers that use it), (0, 0) without a sliding window.

    ``layer_types`` (newer configs) names each layer's attention; otherwise the family's rule, as
    ``transformers`` and vLLM build the layers: Gemma 2 slides on even layers, Gemma 3 on all but
    every ``sliding_window_pattern``-th (default 6), Qwen2/3 from ``max_window_layers`` on when
    ``use_sliding_window`` is true, Llama/Mistral/Mixtral on every layer when ``sliding_window``
    is set.
    """
    window = config.get("sliding_window")
    if window is None:
        return 0, 0
    window = get.int("sliding_window")
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise CbsimError(f"{get.where}: field 'layer_types' must list one attention type per layer "
                             f"({layers}), got {types!r}")
        sliding = sum(1 for t in types if t == "sliding_attention")
    elif arch == "Gemma2ForCausalLM":
        sliding = (layers + 1) // 2
    elif arch.startswith("Gemma3"):
        pattern = get.int("sliding_window_pattern", default=6)
        sliding = layers - layers // pattern
    elif arch.startswith("Qwen"):
        if not get.bool("use_sliding_window", default=False):
            return 0, 0
        sliding = max(0, layers - get.int("max_window_layers", default=layers, minimum=0))
    else:
        sliding = layers
    return (window, sliding) if sliding else (0, 0)


class _Reader:
    """Typed access to config fields, each failure one message naming the field."""

    def __init__(self, config: dict[str, Any], where: str) -> None:
        self.config, self.where = config, where

    _MISSING = object()

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1) -> int:
        value = self.config.get(key)
        if value is None:
            if default is self._MISSING:
                raise CbsimError(f"{self.where}: field {key!r} is missing (an integer is required)")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise CbsimError(f"{self.where}: field {key!r} must be an integer >= {minimum}, got {value!r}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise CbsimError(f"{self.where}: field {key!r} must be true or false, got {value!r}")
        return value

    def list(self, key: str, default: list) -> list:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, list):
            raise CbsimError(f"{self.where}: field {key!r} must be a list, got {value!r}")
        return value
