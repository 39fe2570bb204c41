"""Choosing the device to measure on: the checks the CLI runs before any torch work.

torch is imported inside the functions, so ``sim``'s commands can call these (lazily) and a
machine without the ``calib`` extra gets a clear message instead of an ImportError.
"""

from __future__ import annotations

from sim.errors import CbsimError, nearest


def require_torch(device: str) -> None:
    """torch is needed for a device: a clear error (naming the fix) when it is missing."""
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise CbsimError(f"--device must be cpu or cuda, got {device!r}{nearest(device, ('cpu', 'cuda'))}")
    try:
        import torch
    except ImportError:
        raise CbsimError("measuring on a device needs torch, which is not installed: install cbsim's calib extra, "
                         "`pip install -e .[calib]` (the simulator itself runs without it)") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CbsimError("--device cuda but torch sees no CUDA device (a CPU-only torch build, or no GPU); use "
                         "--device cpu")


def set_threads(device: str, threads: int) -> None:
    """Torch threads for CPU timing (1: time on the engine thread's own CPU clock)."""
    if threads < 1:
        raise CbsimError(f"--threads must be at least 1, got {threads}")
    if device == "cpu":
        import torch

        torch.set_num_threads(threads)
