"""A Llama-style decoder at a real model's dimensions, with random weights, for timing.

Step latency depends on the shapes of the matrices a forward pass multiplies and the KV it
reads, not on what the weights have learned. So calib builds the architecture of a
``sim.hardware.models`` spec (RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU MLP,
LM head; Touvron et al., "LLaMA", 2023) at its real sizes and fills it with seeded random
weights: nothing is downloaded, and any listed model can be timed.

Tensor parallelism: a ``tp``-way group runs one *shard* per GPU (Shoeybi et al., "Megatron-LM",
2019, as vLLM does it), and a step's time is one shard's time plus the all-reduces. calib times
one shard: query heads and the MLP width are divided by ``tp``; KV heads are divided by ``tp``
when there are at least ``tp`` of them, and otherwise each GPU holds one KV head, *replicated*
over ``tp / num_kv_heads`` GPUs (so per-GPU KV memory stops shrinking past ``tp =
num_kv_heads``); the vocabulary is padded to a multiple of 64 and split, so the embedding and LM
head hold ``ceil(padded_vocab / tp)`` rows. All-reduce time is not part of a shard's forward.
The split rules are ``sim.hardware.models.ModelSpec``'s (``check_tp``, ``kv_heads_per_rank``,
``weight_bytes``), so the weights built here take exactly the bytes the simulator assumes.

Weight scale: every projection is drawn with std ``1/sqrt(fan_in)`` (unit-variance outputs
for unit-variance inputs), and the two projections that write into the residual stream (attention
output, MLP down) are further scaled by ``1/sqrt(2 * num_layers)`` (as GPT-2 does), so the
residual stream stays O(1) through any depth and bf16 activations stay finite.

Attention is pluggable: :meth:`LlamaModel.forward` calls ``attend(layer, q, k, v)``, which a
paged engine implements by writing K/V into its block pool and running paged attention
(:mod:`calib.step`), and :meth:`LlamaModel.forward_dense` implements with plain causal attention
over one sequence, no cache (the ground truth the paged path is tested against).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
RMS_EPS = 1e-5
# Random weights carry no positional training, so the rotary base only has to be a plausible
# value: 10000 (Su et al., RoFormer; Llama 2). It does not change any shape or timing.
ROPE_THETA = 10000.0

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ShardShape:
    """The dimensions ONE GPU's shard of a model holds under ``tp``-way tensor parallelism."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int  # query heads on this GPU
    num_kv_heads: int  # KV heads on this GPU (1 when replicated)
    head_dim: int
    intermediate_size: int  # MLP width on this GPU
    vocab_rows: int  # embedding / LM-head rows on this GPU (padded vocabulary / tp)
    vocab_size: int  # real token ids this shard can emit: min(vocab_rows, model vocabulary)
    tied_embeddings: bool
    tp: int
    kv_replicas: int  # GPUs holding each KV head: tp / num_kv_heads when kv heads < tp, else 1

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def shard_shape(spec: Any, tp: int = 1, num_layers: int | None = None) -> ShardShape:
    """One GPU's shard of ``spec`` (a ``sim.hardware.models`` id or ``ModelSpec``) under ``tp``.

    ``num_layers`` overrides the depth (profiling times one layer; tests stay small). Raises
    ``CbsimError`` when ``tp`` cannot split the model (see ``ModelSpec.check_tp``).
    """
    from sim.errors import CbsimError
    from sim.hardware.models import VOCAB_PADDING, get_model

    spec = get_model(spec)
    spec.check_tp(tp)
    layers = spec.num_layers if num_layers is None else num_layers
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise CbsimError(f"num_layers must be a positive integer, got {num_layers!r}")
    padded_vocab = -(-spec.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    vocab_rows = -(-padded_vocab // tp)
    kv_heads = spec.kv_heads_per_rank(tp)
    return ShardShape(
        name=spec.name,
        num_layers=layers,
        hidden_size=spec.hidden_size,
        num_heads=spec.heads_per_rank(tp),
        num_kv_heads=kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=-(-spec.intermediate_size // tp),
        vocab_rows=vocab_rows,
        vocab_size=min(vocab_rows, spec.vocab_size),
        tied_embeddings=spec.tied_embeddings,
        tp=tp,
        kv_replicas=max(1, tp // spec.num_kv_heads),
    )


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in TORCH_DTYPES:
        from sim.errors import CbsimError, nearest

        raise CbsimError(f"dtype {name!r} is not one of {', '.join(TORCH_DTYPES)}{nearest(name, TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019), statistics in fp32 as engines compute them."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return xf.to(x.dtype) * weight


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float = ROPE_THETA) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[T, head_dim / 2]`` (fp32) for absolute ``positions`` [T]."""
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, heads, head_dim] by its positions' angles (rotate-half form, as Llama)."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


class _Init:
    """Seeded normal draws on the target device, in creation order."""

    def __init__(self, dtype: torch.dtype, device: torch.device, seed: int) -> None:
        self.dtype, self.device = dtype, device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def normal(self, shape: tuple[int, ...], std: float) -> torch.nn.Parameter:
        t = torch.empty(shape, dtype=self.dtype, device=self.device)
        t.normal_(0.0, std, generator=self.gen)
        return torch.nn.Parameter(t, requires_grad=False)

    def ones(self, size: int) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.ones(size, dtype=self.dtype, device=self.device), requires_grad=False)


class DecoderLayer(torch.nn.Module):
    """One Llama block with fused projections, as engines lay them out: [q|k|v] and [gate|up]."""

    def __init__(self, shape: ShardShape, init: _Init) -> None:
        super().__init__()
        h, inter = shape.hidden_size, shape.intermediate_size
        residual_scale = 1.0 / math.sqrt(2 * shape.num_layers)
        self.shape = shape
        self.input_norm = init.ones(h)
        self.qkv_proj = init.normal((shape.q_size + 2 * shape.kv_size, h), 1.0 / math.sqrt(h))
        self.o_proj = init.normal((h, shape.q_size), residual_scale / math.sqrt(shape.q_size))
        self.post_attention_norm = init.ones(h)
        self.gate_up_proj = init.normal((2 * inter, h), 1.0 / math.sqrt(h))
        self.down_proj = init.normal((h, inter), residual_scale / math.sqrt(inter))

    def forward(self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        s = self.shape
        tokens = x.shape[0]
        qkv = F.linear(rms_norm(x, self.input_norm), self.qkv_proj)
        q, k, v = qkv.split([s.q_size, s.kv_size, s.kv_size], dim=-1)
        q = apply_rope(q.view(tokens, s.num_heads, s.head_dim), cos, sin)
        k = apply_rope(k.view(tokens, s.num_kv_heads, s.head_dim), cos, sin)
        v = v.view(tokens, s.num_kv_heads, s.head_dim)
        attn = attend(layer, q, k, v)
        x = x + F.linear(attn.reshape(tokens, s.q_size), self.o_proj)
        gate, up = F.linear(rms_norm(x, self.post_attention_norm), self.gate_up_proj).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.down_proj)


class LlamaModel(torch.nn.Module):
    """One tensor-parallel shard of a Llama-style decoder with seeded random weights.

    Inputs are *packed*: ``input_ids`` and ``positions`` are ``[T]`` over all requests of a step.
    """

    def __init__(self, shape: ShardShape, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", seed: int = 0) -> None:
        super().__init__()
        device = torch.device(device)
        init = _Init(dtype, device, seed)
        self.shape = shape
        self.dtype = dtype
        self.scale = shape.head_dim ** -0.5
        self.embed = init.normal((shape.vocab_rows, shape.hidden_size), 1.0)
        self.layers = torch.nn.ModuleList(DecoderLayer(shape, init) for _ in range(shape.num_layers))
        self.final_norm = init.ones(shape.hidden_size)
        if shape.tied_embeddings:
            self.lm_head = self.embed
        else:
            self.lm_head = init.normal((shape.vocab_rows, shape.hidden_size), 1.0 / math.sqrt(shape.hidden_size))

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def weight_bytes(self) -> int:
        """Bytes of this shard's weights (a tied LM head counted once)."""
        seen, total = set(), 0
        for p in self.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
        return total

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.shape.tp > 1:  # a vocabulary shard: any id maps onto one of its rows (same work)
            input_ids = input_ids.remainder(self.shape.vocab_rows)
        return F.embedding(input_ids, self.embed)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` after the final norm, attention delegated to ``attend``."""
        x = self.embed_tokens(input_ids)
        cos, sin = rope_tables(positions, self.shape.head_dim)
        for index, layer in enumerate(self.layers):
            x = layer(index, x, cos, sin, attend)
        return rms_norm(x, self.final_norm)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits over the token ids this shard can emit (padding rows of the vocabulary dropped)."""
        return F.linear(hidden, self.lm_head)[:, : self.shape.vocab_size].float()

    def dense_attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Plain causal attention over one whole sequence (no cache), in fp32."""
        group = q.shape[1] // k.shape[1]
        qf = q.float().transpose(0, 1)
        kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
        vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
        out = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=self.scale)
        return out.transpose(0, 1).to(q.dtype)

    @torch.inference_mode()
    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[L, vocab]`` for every position of ONE sequence, run without any cache."""
        positions = torch.arange(input_ids.shape[0], device=input_ids.device)
        return self.compute_logits(self.forward(input_ids, positions, self.dense_attend))


def build_model(spec: Any, *, tp: int = 1, dtype: str | torch.dtype | None = None,
                num_layers: int | None = None, device: str | torch.device = "cpu", seed: int = 0) -> LlamaModel:
    """Build one GPU's shard of ``spec`` (id or ``ModelSpec``) with random weights.

    ``dtype`` defaults to the spec's own (``bf16`` for the Llama-3 family, ``fp32`` for ``tiny``);
    ``num_layers`` overrides the depth. Weights are drawn from a generator on ``device`` seeded
    with ``seed``: the same seed gives the same weights on the same kind of device.
    """
    from sim.hardware.models import get_model

    spec = get_model(spec)
    shape = shard_shape(spec, tp=tp, num_layers=num_layers)
    model = LlamaModel(shape, dtype=torch_dtype(dtype or spec.dtype), device=device, seed=seed)
    return model.eval()
