"""Which paged-attention implementation a step runs: the reference (:mod:`calib.paged`) or the
Triton kernel (:mod:`calib.paged_triton`).

Why a module of its own: the kernel reads the reference module's metadata, so the choice between
the two sits above both and neither imports the other back.
"""

from __future__ import annotations

import torch

from calib.paged import BACKENDS, AttentionMetadata, paged_attention_reference


def resolve_backend(backend: str, device: torch.device) -> str:
    """'auto' means the Triton kernel on a CUDA device when Triton imports, else the reference."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    if device.type == "cuda":
        from calib import paged_triton  # lazily: importing Triton is slow, and reads TRITON_INTERPRET

        if paged_triton.available():
            return "triton"
    return "reference"


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    backend: str = "auto",
) -> torch.Tensor:
    """Paged attention for a mixed batch through the chosen backend (see :func:`resolve_backend`)."""
    if resolve_backend(backend, q.device) == "triton":
        from calib.paged_triton import paged_attention_triton

        return paged_attention_triton(q, k_cache, v_cache, meta, scale)
    return paged_attention_reference(q, k_cache, v_cache, meta, scale)
