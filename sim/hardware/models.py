"""Model specs: the few numbers of a decoder-only transformer that decide memory and compute.

The simulator never runs a model; it needs how many bytes its weights take (what is left of a
GPU for the KV cache), how many KV bytes each token costs (how many blocks fit), and how many
FLOPs a token costs (the roofline and MFU). All of that follows from the architecture
hyper-parameters below, read from each model's published ``config.json``.

Tensor parallelism (Megatron-style, as vLLM does it) splits the attention heads, the MLP and the
vocabulary across ``tp`` GPUs; layer norms are replicated. KV heads are split too; when a model
has fewer KV heads than GPUs, vLLM *replicates* each KV head over ``tp / num_kv_heads`` GPUs so
that every GPU holds exactly one (``tp`` must then be a multiple of ``num_kv_heads``). Query heads
must divide evenly by ``tp``, as in vLLM; anything else is an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sim.errors import CbsimError, nearest

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# vLLM pads the vocabulary of its (vocab-parallel) embedding and LM head to a multiple of 64
# (``DEFAULT_VOCAB_PADDING_SIZE`` in vllm/model_executor/layers/vocab_parallel_embedding.py) and
# then splits it evenly over the tensor-parallel ranks; the padded rows take memory too.
VOCAB_PADDING = 64


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A Llama-style decoder (RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP)."""

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

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CbsimError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise CbsimError(f"model {self.name!r}: dtype {self.dtype!r} is not one of "
                             f"{', '.join(DTYPE_BYTES)}{nearest(self.dtype, DTYPE_BYTES)}")
        if self.num_heads % self.num_kv_heads:
            raise CbsimError(f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) (grouped-query attention)")

    # --- sizes --------------------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_size(self) -> int:
        """Width of the query projection (num_heads × head_dim); not always hidden_size."""
        return self.num_heads * self.head_dim

    def num_params(self) -> int:
        """Parameters of the whole (unsharded) model, as the checkpoint counts them."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        per_layer = (
            h * self.q_size  # q_proj
            + 2 * h * kv  # k_proj, v_proj
            + self.q_size * h  # o_proj
            + 3 * h * self.intermediate_size  # gate_proj, up_proj, down_proj
            + 2 * h  # input and post-attention RMSNorm
        )
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return embeddings + self.num_layers * per_layer + h  # + final norm

    # --- tensor parallelism -------------------------------------------------------------------
    def check_tp(self, tp: int) -> None:
        """Raise unless ``tp`` GPUs can split this model the way vLLM does."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise CbsimError(f"tensor_parallel must be a positive integer, got {tp!r}")
        if self.num_heads % tp:
            raise CbsimError(f"model {self.name!r}: tensor_parallel={tp} does not divide its "
                             f"{self.num_heads} attention heads; pick a divisor of {self.num_heads}")
        if self.num_kv_heads < tp and tp % self.num_kv_heads:
            raise CbsimError(f"model {self.name!r}: tensor_parallel={tp} is neither a divisor nor a multiple "
                             f"of its {self.num_kv_heads} KV heads, so KV heads cannot be replicated evenly")
        if self.num_kv_heads >= tp and self.num_kv_heads % tp:
            raise CbsimError(f"model {self.name!r}: tensor_parallel={tp} does not divide its "
                             f"{self.num_kv_heads} KV heads")

    def heads_per_rank(self, tp: int = 1) -> int:
        self.check_tp(tp)
        return self.num_heads // tp

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads each GPU stores: ``num_kv_heads / tp``, or 1 when KV heads are replicated."""
        self.check_tp(tp)
        return max(1, self.num_kv_heads // tp)

    def weight_bytes(self, tp: int = 1) -> int:
        """Bytes of weights on ONE GPU of a ``tp``-way tensor-parallel group.

        Sharded: q/o projections and the MLP (by ``tp``), K/V projections (by KV heads per rank,
        replicated like the KV heads), embedding and LM head (vocabulary padded to a multiple of
        64, then split). Replicated: the RMSNorm weights.
        """
        h = self.hidden_size
        kv = self.kv_heads_per_rank(tp) * self.head_dim
        inter = -(-self.intermediate_size // tp)
        per_layer = 2 * h * (self.q_size // tp) + 2 * h * kv + 3 * h * inter + 2 * h
        padded_vocab = -(-self.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
        vocab_rows = -(-padded_vocab // tp)
        embeddings = vocab_rows * h * (1 if self.tied_embeddings else 2)
        return (embeddings + self.num_layers * per_layer + h) * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes one token takes on ONE GPU: K and V, every layer."""
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * self.dtype_bytes * self.num_layers

    # --- compute ------------------------------------------------------------------------------
    def layer_flops_per_token(self, tp: int = 1) -> float:
        """FLOPs of the decoder layers' linear projections for one token on ONE GPU:
        2 (multiply + add) × the weights it multiplies (q, k, v, o, gate, up, down)."""
        h = self.hidden_size
        kv = self.kv_heads_per_rank(tp) * self.head_dim
        inter = -(-self.intermediate_size // tp)
        return 2.0 * self.num_layers * (2 * h * (self.q_size // tp) + 2 * h * kv + 3 * h * inter)

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
        """FLOPs per (query token, cached key token) pair, all layers, ONE GPU: QK^T and PV
        each cost 2 × head_dim per head."""
        return 4.0 * self.heads_per_rank(tp) * self.head_dim * self.num_layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int,
           dtype: str = "bf16", head_dim: int | None = None, tied: bool = False) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim or hidden // heads, inter, vocab,
                     dtype, tied)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32, hidden_size 4096,
        # num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336,
        # vocab_size 128256, torch_dtype bfloat16, tie_word_embeddings false (8,030,261,248 params).
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256),
        # meta-llama/Meta-Llama-3-70B config.json: num_hidden_layers 80, hidden_size 8192,
        # num_attention_heads 64, num_key_value_heads 8, intermediate_size 28672,
        # vocab_size 128256, torch_dtype bfloat16, tie_word_embeddings false.
        _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256),
        # meta-llama/Llama-2-7b-hf config.json: num_hidden_layers 32, hidden_size 4096,
        # num_attention_heads 32, num_key_value_heads 32 (no GQA), intermediate_size 11008,
        # vocab_size 32000, torch_dtype float16.
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, dtype="fp16"),
        # mistralai/Mistral-7B-v0.1 config.json: num_hidden_layers 32, hidden_size 4096,
        # num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336,
        # vocab_size 32000, torch_dtype bfloat16. (Its 4096-token sliding window is not modelled:
        # KV memory is counted for the full context, which is what vLLM's paged cache allocates
        # for models without a hybrid allocator.)
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000),
        # Qwen/Qwen2.5-7B config.json: num_hidden_layers 28, hidden_size 3584,
        # num_attention_heads 28, num_key_value_heads 4, intermediate_size 18944,
        # vocab_size 152064, torch_dtype bfloat16, tie_word_embeddings false. (Its q/k/v biases,
        # 28 × 4608 parameters, are left out: under 0.002 % of the weights.)
        _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064),
        # The randomly initialised Llama of ../shared/reference/vllm-cpu-runs/ (its `model` field):
        # hidden 256, intermediate 688, 4 layers, 4 heads, 4 KV heads, head_dim 64, vocab 1000,
        # fp32, untied embeddings.
        _llama("tiny", 4, 256, 4, 4, 688, 1000, dtype="fp32", head_dim=64),
    )
}


