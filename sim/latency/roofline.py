"""Roofline step time, operator by operator: each operator at the larger of its compute time and
its memory time, summed over operators, plus the tensor-parallel communication and a fixed overhead.

Why per operator: a step is a sequence of kernels, and each one is bound by compute or by memory
on its own. One max over the whole step (what this model did before) lets a decode batch's KV
reads hide a prefill chunk's GEMMs: a 512-token chunk added to 128 decodes at 4k context then
costs 0.2 ms, where the chunk's GEMMs alone take several (issue #17, item 6).

Operators of one step on ONE GPU (shapes from :meth:`ModelSpec.dense_linears` and
:meth:`ModelSpec.expert_linears`, already sharded by tensor parallelism):

- each linear layer (q/k/v, o, MLP or shared expert, router; every layer): ``2·T·n·k`` FLOPs for
  ``T`` tokens, and its weights (``n·k`` × bytes per weight, 1 under fp8) plus its input and output
  activations in bytes. FP8 (w8a8) layers run at the GPU's FP8 rate where it has one;
- routed experts (MoE): the ``T·top_k`` routed rows' FLOPs, and the weights of only the experts
  those rows hit: :func:`sim.hardware.moe.expected_active_experts` (random routing; with expert
  parallelism, this GPU's ``E/ep`` experts over the tokens of every data-parallel rank);
- the LM head, for one row per sequence (vLLM computes logits only where it samples), plus one per
  draft token a speculative step verifies (``StepShape.spec_tokens``);
- prefill attention (``4·heads·head_dim`` FLOPs per query-key pair per layer; KV of the context
  read) and decode attention (the same per pair; every cached key read), sliding-window layers
  reading at most their window; the step's new K and V written. Multi-head latent attention
  (:mod:`sim.hardware.models`, DeepSeek/Kimi): prefill is multi-head over up-projected keys
  (``2·(qk_nope + qk_rope + v)`` per head per pair) after ``kv_b_proj`` up-projects the cached
  prefix it attends to (a GEMM of ``prefix`` rows, at the linear layers' rate); decode is the
  absorbed multi-query form over the latent (``2·(2·kv_lora_rank + qk_rope)`` per head per pair)
  reading ``kv_lora_rank + qk_rope_head_dim`` elements per cached token and layer;
- element-wise work (norms, rotary, activation function, residual adds): memory-bound, four
  ``hidden``-wide reads and writes per token per layer;
- communication (not overlapped with compute, as in vLLM's default): with tensor parallelism two
  all-reduces per layer (after attention and after the MLP) of ``T × hidden`` activations, each
  ``link_latency + 2(p−1)/p · bytes / link_bandwidth`` (ring all-reduce); with data-parallel
  attention and expert parallelism an all-gather and a reduce-scatter per layer across the
  ``dp`` ranks. The summary reports this time as ``comm_s``.

Efficiency factors, set per scenario (``latency.compute_efficiency``, ``latency.memory_efficiency``):
- ``compute_efficiency`` 0.8: the kernel database of NVIDIA AIConfigurator measures the GEMMs of a
  1k-token Llama-3-8B prefill on H100 at 790-900 TFLOP/s, 0.80-0.91 of the 989 TFLOP/s peak
  (issue #17); 0.8 is the low end, as smaller GEMMs run slower;
- ``memory_efficiency`` 0.8: AIConfigurator's ``mem_bw_empirical_scaling_factor`` for every GPU
  (aiconfigurator_core/systems/*.yaml);
- ``overhead_s`` 2 ms: host-side scheduling, input preparation, sampling and launches per step.
"""

from __future__ import annotations

import numpy as np

from sim.hardware.moe import expected_active_experts
from sim.latency.base import LatencyModel

COMPUTE_EFFICIENCY = 0.8
MEMORY_EFFICIENCY = 0.8
OVERHEAD_S = 2e-3


