"""Model specs: the few numbers of a decoder-only transformer that decide memory and compute.

The simulator never runs a model; it needs how many bytes its weights take (what is left of a
GPU for the KV cache), how many KV bytes each token costs (how many blocks fit), and how many
FLOPs and bytes each operator of a step costs (the roofline and MFU). All of that follows from the
architecture hyper-parameters below, read from each model's published ``config.json``
(:mod:`sim.hardware.hf_config` reads one for you).

Tensor parallelism (Megatron-style, as vLLM does it) splits the attention heads, the MLP and the
vocabulary across ``tp`` GPUs; layer norms are replicated. KV heads are split too; when a model
has fewer KV heads than GPUs, vLLM *replicates* each KV head over ``tp / num_kv_heads`` GPUs so
that every GPU holds exactly one (``tp`` must then be a multiple of ``num_kv_heads``). Query heads
must divide evenly by ``tp``, as in vLLM; anything else is an error.

Mixture of experts (Mixtral, Qwen2/3-MoE): every layer's MLP is ``num_experts`` gated experts of
width ``moe_intermediate_size``, of which each token uses ``num_experts_per_tok``, plus an
optional always-on shared expert, plus a router (hidden × experts, kept unquantized as vLLM does).
Without expert parallelism each expert is split over the ``tp`` GPUs like a dense MLP; with it
(``ep`` > 1, vLLM's ``--enable-expert-parallel``, where ``ep`` = tensor × data parallel) each GPU
holds ``num_experts / ep`` whole experts.

Dtypes: ``dtype`` is the activation (torch) dtype. ``quantization: fp8`` is w8a8 FP8: the linear
layers of the decoder (attention projections, MLP, experts) store one byte per weight and run on
FP8 tensor cores; embeddings, LM head, norms and the router stay in ``dtype`` (vLLM's Fp8 and
compressed-tensors methods skip them). ``kv_cache_dtype: fp8`` stores K and V in one byte
(vLLM's ``--kv-cache-dtype fp8``); ``None`` or ``auto`` stores them in ``dtype``.

Sliding-window layers (Mistral 7B v0.1, Gemma 2/3, gpt-oss) attend to at most ``sliding_window``
keys and hold at most that many tokens of KV per sequence: :meth:`ModelSpec.kv_capacity_bytes_per_token`
and the attention cost count them so.

Multi-head latent attention (MLA: DeepSeek-V2/V3/R1, Kimi-K2/K2.5; ``kv_lora_rank`` > 0) caches one
compressed latent of ``kv_lora_rank`` plus the decoupled rope key of ``qk_rope_head_dim`` per token
per layer, the same on every tensor-parallel rank (vLLM's ``MLAAttention.get_kv_cache_spec``:
``MLAAttentionSpec(num_kv_heads=1, head_size=kv_lora_rank + qk_rope_head_dim)``, and its
``real_page_size_bytes`` = block_size × num_kv_heads × head_size × dtype bytes, no factor 2 for K
and V; vllm/v1/kv_cache_interface.py). Its projections: ``q_a_proj`` (hidden → ``q_lora_rank``) and
``kv_a_proj_with_mqa`` (hidden → latent + rope key) replicated on every rank (vLLM's
``fused_qkv_a_proj``, a ``MergedReplicatedLinear``), ``q_b_proj`` and ``kv_b_proj`` split over
the heads, ``o_proj`` row-parallel. Decode runs the weight-absorbed form (vLLM
vllm/v1/attention/backends/mla/common.py, "data-movement friendly approach"): the query is
multiplied into latent space by ``W_UK`` and the output out of it by ``W_UV``, which together cost
one ``kv_b_proj`` row per token, and attention is multi-query over the 576-wide latent:
``2·(kv_lora_rank + qk_rope_head_dim) + 2·kv_lora_rank`` FLOPs per head per query-key pair.
Prefill runs the "compute friendly" form: ``kv_b_proj`` up-projects every key of the chunk's
context (its own tokens and the cached prefix) and attention is multi-head with
``qk_nope + qk_rope`` wide keys and ``v_head_dim`` wide values.

First-k dense layers (DeepSeek's ``first_k_dense_replace``): the first ``first_k_dense_layers``
decoder layers have a dense MLP of ``intermediate_size``; the others are MoE layers. DeepSeek's
grouped routing (``n_group``, ``topk_group``) picks ``num_experts_per_tok`` experts per token
among the best groups; under balanced routing every expert is still chosen with probability
``top_k / E`` per token, so :mod:`sim.hardware.moe`'s count holds as it is.

Expert weight formats (``expert_quantization``): ``mxfp4`` (gpt-oss: 4-bit E2M1 values plus one
8-bit E8M0 scale per 32, OCP Microscaling spec: 4.25 bits a weight; attention, router, embeddings
and LM head stay in ``dtype``, the checkpoint's ``modules_to_not_convert``) and ``int4`` (Kimi-K2.5:
compressed-tensors pack-quantized, symmetric int4 in groups of 32 with a bf16 scale: 4.5 bits;
attention, shared experts, dense MLPs and LM head in ``dtype``, its ``ignore`` list). Both run as
weight-only kernels (activations in ``dtype``, priced at the dense rate). FP8 block-quantized
checkpoints (DeepSeek: ``weight_block_size`` [128, 128]) keep one fp32 scale per 128 × 128 block,
0.024 % of the weight bytes, left out.

Attention sinks (gpt-oss): one learned logit per head added to every softmax's denominator: one
parameter per head and layer, no KV, no extra query-key pairs worth counting; recorded, priced as
zero. Multi-token-prediction layers (``num_nextn_predict_layers``) are recorded as ``mtp_layers``
and not part of the target model: the engines load them only as a speculative-decoding draft
(vLLM's DeepseekV2 ``load_weights`` skips ``model.layers.{num_hidden_layers}+`` without
``--speculative-config``). A policy entry's ``speculative: {method: mtp}`` prices that layer as
the drafter (:mod:`sim.speculative.draft_cost`), and is refused for a model that ships none.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

from sim.errors import CbsimError, nearest

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
QUANTIZATIONS = {"fp8": 1}  # bytes per quantized weight
# bytes per routed-expert weight of the weight-only 4-bit formats (module docstring)
EXPERT_QUANTIZATIONS = {"mxfp4": 0.5 + 1 / 32, "int4": 0.5 + 2 / 32}
KV_CACHE_DTYPES = {"auto": None, "fp8": 1}  # None: the model's dtype

# vLLM pads the vocabulary of its (vocab-parallel) embedding and LM head to a multiple of 64
# (``DEFAULT_VOCAB_PADDING_SIZE`` in vllm/model_executor/layers/vocab_parallel_embedding.py) and
# then splits it evenly over the tensor-parallel ranks; the padded rows take memory too.
VOCAB_PADDING = 64

_POSITIVE = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
             "vocab_size")
_NON_NEGATIVE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "sliding_window", "num_sliding_layers", "context_length")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class Linear:
    """One GEMM of a step, on ONE GPU: ``rows`` × ``k`` activations times a ``k`` × ``n`` weight.

    ``per`` says what ``rows`` counts: ``token`` (every token of the step passes through it) or
    ``sequence`` (the LM head: vLLM computes logits only at each scheduled sequence's sampled
    position). ``layers``: how many times a step runs it (once per decoder layer, or once).
    """

    name: str
    n: int
    k: int
    weight_bytes: float  # bytes per weight element (1 for fp8, 0.53125 for mxfp4)
    layers: int
    per: str = "token"

    @property
    def weight_bytes_total(self) -> int:
        total = self.n * self.k * self.weight_bytes * self.layers
        return total if isinstance(total, int) else int(round(total))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A Llama-style decoder (RMSNorm, rotary attention with grouped KV heads or multi-head latent
    attention, SwiGLU MLP or a mixture of SwiGLU experts, optionally after dense first layers)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bf16"
    tied_embeddings: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    sliding_window: int = 0
    num_sliding_layers: int = 0
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    kv_lora_rank: int = 0  # MLA: the cached latent's width (0: grouped-query attention)
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0  # MLA: the query's low-rank width (0: one q_proj from hidden)
    first_k_dense_layers: int = 0  # MoE: leading layers with a dense MLP of intermediate_size
    expert_quantization: str | None = None  # routed experts only: mxfp4 or int4 (weight-only)
    attention_sinks: bool = False
    mtp_layers: int = 0  # recorded, never loaded nor priced (speculative decoding)
    # the longest sequence the model takes, as vLLM derives it from config.json (max_position_embeddings
    # with its rope scaling: sim.hardware.hf_config.context_length); engine.max_model_len defaults to
    # it. 0: not stated (an inline spec without it).
    context_length: int = 0

    def __post_init__(self) -> None:
        for field in _POSITIVE + _NON_NEGATIVE:
            value = getattr(self, field)
            low = 1 if field in _POSITIVE else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                kind = "a positive" if low else "a non-negative"
                raise CbsimError(f"model {self.name!r}: {field} must be {kind} integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise CbsimError(f"model {self.name!r}: dtype {self.dtype!r} is not one of "
                             f"{', '.join(DTYPE_BYTES)}{nearest(self.dtype, DTYPE_BYTES)}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise CbsimError(f"model {self.name!r}: quantization {self.quantization!r} is not one of "
                             f"{', '.join(QUANTIZATIONS)} (or null)")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise CbsimError(f"model {self.name!r}: kv_cache_dtype {self.kv_cache_dtype!r} is not one of "
                             f"{', '.join(KV_CACHE_DTYPES)}")
        if self.num_heads % self.num_kv_heads:
            raise CbsimError(f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) (grouped-query attention)")
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise CbsimError(f"model {self.name!r}: num_experts_per_tok must be between 1 and num_experts "
                                 f"({self.num_experts}), got {self.num_experts_per_tok}")
            if self.moe_intermediate_size < 1:
                raise CbsimError(f"model {self.name!r}: moe_intermediate_size (one expert's width) is required "
                                 f"with num_experts")
        elif self.num_experts_per_tok or self.moe_intermediate_size or self.shared_expert_intermediate_size:
            raise CbsimError(f"model {self.name!r}: num_experts_per_tok, moe_intermediate_size and "
                             f"shared_expert_intermediate_size need num_experts > 0")
        if self.num_sliding_layers > self.num_layers:
            raise CbsimError(f"model {self.name!r}: num_sliding_layers ({self.num_sliding_layers}) exceeds "
                             f"num_layers ({self.num_layers})")
        if self.expert_quantization is not None and self.expert_quantization not in EXPERT_QUANTIZATIONS:
            raise CbsimError(f"model {self.name!r}: expert_quantization {self.expert_quantization!r} is not one of "
                             f"{', '.join(EXPERT_QUANTIZATIONS)} (or null)")
        if self.expert_quantization and not self.num_experts:
            raise CbsimError(f"model {self.name!r}: expert_quantization needs num_experts > 0")
        if self.first_k_dense_layers and not (self.num_experts and self.first_k_dense_layers < self.num_layers):
            raise CbsimError(f"model {self.name!r}: first_k_dense_layers ({self.first_k_dense_layers}) needs an MoE "
                             f"model with more layers than that ({self.num_layers})")
        if self.kv_lora_rank:
            missing = [f for f in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim") if getattr(self, f) < 1]
            if missing:
                raise CbsimError(f"model {self.name!r}: multi-head latent attention (kv_lora_rank > 0) needs "
                                 f"{missing[0]} > 0")
        elif self.q_lora_rank or self.qk_rope_head_dim or self.qk_nope_head_dim or self.v_head_dim:
            raise CbsimError(f"model {self.name!r}: q_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim "
                             f"describe multi-head latent attention and need kv_lora_rank > 0")
        if bool(self.sliding_window) != bool(self.num_sliding_layers):
            raise CbsimError(f"model {self.name!r}: sliding_window and num_sliding_layers go together "
                             f"(the window in tokens, and how many layers use it)")

    # --- sizes --------------------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        """Bytes of one activation element (and of an unquantized weight)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def linear_weight_bytes(self) -> int:
        """Bytes of one weight of a decoder linear layer: 1 under fp8, else the dtype's."""
        return QUANTIZATIONS[self.quantization] if self.quantization else self.dtype_bytes

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one cached K or V element."""
        q = KV_CACHE_DTYPES.get(self.kv_cache_dtype or "auto")
        return q if q is not None else self.dtype_bytes

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of one routed-expert weight: the 4-bit formats' share, else a linear layer's."""
        if self.expert_quantization:
            return EXPERT_QUANTIZATIONS[self.expert_quantization]
        return self.linear_weight_bytes

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)."""
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is the mixture of experts (all but the first-k dense ones)."""
        return self.num_layers - self.first_k_dense_layers if self.is_moe else 0

    @property
    def dense_mlp_layers(self) -> int:
        """Layers with a dense MLP of ``intermediate_size``."""
        return self.first_k_dense_layers if self.is_moe else self.num_layers

    @property
    def q_size(self) -> int:
        """Width of the query projection (num_heads × head_dim); not always hidden_size. MLA:
        num_heads × (qk_nope_head_dim + qk_rope_head_dim)."""
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_heads * self.head_dim

    @property
    def mla_latent_dim(self) -> int:
        """Width of one cached MLA token in one layer: the latent plus the rope key (576 for DeepSeek-V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def num_full_layers(self) -> int:
        """Layers attending over the whole context (the rest slide over ``sliding_window``)."""
        return self.num_layers - self.num_sliding_layers

    def num_params(self) -> int:
        """Parameters of the whole (unsharded) model, as the checkpoint counts them (MTP layers and
        biases left out)."""
        h = self.hidden_size
        per_layer = self._attention_params() + 2 * h + self._extra_norm_params()
        if self.attention_sinks:
            per_layer += self.num_heads
        mlp = self.dense_mlp_layers * 3 * h * self.intermediate_size
        if self.is_moe:
            mlp += self.moe_layers * (self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts
                                      + 3 * h * self.shared_expert_intermediate_size)
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return embeddings + self.num_layers * per_layer + mlp + h  # + final norm

    def active_params(self) -> int:
        """Parameters one token passes through (routed experts: only its ``num_experts_per_tok``),
        embeddings included, as model cards count "activated" parameters."""
        if not self.is_moe:
            return self.num_params()
        idle = self.moe_layers * (self.num_experts - self.num_experts_per_tok) * 3 * self.hidden_size \
            * self.moe_intermediate_size
        return self.num_params() - idle

    def _attention_params(self) -> int:
        h = self.hidden_size
        if not self.is_mla:
            kv = self.num_kv_heads * self.head_dim
            return h * self.q_size + 2 * h * kv + self.q_size * h
        heads, latent = self.num_heads, self.mla_latent_dim
        q = h * self.q_lora_rank + self.q_lora_rank * self.q_size if self.q_lora_rank else h * self.q_size
        kv = h * latent + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * h

    def _extra_norm_params(self) -> int:
        """MLA's norms on the query and KV latents (q_a_layernorm, kv_a_layernorm), per layer."""
        return self.q_lora_rank + self.kv_lora_rank if self.is_mla else 0

    # --- parallelism --------------------------------------------------------------------------
    def check_tp(self, tp: int) -> None:
        """Raise unless ``tp`` GPUs can split this model the way vLLM does."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise CbsimError(f"tensor_parallel must be a positive integer, got {tp!r}")
        if self.num_heads % tp:
            raise CbsimError(f"model {self.name!r}: tensor_parallel={tp} does not divide its "
                             f"{self.num_heads} attention heads; pick a divisor of {self.num_heads}")
        if self.is_mla:
            return  # one latent per token, the same on every rank
        if self.num_kv_heads < tp and tp % self.num_kv_heads:
            raise CbsimError(f"model {self.name!r}: tensor_parallel={tp} is neither a divisor nor a multiple "
                             f"of its {self.num_kv_heads} KV heads, so KV heads cannot be replicated evenly")
        if self.num_kv_heads >= tp and self.num_kv_heads % tp:
            raise CbsimError(f"model {self.name!r}: tensor_parallel={tp} does not divide its "
                             f"{self.num_kv_heads} KV heads")

    def check_ep(self, ep: int) -> None:
        """Raise unless ``ep`` expert-parallel ranks can split the experts evenly."""
        if ep == 1:
            return
        if not self.is_moe:
            raise CbsimError(f"model {self.name!r} has no experts: hardware.expert_parallel needs a "
                             f"mixture-of-experts model")
        if self.num_experts % ep:
            raise CbsimError(f"model {self.name!r}: {ep} expert-parallel GPUs (tensor_parallel × "
                             f"data_parallel) do not divide its {self.num_experts} experts")

    def heads_per_rank(self, tp: int = 1) -> int:
        self.check_tp(tp)
        return self.num_heads // tp

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads each GPU stores: ``num_kv_heads / tp``, or 1 when KV heads are replicated (MLA: 1,
        the latent every rank holds whole)."""
        self.check_tp(tp)
        if self.is_mla:
            return 1
        return max(1, self.num_kv_heads // tp)

    def experts_per_rank(self, ep: int = 1) -> int:
        return self.num_experts // ep if ep > 1 else self.num_experts

    def expert_width_per_rank(self, tp: int = 1, ep: int = 1, moe_tp: int | None = None) -> int:
        """One expert's intermediate width on one GPU: whole under expert parallelism, else split over
        the MoE's tensor-parallel group (``moe_tp``; default ``tp``. With data-parallel attention and
        no expert parallelism vLLM's MoE layers form one ``tp × dp`` group: docs/serving/
        data_parallel_deployment.md, "The expert layers will by default form a (DP x TP) sized
        tensor parallel group")."""
        return self.moe_intermediate_size if ep > 1 else _ceil_div(self.moe_intermediate_size, moe_tp or tp)

    # --- operators (per GPU) ------------------------------------------------------------------
    def dense_linears(self, tp: int = 1) -> list[Linear]:
        """The GEMMs every token passes through (attention projections, a dense or shared-expert
        MLP, the router), then the LM head, with their TP-sharded shapes. Routed experts are not
        here: what they cost depends on how many the step's tokens hit (:meth:`expert_linears`)."""
        h, w = self.hidden_size, self.linear_weight_bytes
        ops = self.attention_linears(tp)
        if self.dense_mlp_layers:
            inter = _ceil_div(self.intermediate_size, tp)
            k = self.dense_mlp_layers
            ops += [Linear("mlp.gate_up_proj", 2 * inter, h, w, k), Linear("mlp.down_proj", h, inter, w, k)]
        if self.is_moe:
            m = self.moe_layers
            if self.shared_expert_intermediate_size:
                inter = _ceil_div(self.shared_expert_intermediate_size, tp)
                ops += [Linear("shared_expert.gate_up_proj", 2 * inter, h, w, m),
                        Linear("shared_expert.down_proj", h, inter, w, m)]
            ops.append(Linear("router", self.num_experts, h, self.dtype_bytes, m))
        ops.append(Linear("lm_head", self._vocab_rows(tp), h, self.dtype_bytes, 1, per="sequence"))
        return ops

    def attention_linears(self, tp: int = 1) -> list[Linear]:
        """The attention projections of every layer on one GPU.

        Grouped-query attention: the fused q/k/v projection and o_proj. MLA (module docstring):
        the replicated ``q_a_proj`` + ``kv_a_proj_with_mqa`` (one fused GEMM, as vLLM runs it), the
        head-split ``q_b_proj`` and ``kv_b_proj`` (per token: the absorbed ``W_UK``/``W_UV`` BMMs of
        decode cost the same FLOPs and weight reads), and ``o_proj``. The prefill's up-projection of
        its cached context is a per-key cost: :meth:`mla_context_flops_per_key`."""
        h, w, L = self.hidden_size, self.linear_weight_bytes, self.num_layers
        if not self.is_mla:
            q = self.q_size // tp
            kv = self.kv_heads_per_rank(tp) * self.head_dim
            return [Linear("qkv_proj", q + 2 * kv, h, w, L), Linear("o_proj", h, q, w, L)]
        heads = self.heads_per_rank(tp)
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            ops = [Linear("fused_qkv_a_proj", self.q_lora_rank + self.mla_latent_dim, h, w, L),
                   Linear("q_b_proj", heads * qk, self.q_lora_rank, w, L)]
        else:
            ops = [Linear("q_proj", heads * qk, h, w, L), Linear("kv_a_proj_with_mqa", self.mla_latent_dim, h, w, L)]
        return ops + [Linear("kv_b_proj", heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank, w, L),
                      Linear("o_proj", h, heads * self.v_head_dim, w, L)]

    def mla_context_flops_per_key(self, tp: int = 1) -> float:
        """MLA prefill: FLOPs of up-projecting one cached context key (``kv_b_proj`` on its latent),
        all layers, one GPU; 0 for grouped-query attention."""
        if not self.is_mla:
            return 0.0
        width = self.heads_per_rank(tp) * (self.qk_nope_head_dim + self.v_head_dim)
        return 2.0 * width * self.kv_lora_rank * self.num_layers

    def expert_linears(self, tp: int = 1, ep: int = 1, moe_tp: int | None = None) -> list[Linear]:
        """ONE routed expert's GEMMs on one GPU (``layers`` = every MoE layer)."""
        if not self.is_moe:
            return []
        h, w, m = self.hidden_size, self.expert_weight_bytes, self.moe_layers
        inter = self.expert_width_per_rank(tp, ep, moe_tp)
        return [Linear("expert.gate_up_proj", 2 * inter, h, w, m), Linear("expert.down_proj", h, inter, w, m)]

    def _vocab_rows(self, tp: int) -> int:
        padded_vocab = _ceil_div(self.vocab_size, VOCAB_PADDING) * VOCAB_PADDING
        return _ceil_div(padded_vocab, tp)

    # --- memory -------------------------------------------------------------------------------
    def weight_bytes(self, tp: int = 1, ep: int = 1, moe_tp: int | None = None) -> int:
        """Bytes of weights on ONE GPU of a ``tp``-way tensor-parallel group (experts split over
        ``ep`` expert-parallel GPUs when ``ep`` > 1).

        Sharded: q/o projections and the MLP (by ``tp``), K/V projections (by KV heads per rank,
        replicated like the KV heads), embedding and LM head (vocabulary padded to a multiple of
        64, then split), experts (by ``ep``, or their width by ``tp``). Replicated: the RMSNorm
        weights and the router.
        """
        self.check_ep(ep)
        h = self.hidden_size
        linears = sum(op.weight_bytes_total for op in self.dense_linears(tp) if op.per == "token")
        experts = self.experts_per_rank(ep) * sum(op.weight_bytes_total for op in self.expert_linears(tp, ep, moe_tp))
        vocab_rows = self._vocab_rows(tp)
        embeddings = vocab_rows * h * (1 if self.tied_embeddings else 2) * self.dtype_bytes
        norms = ((2 * h + self._extra_norm_params()) * self.num_layers + h) * self.dtype_bytes
        sinks = self.heads_per_rank(tp) * self.num_layers * self.dtype_bytes if self.attention_sinks else 0
        return linears + experts + embeddings + norms + sinks

    def kv_layer_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes one token takes in ONE layer on ONE GPU: K and V; MLA: the latent and the
        rope key, once (``kv_lora_rank + qk_rope_head_dim`` elements, on every rank)."""
        if self.is_mla:
            return self.mla_latent_dim * self.kv_dtype_bytes
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * self.kv_dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes one token takes on ONE GPU when every layer holds it (K and V)."""
        return self.kv_layer_bytes_per_token(tp) * self.num_layers

    def kv_capacity_bytes_per_token(self, tp: int = 1, max_model_len: int | None = None) -> float:
        """KV bytes a token of a ``max_model_len``-token request takes on ONE GPU, on average.

        Full-attention layers hold every token; a sliding-window layer holds at most
        ``sliding_window`` of them, i.e. ``min(window, max_model_len) / max_model_len`` of a token
        each. The KV pool then holds as many ``max_model_len`` requests as vLLM reports as its
        "maximum concurrency" (``get_max_concurrency_for_kv_cache_config``, which prices a request
        at ``max_model_len`` per KV cache group). Shorter requests are charged that same average,
        so for them a sliding-window model's pool is optimistic. Without sliding layers this is
        exactly :meth:`kv_bytes_per_token`.
        """
        layer = self.kv_layer_bytes_per_token(tp)
        if not self.num_sliding_layers or not max_model_len or self.sliding_window >= max_model_len:
            return float(self.kv_bytes_per_token(tp))
        share = self.sliding_window / max_model_len
        return layer * (self.num_full_layers + self.num_sliding_layers * share)

    # --- compute ------------------------------------------------------------------------------
    def layer_flops_per_token(self, tp: int = 1) -> float:
        """FLOPs of the decoder layers' linear projections for one token on ONE GPU: 2 (multiply
        + add) × the weights it multiplies (q, k, v, o, the MLP; for an MoE, the router, the
        shared expert and its ``num_experts_per_tok`` routed experts)."""
        total = sum(op.n * op.k * op.layers for op in self.dense_linears(tp) if op.per == "token")
        total += self.num_experts_per_tok * sum(op.n * op.k * op.layers for op in self.expert_linears(tp))
        return 2.0 * total

    def lm_head_flops(self, tp: int = 1) -> float:
        """FLOPs of the LM head (hidden → vocabulary logits) for one sampled position, ONE GPU."""
        return 2.0 * self.hidden_size * -(-self.vocab_size // tp)

    def flops_per_token(self, tp: int = 1) -> float:
        """Linear-layer FLOPs per token on ONE GPU: the decoder layers plus the LM head (the
        familiar ``2 × params`` without the embedding lookup, which is a gather, not a GEMM).

        Counting the LM head for every token is exact for decode tokens and an upper bound for
        prefill tokens (vLLM computes logits only for each sequence's last position; use
        :meth:`layer_flops_per_token` and :meth:`lm_head_flops` to count it per sequence).
        Attention score FLOPs depend on the context and are not included: they are
        ``attention_flops_per_pair(tp)`` per (query token, key token) pair.
        """
        return self.layer_flops_per_token(tp) + self.lm_head_flops(tp)

    def attention_flops_per_pair(self, tp: int = 1) -> float:
        """FLOPs per (query token, cached key token) pair of PREFILL attention, all layers, ONE
        GPU: QK^T and PV each cost 2 × head_dim per head (MLA, non-absorbed: 2 × (qk_nope +
        qk_rope) and 2 × v_head_dim)."""
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            return 2.0 * self.heads_per_rank(tp) * (qk + self.v_head_dim) * self.num_layers
        return 4.0 * self.heads_per_rank(tp) * self.head_dim * self.num_layers

    def decode_attention_flops_per_pair(self, tp: int = 1) -> float:
        """FLOPs per (decode token, cached key) pair, all layers, ONE GPU: as prefill, except MLA's
        absorbed form, multi-query over the latent: 2 × (kv_lora_rank + qk_rope_head_dim) for
        QK^T and 2 × kv_lora_rank for PV per head."""
        if self.is_mla:
            return 2.0 * self.heads_per_rank(tp) * (self.mla_latent_dim + self.kv_lora_rank) * self.num_layers
        return self.attention_flops_per_pair(tp)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a dict, leaving out new fields at their defaults, so the metadata of
        tables written before they existed still compares equal."""
        data = asdict(self)
        del data["context_length"]  # prices nothing: a table serves every context length of its model
        for key, default in _OPTIONAL_DEFAULTS.items():
            if data[key] == default:
                del data[key]
        return data


_OPTIONAL_DEFAULTS = {"num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": 0,
                      "shared_expert_intermediate_size": 0, "sliding_window": 0, "num_sliding_layers": 0,
                      "quantization": None, "kv_cache_dtype": None, "kv_lora_rank": 0, "qk_rope_head_dim": 0,
                      "qk_nope_head_dim": 0, "v_head_dim": 0, "q_lora_rank": 0, "first_k_dense_layers": 0,
                      "expert_quantization": None, "attention_sinks": False, "mtp_layers": 0}
_INLINE_DEFAULTS = {**_OPTIONAL_DEFAULTS, "context_length": 0}


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int,
           context: int, dtype: str = "bf16", head_dim: int | None = None, tied: bool = False) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim or hidden // heads, inter, vocab,
                     dtype, tied, context_length=context)


TINY_CONTEXT = 8192  # the test model's context length (no published config states one)

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32, hidden_size 4096,
        # num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336,
        # vocab_size 128256, torch_dtype bfloat16, tie_word_embeddings false (8,030,261,248 params),
        # max_position_embeddings 8192, no rope_scaling.
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        # meta-llama/Meta-Llama-3-70B config.json: num_hidden_layers 80, hidden_size 8192,
        # num_attention_heads 64, num_key_value_heads 8, intermediate_size 28672,
        # vocab_size 128256, torch_dtype bfloat16, tie_word_embeddings false,
        # max_position_embeddings 8192.
        _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        # meta-llama/Llama-2-7b-hf config.json: num_hidden_layers 32, hidden_size 4096,
        # num_attention_heads 32, num_key_value_heads 32 (no GQA), intermediate_size 11008,
        # vocab_size 32000, torch_dtype float16, max_position_embeddings 4096.
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, dtype="fp16"),
        # mistralai/Mistral-7B-v0.1 config.json: num_hidden_layers 32, hidden_size 4096,
        # num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336,
        # vocab_size 32000, torch_dtype bfloat16. Its 4096-token sliding window is left out of
        # this id (KV memory is counted for the full context, as before the window was modelled);
        # model: {hf_config: ...} of the same config.json models the window. max_position_embeddings 32768.
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
        # Qwen/Qwen2.5-7B config.json: num_hidden_layers 28, hidden_size 3584,
        # num_attention_heads 28, num_key_value_heads 4, intermediate_size 18944,
        # vocab_size 152064, torch_dtype bfloat16, tie_word_embeddings false. (Its q/k/v biases,
        # 28 × 4608 parameters, are left out: under 0.002 % of the weights.) max_position_embeddings
        # 131072 (the base model's; use_sliding_window false).
        _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 131072),
        # The randomly initialised Llama of ../shared/reference/vllm-cpu-runs/ (its `model` field):
        # hidden 256, intermediate 688, 4 layers, 4 heads, 4 KV heads, head_dim 64, vocab 1000,
        # fp32, untied embeddings. It has no config.json of its own: its context length is
        # TINY_CONTEXT (the runs set max_model_len 1024 explicitly).
        _llama("tiny", 4, 256, 4, 4, 688, 1000, TINY_CONTEXT, dtype="fp32", head_dim=64),
    )
}

_SPEC_KEYS = tuple(ModelSpec.__dataclass_fields__)


def get_model(spec: Any) -> ModelSpec:
    """A :class:`ModelSpec` from a registry id, ``ORG/NAME`` (a config.json found locally:
    :mod:`sim.hardware.model_sources`), an inline spec (a mapping or the scenario's
    ``ModelSpecConfig``), ``{"hf_config": PATH, ...}`` (a Hugging Face config.json, with optional
    ``name``, ``quantization`` and ``kv_cache_dtype`` overrides), or a ``ModelSpec`` itself."""
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, str):
        if spec in MODELS:
            return MODELS[spec]
        from sim.hardware.model_sources import find_config, looks_like_hub_name

        if looks_like_hub_name(spec):
            return _from_hub_name(spec, find_config(spec))
        raise CbsimError(f"unknown model {spec!r}{nearest(spec, MODELS)}; known models: "
                         f"{', '.join(MODELS)}, ORG/NAME of a config.json cached locally (`cbsim models`), "
                         f"{{hf_config: PATH}}, or an inline spec (num_layers, hidden_size, ...)")
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump(exclude_none=False)
    if isinstance(spec, dict):
        data = {k: v for k, v in spec.items() if not (k == "hf_config" and v is None)}
        if "hf_config" in data:
            return _from_hf_entry(data)
        data.setdefault("name", "inline")
        if data.get("num_kv_heads") is None and "num_heads" in data:
            data["num_kv_heads"] = data["num_heads"]
        if data.get("head_dim") is None and "hidden_size" in data and data.get("num_heads"):
            data["head_dim"] = data["hidden_size"] // data["num_heads"]
        for key, default in _INLINE_DEFAULTS.items():
            if key in data and data[key] is None:
                data[key] = default
        unknown = sorted(set(data) - set(_SPEC_KEYS))
        if unknown:
            raise CbsimError(f"inline model: unknown key {unknown[0]!r}{nearest(unknown[0], _SPEC_KEYS)}; "
                             f"allowed keys: {', '.join(_SPEC_KEYS)} (or hf_config: PATH)")
        try:
            return ModelSpec(**data)
        except TypeError as exc:
            raise CbsimError(f"inline model: {exc}") from None
    raise CbsimError(f"model must be an id ({', '.join(MODELS)}), ORG/NAME, {{hf_config: PATH}} or an inline "
                     f"spec, got {spec!r}")


class ModelNameResolved(UserWarning):
    """``model: ORG/NAME`` was served by the config.json of another name of the same architecture."""


def _from_hub_name(name: str, source: Any) -> ModelSpec:
    """The spec of ``ORG/NAME`` from the config ``source`` found for it; when that config carries another
    name (an Instruct served by its base, a case difference), one warning says which config served,
    and an FP8 name served by an unquantized config is priced as FP8 (the architecture is the same;
    the weights are stored in 8 bits)."""
    if source.name == name:
        return from_hf_config(source.path, name=name)
    from sim.hardware.model_names import name_key

    spec = from_hf_config(source.path, name=name)
    note = ""
    if name_key(name).fp8 and spec.quantization is None:
        spec = from_hf_config(source.path, name=name, quantization="fp8")
        note = "; priced with quantization fp8, as the name says"
    warnings.warn(f"model {name!r}: served by the config.json of {source.name!r} ({source.origin}), the same "
                  f"architecture under another name{note}; give model: {{hf_config: PATH}} to use another",
                  ModelNameResolved, stacklevel=1)  # one location: said once per process
    return spec


_HF_OVERRIDES = ("name", "quantization", "kv_cache_dtype")


def _from_hf_entry(data: dict[str, Any]) -> ModelSpec:
    extra = sorted(k for k, v in data.items() if k not in ("hf_config", *_HF_OVERRIDES) and v is not None)
    if extra:
        raise CbsimError(f"model: with hf_config only {', '.join(_HF_OVERRIDES)} may be given besides it, got "
                         f"{extra[0]!r}; the rest comes from the config.json")
    overrides = {k: data[k] for k in _HF_OVERRIDES if data.get(k) is not None}
    return from_hf_config(data["hf_config"], **overrides)


def from_hf_config(path: Any, name: str | None = None, **overrides: Any) -> ModelSpec:
    """The spec a Hugging Face ``config.json`` (file or folder) describes; ``overrides`` replace
    fields (``quantization``, ``kv_cache_dtype``)."""
    from pathlib import Path

    from sim.hardware.hf_config import read_config_file, spec_fields

    p = Path(str(path)).expanduser()
    fields = spec_fields(read_config_file(p), name or _name_from_path(p), where=str(p))
    fields.update(overrides)
    return ModelSpec(**fields)


def _name_from_path(p) -> str:
    """A readable name for a config.json: its folder (``.../Llama-3.1-8B/config.json``), or the
    file's stem for a differently named file; HF cache snapshots are named by their repo."""
    if p.name == "config.json" or p.is_dir():
        folder = p if p.is_dir() else p.parent
        parts = folder.parts
        if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
            return parts[-3].removeprefix("models--").replace("--", "/", 1)
        return folder.name or "hf-config"
    return p.stem