def get_model(spec: Any) -> ModelSpec:
    """A :class:`ModelSpec` from a registry id, an inline spec (a mapping or the scenario's
    ``ModelSpecConfig``), or a ``ModelSpec`` itself."""
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, str):
        if spec in MODELS:
            return MODELS[spec]
        raise CbsimError(f"unknown model {spec!r}{nearest(spec, MODELS)}; known models: "
                         f"{', '.join(MODELS)} (or give an inline spec: num_layers, hidden_size, ...)")
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump()
    if isinstance(spec, dict):
        data = dict(spec)
        data.setdefault("name", "inline")
        if data.get("num_kv_heads") is None and "num_heads" in data:
            data["num_kv_heads"] = data["num_heads"]
        if data.get("head_dim") is None and "hidden_size" in data and data.get("num_heads"):
            data["head_dim"] = data["hidden_size"] // data["num_heads"]
        known = set(ModelSpec.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise CbsimError(f"inline model: unknown key {unknown[0]!r}{nearest(unknown[0], known)}; "
                             f"allowed keys: {', '.join(ModelSpec.__dataclass_fields__)}")
        try:
            return ModelSpec(**data)
        except TypeError as exc:
            raise CbsimError(f"inline model: {exc}") from None
    raise CbsimError(f"model must be an id ({', '.join(MODELS)}) or an inline spec, got {spec!r}")
