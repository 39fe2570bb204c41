"""What vLLM's profiling pass takes out of the KV budget besides the weights, estimated from shapes.

vLLM (``Worker.determine_available_memory``, vllm/v1/worker/gpu_worker.py) snapshots memory after
the CUDA context and NCCL are set up, loads the weights, runs one profiling forward pass over
``max_num_batched_tokens`` dummy tokens followed by a dummy sampler run over
``min(max_num_seqs, max_num_batched_tokens)`` sequences, and sets

    KV cache = total × gpu_memory_utilization − weights − torch peak increase − non-torch increase

So the rest is two terms, both per GPU (the CUDA context, ~0.5 GiB, and CUDA graphs, captured
after the KV cache is allocated, live in the ``1 − gpu_memory_utilization`` headroom and are not
subtracted):

1. **torch peak** of that pass, the larger of
   - the forward pass at its widest point: the residual and hidden streams (2 × T × hidden) plus
     either the MLP's gate/up output and SwiGLU product (T × 3 × intermediate per GPU) or, for an
     MoE, the fused-MoE caches of the T × top_k routed rows (gate/up, product, down: 3 × expert
     width + hidden), or the attention's q/k/v and output (T × (q + 2 kv + q)), in ``dtype``;
   - the sampler over S sequences and the full (padded) vocabulary V: bf16 logits (2 B), their
     fp32 copy (4 B), the top-k/top-p sort's values and int64 indices (4 + 8 B) and the
     probabilities (4 B): 22 B per logit, plus the T hidden states still alive;
2. **non-torch increase** during the pass: cuBLAS/cuDNN workspaces and the kernels loaded lazily
   on first use. :data:`NON_TORCH_BYTES` = 551 MiB, the figure NVIDIA AIConfigurator measured for
   this "cuda, cublas, etc." memory before padding it for safety (``other_mem`` comment in
   aiconfigurator_core/systems/h100_sxm.yaml: "increase from 551MB to 3.5GB").

Checked, not fitted, against the RTX 4090 run of ../shared/reference/gpu-runs/ (tests/test_moe_tp.py):
Llama-3.1-8B, 2,048 tokens, 256 sequences: 0.74 GB torch peak + 0.58 GB non-torch = 1.32 GB,
where vLLM's block count implies 1.24 GB.
"""

from __future__ import annotations

from sim.hardware.models import ModelSpec

MIB = 1 << 20
NON_TORCH_BYTES = 551 * MIB
SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4 + 8 + 4


def forward_peak_bytes(model: ModelSpec, tokens: int, tp: int = 1, ep: int = 1, moe_tp: int | None = None) -> int:
    """Peak activation bytes of one forward pass over ``tokens`` tokens on ONE GPU."""
    h = model.hidden_size
    q = model.q_size // tp
    kv = model.kv_heads_per_rank(tp) * model.head_dim
    widest = q + 2 * kv + q
    if model.is_moe:
        width = model.expert_width_per_rank(tp, ep, moe_tp)
        widest = max(widest, model.num_experts_per_tok * (3 * width + h),
                     3 * -(-model.shared_expert_intermediate_size // tp),
                     3 * -(-model.intermediate_size // tp) if model.first_k_dense_layers else 0)
    else:
        widest = max(widest, 3 * -(-model.intermediate_size // tp))
    return tokens * (2 * h + widest) * model.dtype_bytes


def sampler_peak_bytes(model: ModelSpec, sequences: int) -> int:
    """Peak bytes of the dummy sampler run over ``sequences`` rows of full-vocabulary logits."""
    vocab = -(-model.vocab_size // 64) * 64
    return sequences * vocab * SAMPLER_BYTES_PER_LOGIT


def activation_reserve_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int,
                             tp: int = 1, ep: int = 1, moe_tp: int | None = None) -> int:
    """Torch peak + non-torch increase of vLLM's profiling pass on ONE GPU (module docstring)."""
    tokens = max_num_batched_tokens
    seqs = min(max_num_seqs, max_num_batched_tokens)
    torch_peak = max(forward_peak_bytes(model, tokens, tp, ep, moe_tp),
                     sampler_peak_bytes(model, seqs) + tokens * model.hidden_size * model.dtype_bytes)
    return torch_peak + NON_TORCH_BYTES