class RooflineLatency(LatencyModel):
    name = "roofline"

    def __init__(
        self,
        model,
        gpu,
        tensor_parallel: int,
        block_size: int,
        compute_efficiency: float = COMPUTE_EFFICIENCY,
        memory_efficiency: float = MEMORY_EFFICIENCY,
        overhead_s: float = OVERHEAD_S,
        data_parallel: int = 1,
        expert_parallel: int = 1,
    ) -> None:
        super().__init__(model, gpu, tensor_parallel, block_size)
        self.compute_rate = gpu.peak_flops * compute_efficiency
        self.memory_rate = gpu.hbm_bandwidth * memory_efficiency
        fp8 = getattr(gpu, "fp8_flops", 0.0) or gpu.peak_flops  # no FP8 tensor cores: weight-only FP8
        self.linear_rate = (fp8 if model.quantization == "fp8" else gpu.peak_flops) * compute_efficiency
        self.overhead_s = overhead_s
        self.dp, self.ep = data_parallel, expert_parallel
        tp, a = tensor_parallel, model.dtype_bytes
        # dense linears: (FLOPs per row, weight bytes, activation bytes per row, compute rate, per sequence?)
        self._linears = []
        for op in model.dense_linears(tp):
            rate = self.linear_rate if op.weight_bytes < a else self.compute_rate
            self._linears.append((2.0 * op.n * op.k * op.layers, float(op.weight_bytes_total),
                                  float((op.n + op.k) * a * op.layers), rate, op.per == "sequence"))
        experts = model.expert_linears(tp, expert_parallel, tp * data_parallel)
        self._expert_flops_per_row = 2.0 * sum(op.n * op.k * op.layers for op in experts)
        self._expert_bytes = float(sum(op.weight_bytes_total for op in experts))  # one expert, all layers
        self._expert_act_per_row = float(sum((op.n + op.k) * a * op.layers for op in experts))
        self._local_experts = model.experts_per_rank(expert_parallel)
        self._attn_pair_flops = model.attention_flops_per_pair(tp)
        self._decode_pair_flops = model.decode_attention_flops_per_pair(tp)
        self._context_up_flops = model.mla_context_flops_per_key(tp)  # MLA prefill: kv_b_proj per cached key
        self._kv_layer = float(model.kv_layer_bytes_per_token(tp))
        self._sliding = model.num_sliding_layers
        self._window = model.sliding_window
        self._elementwise_per_token = float(model.hidden_size * a * model.num_layers * 4)
        self._kv_write_per_token = float(model.kv_bytes_per_token(tp))
        link = getattr(gpu, "gpu_link_bandwidth", gpu.pcie_bandwidth)
        lat = getattr(gpu, "link_latency_s", 10e-6)
        row = model.hidden_size * a * model.num_layers  # one token's hidden state, every layer
        # two all-reduces per layer: latency + 2(p-1)/p * bytes / link
        self._ar_fixed = 2 * model.num_layers * lat if tp > 1 else 0.0
        self._ar_per_token = 2 * 2 * (tp - 1) / tp * row / link if tp > 1 else 0.0
        # DP attention (EP or one tp x dp MoE group): all-gather before and reduce-scatter after the
        # experts, over dp ranks
        moe_dp = model.is_moe and data_parallel > 1
        self._a2a_fixed = 2 * model.num_layers * lat if moe_dp else 0.0
        self._a2a_per_token = 2 * (data_parallel - 1) * row / link if moe_dp else 0.0
        self._fixed_by_b: dict[int, tuple[float, float, float, float]] = {}
        if self._sliding:
            self.price_decodes = None
            self.decode_steps = None
            self.decode_step_time = None  # windowed reads need each sequence's context: price step by step

    # --- one step -----------------------------------------------------------------------------
    def price(self, shape, plan=None):
        b = shape.num_tokens
        if (b and b == shape.decode_tokens == shape.num_seqs and not shape.spec_tokens
                and not shape.padding_tokens and shape.kv_tokens_read == shape.decode_ctx and not self._sliding):
            return self.decode_step(b, shape.decode_ctx)  # a pure-decode step: the same sums, fewer of them
        t, flops, bytes_, _ = self.breakdown(shape, plan)
        return t, self.useful_flops(shape, flops), bytes_

    def useful_flops(self, shape, flops: float) -> float:
        """The step's FLOPs less what its padding computed, counted the way :meth:`breakdown`
        charges it: padding rows go through the per-token operators and the experts, never through
        the per-sequence ones (the LM head runs once per real sequence)."""
        if not shape.padding_tokens:
            return flops
        return flops - self._row_flops() * shape.padding_tokens - self._decode_pair_flops * shape.padding_ctx

    def recompute_flops(self, tokens: int, pairs: float) -> float:
        """FLOPs of recomputed tokens as :meth:`breakdown` charged them (per-token operators, experts
        and attention; the LM head runs for the sequence's new token, which is useful work)."""
        return self._row_flops() * tokens + self._attn_pair_flops * pairs

    def _row_flops(self) -> float:
        """FLOPs one token row costs in the per-token operators and the routed experts."""
        per_token = sum(f for f, _w, _act, _rate, per_seq in self._linears if not per_seq)
        if self._local_experts:
            m = self.model
            per_token += self._expert_flops_per_row * m.num_experts_per_tok * self._local_experts / m.num_experts
        return per_token

    def comm_time(self, shape) -> float:
        """Seconds of tensor- and expert-parallel communication in a step (part of its time)."""
        n = shape.num_tokens
        if not n:
            return 0.0
        return self._ar_fixed + self._ar_per_token * n + self._a2a_fixed + self._a2a_per_token * n

    def comm_seconds(self, tokens: np.ndarray) -> np.ndarray:
        """:meth:`comm_time` of many steps at once, from each step's token count."""
        tokens = np.asarray(tokens, dtype=np.float64)
        per_token = self._ar_per_token + self._a2a_per_token
        return np.where(tokens > 0, self._ar_fixed + self._a2a_fixed + per_token * tokens, 0.0)

    def breakdown(self, shape, plan=None) -> tuple[float, float, float, float]:
        """(seconds, FLOPs, bytes, communication seconds) of one step."""
        n, seqs = shape.num_tokens, shape.num_seqs
        cr, mr = self.compute_rate, self.memory_rate
        t = flops = bytes_ = 0.0
        seq_rows = seqs + shape.spec_tokens  # rows the per-sequence operators (LM head) compute
        for f, w, act, rate, per_seq in self._linears:
            rows = seq_rows if per_seq else n
            if not rows:
                continue
            of, ob = f * rows, w + act * rows
            t += max(of / rate, ob / mr)
            flops += of
            bytes_ += ob
        if self._local_experts and n:
            of, ob = self._experts(n)
            t += max(of / self.linear_rate, ob / mr)
            flops += of
            bytes_ += ob
        ew = self._elementwise_per_token * n  # before attention: the order price_decodes sums in
        t += ew / mr
        bytes_ += ew
        pf_pairs, pf_keys, dec_keys = self._attention_work(shape, plan)
        kv_write = self._kv_write_per_token * n
        if pf_pairs:
            of, ob = self._attn_pair_flops * pf_pairs, pf_keys + kv_write
            t += max(of / cr, ob / mr)
            flops += of
            bytes_ += ob
            kv_write = 0.0
            if self._context_up_flops:
                prefix = shape.kv_tokens_read - shape.decode_ctx - shape.prefill_tokens
                if prefix > 0:
                    of = self._context_up_flops * prefix
                    t += of / self.linear_rate
                    flops += of
        if shape.decode_ctx:
            of, ob = self._decode_pair_flops * shape.decode_ctx * dec_keys[1], dec_keys[0] + kv_write
            t += max(of / cr, ob / mr)
            flops += of
            bytes_ += ob
        comm = self.comm_time(shape)
        return t + comm + self.overhead_s, flops, bytes_, comm

    def _experts(self, n: float) -> tuple[float, float]:
        """FLOPs and bytes of the routed experts on this GPU for ``n`` tokens of this rank."""
        m = self.model
        tokens = n * self.dp  # DP attention: every rank's tokens reach the experts (EP or one tp x dp group)
        rows = tokens * m.num_experts_per_tok * self._local_experts / m.num_experts
        active = self._local_experts * (expected_active_experts(m.num_experts, m.num_experts_per_tok, tokens)
                                        / m.num_experts)
        return self._expert_flops_per_row * rows, active * self._expert_bytes + self._expert_act_per_row * rows

    def _attention_work(self, shape, plan):
        """(prefill query-key pairs, prefill KV bytes read, ((decode KV bytes), pair factor))."""
        L, layer = self.model.num_layers, self._kv_layer
        prefill_keys = shape.kv_tokens_read - shape.decode_ctx
        if not self._sliding or plan is None:
            return shape.prefill_attn, layer * L * prefill_keys, (layer * L * shape.decode_ctx, 1.0)
        # sliding-window layers: each sequence's keys capped at the window
        w, s, full = self._window, self._sliding, L - self._sliding
        pf_pairs_w = pf_keys_w = dec_w = 0.0
        for q, c in zip(plan.num_new_tokens, plan.context):
            if q == 1 and c > 0:
                dec_w += min(c + 1, w)
            else:
                pf_pairs_w += _windowed_pairs(c, q, w)
                pf_keys_w += min(c + q, w)
        pairs = (full * shape.prefill_attn + s * pf_pairs_w) / L
        pf_bytes = layer * (full * prefill_keys + s * pf_keys_w)
        dec_bytes = layer * (full * shape.decode_ctx + s * dec_w)
        factor = (full * shape.decode_ctx + s * dec_w) / (L * shape.decode_ctx) if shape.decode_ctx else 1.0
        return pairs, pf_bytes, (dec_bytes, factor)

    # --- many pure-decode steps at once (sim.engine.DecodePricer) -----------------------------
    def _decode_fixed(self, b: int) -> tuple[float, float, float, float]:
        """(seconds, FLOPs, bytes, communication seconds) of a decode step of ``b`` sequences that
        do not depend on the context, summed in :meth:`breakdown`'s order. Kept per batch size:
        the fast-forward prices a stretch of the same few batch sizes tens of thousands of times."""
        fixed = self._fixed_by_b.get(b)
        if fixed is not None:
            return fixed
        mr = self.memory_rate
        fixed_t = fixed_f = fixed_b = 0.0
        for f, w, act, rate, _per_seq in self._linears:
            of, ob = f * b, w + act * b  # decode: one row per sequence for every linear
            fixed_t += max(of / rate, ob / mr)
            fixed_f += of
            fixed_b += ob
        if self._local_experts:
            of, ob = self._experts(b)
            fixed_t += max(of / self.linear_rate, ob / mr)
            fixed_f += of
            fixed_b += ob
        ew = self._elementwise_per_token * b
        fixed_t += ew / mr
        fixed_b += ew
        comm = self._ar_fixed + self._ar_per_token * b + self._a2a_fixed + self._a2a_per_token * b
        fixed = self._fixed_by_b[b] = (fixed_t, fixed_f, fixed_b, comm)
        return fixed

    def decode_step(self, b: int, context: int) -> tuple[float, float, float]:
        """(seconds, FLOPs, bytes) of one pure-decode step of ``b`` sequences reading ``context``
        keys in all (their contexts plus their new tokens, a StepShape's ``decode_ctx``): the same
        floats :meth:`breakdown` sums for that step, in its order, and the first step of
        :meth:`price_decodes`."""
        fixed_t, fixed_f, fixed_b, comm = self._decode_fixed(b)
        d = float(context)
        af = self._decode_pair_flops * d
        ab = self._kv_layer * self.model.num_layers * d + self._kv_write_per_token * b
        t = fixed_t + max(af / self.compute_rate, ab / self.memory_rate)
        return t + comm + self.overhead_s, fixed_f + af, fixed_b + ab

    def decode_step_time(self, b: int, context: int) -> float:
        """The seconds of :meth:`decode_step` (the fast-forward's cheap bound on a stretch): the
        same float, summed in its order, without its FLOPs and bytes."""
        fixed = self._fixed_by_b.get(b)
        if fixed is None:
            fixed = self._decode_fixed(b)
        d = float(context)
        af = self._decode_pair_flops * d
        ab = self._kv_layer * self.model.num_layers * d + self._kv_write_per_token * b
        return fixed[0] + max(af / self.compute_rate, ab / self.memory_rate) + fixed[3] + self.overhead_s

    def price_decodes(self, b: int, context: int, k: int):
        """Seconds, FLOPs and bytes of ``k`` consecutive decode steps of ``b`` sequences whose
        contexts sum to ``context``: step ``j`` reads ``context + b·j`` keys. The same sums as
        :meth:`breakdown`, with NumPy over the steps (only the attention terms vary)."""
        fixed_t, fixed_f, fixed_b, comm = self._decode_fixed(b)
        d = context + b * np.arange(1, k + 1, dtype=np.float64)
        af = self._decode_pair_flops * d
        ab = self._kv_layer * self.model.num_layers * d + self._kv_write_per_token * b
        seconds = fixed_t + np.maximum(af / self.compute_rate, ab / self.memory_rate) + comm + self.overhead_s
        return seconds, fixed_f + af, fixed_b + ab

    def decode_steps(self, b: int, context: int, k: int) -> tuple[list[float], list[float], list[float]]:
        """:meth:`price_decodes` as Python lists, for a short stretch: the same floats (each step's
        terms in the same order, as :meth:`decode_step` sums them), without NumPy's fixed cost per
        call, which exceeds a loop of a few dozen steps (the Azure replay's stretches: 15 steps on
        average)."""
        fixed_t, fixed_f, fixed_b, comm = self._decode_fixed(b)
        pair = self._decode_pair_flops
        kv = self._kv_layer * self.model.num_layers
        write = self._kv_write_per_token * b
        cr, mr, overhead = self.compute_rate, self.memory_rate, self.overhead_s
        seconds, flops, bytes_ = [], [], []
        for d in range(context + b, context + b * k + 1, b) if b else ():
            d = float(d)
            af = pair * d
            ab = kv * d + write
            x, y = af / cr, ab / mr
            seconds.append(fixed_t + (x if x >= y else y) + comm + overhead)
            flops.append(fixed_f + af)
            bytes_.append(fixed_b + ab)
        return seconds, flops, bytes_


def _windowed_pairs(context: int, n: int, window: int) -> float:
    """Query-key pairs of ``n`` new tokens after ``context`` cached ones when each query sees at
    most ``window`` keys (itself included): sum over i = 1..n of min(context + i, window)."""
    first, last = context + 1, context + n
    if last <= window:
        return n * (first + last) / 2
    if first > window:
        return float(n * window)
    below = window - first + 1  # queries whose key count is under the window
    return below * (first + window) / 2 + (n - below) * window
