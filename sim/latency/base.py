"""The latency interface and the step features every backend prices.

A step's cost depends on its composition (DESIGN.md, "Latency model"): tokens through the linear
layers, prefill attention work (query length × context), decode attention reads (sum of context
lengths), the batch size, and a fixed per-step overhead. :func:`step_shape` reduces a plan to those
numbers once, so every backend prices the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import StepPlan


@dataclass(slots=True)
class StepShape:
    num_tokens: int  # through the linear layers, padding included
    num_seqs: int  # sequences scheduled in the batch
    prefill_tokens: int
    decode_tokens: int
    prefill_attn: float  # sum over prefill chunks of n * (context + (n + 1) / 2): query-key pairs
    decode_ctx: int  # sum over decodes of the keys each decode token reads (context + 1)
    kv_tokens_read: int  # every cached token attention reads, prefill context included
    padding_tokens: int = 0  # static batching's dummy tokens (in num_tokens too)
    padding_ctx: int = 0  # the context those dummies attend to (in decode_ctx too)
    # speculative decoding: draft tokens verified (in num_tokens too); the LM head computes
    # logits at each of them besides one per sequence (vLLM's rejection sampler needs them all)
    spec_tokens: int = 0


def step_shape(plan: StepPlan) -> StepShape:
    prefill_tokens = decode_tokens = decode_ctx = kv_read = 0
    prefill_attn = 0.0
    for n, c in zip(plan.num_new_tokens, plan.context):
        if n == 1 and c > 0:
            decode_tokens += 1
            decode_ctx += c + 1
        else:
            prefill_tokens += n
            prefill_attn += n * (c + (n + 1) / 2)
        kv_read += c + n
    # padding (static batching): dummy tokens still go through every layer
    return StepShape(
        num_tokens=prefill_tokens + decode_tokens + plan.padding_tokens,
        num_seqs=len(plan.scheduled),
        prefill_tokens=prefill_tokens,
        decode_tokens=decode_tokens,
        prefill_attn=prefill_attn,
        decode_ctx=decode_ctx + plan.padding_context,
        kv_tokens_read=kv_read + plan.padding_context,
        padding_tokens=plan.padding_tokens,
        padding_ctx=plan.padding_context,
    )


class LatencyModel:
    """Prices a step (seconds) and a swap; reports FLOPs and bytes for MFU/MBU."""

    name = "base"
    # attention DP: seconds of linear(T) that are the experts over every rank's tokens, as a
    # function of T per rank (sim.lockstep re-prices them over the group); None: not separable
    moe_group = None

    def __init__(self, model, gpu, tensor_parallel: int, block_size: int) -> None:
        self.model = model
        self.gpu = gpu
        self.tp = tensor_parallel
        self.block_size = block_size
        self.kv_bytes_per_token = model.kv_bytes_per_token(tensor_parallel)
        self.kv_bytes_per_block = self.kv_bytes_per_token * block_size
        # per-step constants, computed once (the hot path prices hundreds of thousands of steps)
        # per decode token (one token = one sequence: the LM head included) ...
        self._flops_per_token = model.flops_per_token(tensor_parallel)
        # ... and split, for steps with prefill chunks: the LM head runs once per sequence (vLLM
        # computes logits only at each scheduled request's last position), as the roofline counts
        # it, so MFU means the same on every backend
        self._layer_flops_per_token = model.layer_flops_per_token(tensor_parallel)
        self._lm_head_flops = model.lm_head_flops(tensor_parallel)
        self._attn_flops_per_pair = (model.attention_flops_per_pair(tensor_parallel) if getattr(model, "is_mla", False)
                                     else 4.0 * model.num_heads * model.head_dim / tensor_parallel * model.num_layers)
        self._weight_bytes = model.weight_bytes(tensor_parallel)
        self._act_bytes_per_token = model.hidden_size * model.dtype_bytes * model.num_layers * 4

    def step_time(self, plan: StepPlan) -> float:
        return self.price(step_shape(plan), plan)[0]

    def price(self, shape: StepShape, plan: StepPlan | None = None) -> tuple[float, float, float]:
        """(seconds, FLOPs, bytes) of one step: what the engine spends and what MFU/MBU count."""
        raise NotImplementedError

    def swap_time(self, blocks: int) -> float:
        """One-way copy of ``blocks`` KV blocks over PCIe."""
        if blocks <= 0:
            return 0.0
        return blocks * self.kv_bytes_per_block / self.gpu.pcie_bandwidth

    # --- cost accounting for utilization (same physics for every backend) -------------------
    def useful_flops(self, shape: StepShape, flops: float) -> float:
        """The FLOPs MFU counts: the model's useful work (PaLM's definition), so the padding a
        static batch computes costs time but is not counted as utilization."""
        if not shape.padding_tokens:
            return flops
        return flops - self._flops_per_token * shape.padding_tokens - self._attn_flops_per_pair * shape.padding_ctx

    def recompute_flops(self, tokens: int, pairs: float) -> float:
        """FLOPs of ``tokens`` recomputed tokens whose attention covers ``pairs`` query-key pairs
        (:mod:`sim.metrics.recompute`): step time, but not useful work, so MFU leaves them out (the LM
        head runs for the sequence's new token, which is useful work)."""
        return self._layer_flops_per_token * tokens + self._attn_flops_per_pair * pairs

    def step_flops_bytes(self, shape: StepShape) -> tuple[float, float]:
        """FLOPs and HBM bytes of one step on one GPU (a TP shard)."""
        n = shape.num_tokens
        # linear layers, plus attention: QK^T and PV, 2 FLOPs per multiply-add, per layer and
        # per query-key pair
        flops = (self._layer_flops_per_token * n + self._lm_head_flops * (shape.num_seqs + shape.spec_tokens)
                 + self._attn_flops_per_pair * (shape.prefill_attn + shape.decode_ctx))
        # weights once per step, KV read (context) and written (new tokens), activations
        bytes_ = (self._weight_bytes + self.kv_bytes_per_token * (shape.kv_tokens_read + n)
                  + self._act_bytes_per_token * n)
        return flops, bytes_
