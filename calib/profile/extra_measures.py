"""Measurements besides the grid: the engine's per-step host time, swap bandwidth, activation peak.

Why a module of its own: each is a separate experiment with its own set-up (a real engine with
the forward pass left out; the swap path's copies; one largest step), feeding one number into
the table's metadata; none takes part in the sweep's rounds.
"""

from __future__ import annotations

import random
import statistics

import torch

from calib.executor import HostKVPool
from calib.profile.plan import ProfileSpec
from calib.profile.timing import Timer
from calib.step import BlockAllocator, StepRunner, release, synthetic_batch


def measure_step_gap(spec: ProfileSpec, runner: StepRunner) -> float:
    """Mean host time per step of the real engine with the forward pass left out."""
    from calib.engine import RealEngine
    from policies.base import EngineLimits
    from policies.registry import make_policy
    from sim.workload.request_spec import RequestSpec

    limits = EngineLimits(block_size=spec.block_size, num_gpu_blocks=runner.cache.num_blocks - 1,
                          max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
                          max_model_len=spec.max_model_len)
    rng = random.Random(spec.seed)
    n = 2 * spec.max_num_seqs
    prompt_hi = max(1, min(spec.max_num_batched_tokens, spec.max_model_len // 4))
    specs = []
    for i in range(n):
        prompt = rng.randint(max(1, prompt_hi // 4), prompt_hi)
        out = rng.randint(8, 48)
        out = max(1, min(out, spec.max_model_len - prompt))
        specs.append(RequestSpec(f"g{i}", 0.0, prompt, out, out))

    class NoForward:
        uses_graphs = False

        def __init__(self, runner):
            self.runner = runner

        def run(self, batch):
            return [0] * len(batch)

    engine = RealEngine(make_policy("vllm-v1", limits), NoForward(runner), max_model_len=spec.max_model_len)
    result = engine.run(specs)
    return result.wall_s / max(len(result.steps), 1)

def measure_bandwidth(runner: StepRunner, allocator: BlockAllocator, timer: Timer, device: torch.device):
    """Host<->device copy bandwidth through the engine's swap path (HostKVPool)."""
    cache = runner.cache
    per_block = cache.data[:, :, 0].numel() * cache.data.element_size()
    target = (256 if device.type == "cuda" else 64) * (1 << 20)
    blocks = max(1, min(allocator.num_free, target // per_block))
    device_blocks = allocator.allocate(blocks)
    pool = HostKVPool(cache, blocks, initial_blocks=blocks)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    state = {}

    def out():
        state["host"] = pool.swap_out(device_blocks)
        sync()

    def back():
        pool.swap_in(state.pop("host"), device_blocks)
        sync()

    d2h, h2d = [], []
    try:
        out()
        back()  # warm-up
        for _ in range(5):
            d2h.append(timer(out))
            h2d.append(timer(back))
    finally:
        allocator.free(device_blocks)
    nbytes = blocks * per_block
    bandwidth = {"h2d_bytes_per_s": nbytes / statistics.median(h2d), "d2h_bytes_per_s": nbytes / statistics.median(d2h)}
    raw = None
    if device.type == "cuda":
        host = torch.empty(target, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(target, dtype=torch.uint8, device=device)
        dev.copy_(host)
        h = statistics.median(timer(lambda: dev.copy_(host)) for _ in range(5))
        d = statistics.median(timer(lambda: host.copy_(dev)) for _ in range(5))
        raw = {"pinned_h2d_bytes_per_s": target / h, "pinned_d2h_bytes_per_s": target / d, "bytes": target}
    return bandwidth, {"swap_path_bytes": nbytes, "swap_path_blocks": blocks, "raw_copy": raw}

def activation_peak(spec: ProfileSpec, runner: StepRunner, allocator: BlockAllocator,
                    device: torch.device) -> int | None:
    """Peak device memory of the largest step beyond what was allocated before it (GPU only)."""
    if device.type != "cuda":
        return None
    n = min(spec.max_num_batched_tokens, spec.max_model_len)
    batch = synthetic_batch([(n, 0)], allocator, spec.block_size)
    try:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.step(batch)
        peak = torch.cuda.max_memory_allocated(device) - before
    finally:
        release(batch, allocator)
    return int(peak)
