"""What a calibration measures: the spec, its device defaults, the grids, and the jobs to time.

Why a module of its own: deciding *which* points to measure (grids spanning an engine's limits,
random held-out mixed batches) is pure planning that needs no device; :mod:`calib.profile.calibrate` runs
the plan, and the tests check the grids without timing anything.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from calib.paged import cdiv

GIB = 1 << 30

# Limits a calibration covers when the caller names none: a CPU runs the tiny model (small
# steps); a GPU covers vLLM's defaults for 8k-context models.
DEVICE_LIMITS = {
    "cpu": {"max_num_batched_tokens": 512, "max_model_len": 2048, "max_num_seqs": 64},
    "cuda": {"max_num_batched_tokens": 8192, "max_model_len": 8192, "max_num_seqs": 256},
}
DEVICE_TIMING = {
    "cpu": {"warmup": 1, "repeats": 5, "max_point_s": 0.5, "warm_visits": True},
    "cuda": {"warmup": 3, "repeats": 10, "max_point_s": 0.6, "warm_visits": False},
}

Progress = Callable[[int, int, str], None]  # (done, total, what is being measured)


@dataclass
class ProfileSpec:
    """What to calibrate and over which limits. ``None`` fields take the device's defaults."""

    model: Any = "tiny"
    device: str = "cpu"
    dtype: str | None = None
    tp: int = 1
    block_size: int = 16
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    warmup: int | None = None
    repeats: int | None = None
    max_point_s: float | None = None
    warm_visits: bool | None = None  # run each batch once untimed before its timed run (CPU default)
    time_budget_s: float | None = None  # whole profile; fewer rounds (at least 1) when the sweep would exceed it
    heldout: int = 24
    seed: int = 0
    gpu_memory_utilization: float = 0.92
    cache_gib: float | None = None  # KV cache for profiling; default: 0.5 GiB on CPU, most free memory on GPU
    num_layers: int | None = None  # depth override (tests); the table then prices that depth
    cuda_graphs: bool | None = None  # default: on CUDA with the Triton attention
    attention: str = "auto"
    clock: str | None = None  # CPU only: "thread" (CPU time, one torch thread) or "wall"; default: see Timer

    def resolved(self) -> ProfileSpec:
        kind = torch.device(self.device).type
        if kind not in DEVICE_LIMITS:
            from sim.errors import CbsimError

            raise CbsimError(f"--device must be cpu or cuda, got {self.device!r}")
        out = ProfileSpec(**asdict(self))
        for key, value in {**DEVICE_LIMITS[kind], **DEVICE_TIMING[kind]}.items():
            if getattr(out, key) is None:
                setattr(out, key, value)
        return out


def _powers(lo: int, hi: int) -> list[int]:
    from sim.latency.fit import powers_of_two

    return powers_of_two(lo, hi)


def profile_grids(spec: ProfileSpec) -> dict[str, tuple[list[int], ...]]:
    """The grid of each component for a spec's limits (see :mod:`calib.profile.calibrate`'s docstring)."""
    top_ctx = spec.max_model_len - 1
    ctx = [0] + [c for c in _powers(16, top_ctx) if c >= 16] if top_ctx >= 16 else [0, top_ctx]
    ctx = sorted(set(ctx))
    decode_ctx = sorted({1, *[c for c in ctx if c > 1]})
    tokens = max(spec.max_num_batched_tokens, spec.max_num_seqs)  # a decode batch is tokens too
    return {
        "linear": ([0, *_powers(1, tokens)],),
        "prefill_attn": (_powers(1, tokens), ctx),
        "decode_attn": (_powers(1, spec.max_num_seqs), decode_ctx),
    }


@dataclass
class Job:
    """One thing to time: a batch run as a step (``shapes``), or the linear probe at ``tokens``."""

    kind: str  # linear | prefill | decode | heldout
    key: tuple
    shapes: list[tuple[int, int]]
    times: list[float] = field(default_factory=list)
    rounds: int = 0  # rounds this job takes part in (set after the first)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def mixed_batch(rng: random.Random, spec: ProfileSpec, capacity_blocks: int) -> list[tuple[int, int]]:
    """One random mixed batch within the spec's limits and the cache: prefill chunks first (one,
    or two 30 % of the time) then decodes of unequal contexts."""
    bs, max_len = spec.block_size, spec.max_model_len
    chunks = 2 if rng.random() < 0.3 else 1
    decodes = max(1, int(round(math.exp(rng.uniform(0, math.log(max(spec.max_num_seqs - chunks, 1)))))))
    budget = max(spec.max_num_batched_tokens - decodes, chunks)
    shapes = []
    for _ in range(chunks):
        n = max(1, int(round(math.exp(rng.uniform(0, math.log(max(budget // chunks, 1)))))))
        c = 0 if rng.random() < 0.3 else rng.randint(0, max(max_len - n, 0))
        shapes.append((n, c))
    mean = math.exp(rng.uniform(0, math.log(max_len - 1)))
    for _ in range(decodes):
        shapes.append((1, int(min(max(mean * rng.uniform(0.3, 1.7), 1), max_len - 1))))
    while sum(cdiv(n + c, bs) for n, c in shapes) > capacity_blocks:  # shrink contexts to fit the cache
        shapes = [(n, c // 2 if n == 1 else c) for n, c in shapes]
        if all(c <= 1 for n, c in shapes if n == 1):
            shapes = shapes[: max(chunks + 1, len(shapes) // 2)]
    return shapes
