"""vLLM's own batch limits for a device: ``max_num_seqs`` and ``max_num_batched_tokens`` as vLLM
0.32 picks them for its OpenAI-compatible API server when the user sets neither.

Why a module of its own: these two numbers decide how big a batch ``vllm-v1`` may run, and vLLM
does not use fixed defaults: ``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``)
chooses them by *usage context* (the ``LLM`` class or the API server) and by the device's name
and total memory, and ``_set_default_max_num_seqs_and_batched_tokens_args`` then adjusts them
to the model's context length. cbsim models the server (``vllm serve``), so the
``OPENAI_API_SERVER`` column applies. Read from the vLLM source (``arg_utils.py``,
``get_batch_defaults``; the 160 GiB tier appeared in 0.28 and is unchanged through 0.33,
reference/schedulers.md §1.1):

=================================================  ======================  ==============
device (memory as the driver reports it)           max_num_batched_tokens  max_num_seqs
=================================================  ======================  ==============
GPU with >= 160 GiB (B200, MI300X ...)             16384                   1024
GPU with >= 70 GiB whose name has no "a100"        8192                    1024
  (H100 80GB, H200)
any other GPU (A100, L40S, unknown)                2048                    256
CPU (per GPU of world_size)                        2048 x world_size       128 x world_size
=================================================  ======================  ==============

then, for each value the user left unset: with chunked prefill off, the token budget is raised
to at least ``max_model_len``; the token budget is capped at ``max_num_seqs x max_model_len``;
``max_num_seqs`` is capped at the token budget. A value the user set is kept as it is.
"""

from __future__ import annotations

from policies.base import Device

VLLM_RELEASE = "0.32"
USAGE_CONTEXT = "OPENAI_API_SERVER"
GIB = 1 << 30

# (max_num_batched_tokens, max_num_seqs) for the API server
_HUGE_GPU = (16384, 1024)  # >= 160 GiB
_LARGE_GPU = (8192, 1024)  # >= 70 GiB, not an A100 (vLLM PR #17885: a larger budget slowed A100s)
_SMALL_GPU = (2048, 256)
_CPU_PER_RANK = (2048, 128)


def server_batch_defaults(device: Device | None) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` vLLM's API server starts with on ``device``,
    before the adjustments of :func:`vllm_limits`. ``None`` (an unknown device) gets what vLLM
    falls back to when it cannot query one: the small-GPU values."""
    if device is None:
        return _SMALL_GPU
    if device.kind == "cpu":
        tokens, seqs = _CPU_PER_RANK
        return tokens * device.world_size, seqs * device.world_size
    if device.memory_bytes >= 160 * GIB:
        return _HUGE_GPU
    if device.memory_bytes >= 70 * GIB and "a100" not in device.name.lower():
        return _LARGE_GPU
    return _SMALL_GPU


def vllm_limits(max_num_seqs: int | None, max_num_batched_tokens: int | None, max_model_len: int,
                device: Device | None, chunked_prefill: bool = True) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` as vLLM resolves them: set values are kept,
    unset (None) ones take the server defaults for ``device``, adjusted as the module doc says."""
    default_tokens, default_seqs = server_batch_defaults(device)
    seqs = default_seqs if max_num_seqs is None else max_num_seqs
    tokens = default_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    if max_num_batched_tokens is None:
        if not chunked_prefill:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return seqs, tokens
