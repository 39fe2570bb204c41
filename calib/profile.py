"""Measure a latency table on a device: a sweep over batch compositions, timed properly.

What is measured (DESIGN.md, "Latency model"; the table format is :mod:`sim.latency.table_format`):
a step's time is ``overhead + linear(T) + Σ prefill_attn(n, c) + decode_attn(b, c̄) + step_gap``.
Each component is *measured directly*, as a difference of whole steps run through
:class:`calib.executor.StepExecutor` (the path the real engine runs), never fitted:

- ``linear``: the forward pass of ONE sequence of T tokens with attention replaced by its K/V write
  (the linear layers, norms, rotary embedding, the LM head, input preparation): ``L(T)``. On a GPU
  this probe runs from a CUDA graph, so ``L`` is device time alone; on a CPU it runs as a step does
  (prepare, forward, read back). ``overhead`` is ``L``'s intercept (``2·L(1) − L(2)``, at least 0)
  and ``linear(T) = L(T) − overhead``.
- ``prefill_attn(n, c)`` = step(one chunk of n tokens on c cached) − ``L(n)``: the chunk's
  attention plus whatever a real step costs beyond the probe (on a GPU, the launch time of an eager
  step: a mixed step pays it once, through its prefill chunk).
- ``decode_attn(b, c̄)`` = step(b decodes, each on c̄ cached) − ``L(b)``: the decode batch's
  attention plus the per-request work of b sequences (on a GPU the step replays a CUDA graph, as
  the engine's decode steps do).
- ``step_gap``: the engine's own host time per step outside the forward pass (scheduling, block
  mapping, emitting tokens, recording), measured by running :class:`calib.engine.RealEngine` with
  the ``vllm-v1`` policy on a synthetic workload with the forward pass left out.

Grids span an engine's limits, as :func:`sim.latency.fit.default_grids` does (points at powers of
two, plus the limit): tokens up to ``max_num_batched_tokens``, contexts up to ``max_model_len − 1``
(the longest context a request can have), decode batches up to ``max_num_seqs``. A grid point no
engine of those limits can produce (a chunk with ``n + c > max_model_len``) or that does not fit
the profiling cache (``b·(c̄ + 1)`` tokens) is not run: it is extrapolated linearly along the
context from its row's two longest measured points (scaled from the previous row when the row has
fewer), and listed in ``metadata.fit.extrapolated``. Along the context, each row is made
non-decreasing by isotonic regression (more context never costs less; a dip is noise).

Timing: every measurement, grid point or held-out batch, is a *job*; the sweep times all jobs in
rounds, each round in a fresh random order, one timed run per job per round, and a point's value
is its median over the rounds (:meth:`Profiler.sweep` says why rounds). GPU: CUDA events around
each run; CPU: the calling thread's CPU time when torch runs one thread (:class:`Timer`), else
``time.perf_counter``. The first round runs each job ``warmup`` times untimed first (Triton
compilation, allocator pools); on a CPU each later visit also runs the batch once untimed first
(an engine's consecutive steps find weights and K/V in the caches). Slow jobs stop after three
rounds, and ``time_budget_s`` caps the rounds of all (the device run's budget). Batches are laid
out as the engine lays them out: explicit token ids, block tables from a pool that hands blocks
out in order and takes them back last-in first-out.

Held-out error: ``heldout`` random *mixed* batches (one or two prefill chunks plus decodes of
unequal contexts, seeded), none on the grid, are measured whole and priced through
:class:`sim.latency.table.TableLatency` itself (less ``step_gap``, which a forward pass does not
include); the relative errors go into ``metadata.heldout_error``.

Swap: the engine's swap path (:class:`calib.executor.HostKVPool`) moves a few hundred MB of blocks
out and back; bytes over the median times are ``metadata.bandwidth``. On a CPU the "host" pool is
the same RAM, so the figure is memcpy bandwidth (documented in ``metadata.fit``).

KV capacity: the device's memory × ``gpu_memory_utilization`` − the full model's weights − the
activation peak of the largest step (measured on a GPU; 1 GiB, cbsim's default reserve, on a CPU),
divided by a block's bytes, minus the null block: ``metadata.num_gpu_blocks``, vLLM's count.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from calib.executor import HostKVPool, StepExecutor, make_executor
from calib.paged import PagedKVCache, cdiv, write_kv
from calib.step import BlockAllocator, SeqInput, StepRunner, make_runner, release, synthetic_batch

GIB = 1 << 30
CPU_ACTIVATION_RESERVE = 1 * GIB  # cbsim's hardware.activation_reserve_gib default

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


# ------------------------------------------------------------------------------------------------
# grids
# ------------------------------------------------------------------------------------------------
def _powers(lo: int, hi: int) -> list[int]:
    from sim.latency.fit import powers_of_two

    return powers_of_two(lo, hi)


def profile_grids(spec: ProfileSpec) -> dict[str, tuple[list[int], ...]]:
    """The grid of each component for a spec's limits (see the module docstring)."""
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


# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------
class Timer:
    """Times one run of a callable that finishes its device work before it returns (or is a graph
    replay: on CUDA the time is read from events recorded around it).

    On a CPU with one torch thread the clock is the calling thread's CPU time
    (:func:`calib.engine.clock_kind`): the work's own cost, not the time other processes held the
    core (a shared machine otherwise inflates points at random). The real engine then runs on the
    same clock, so table and run agree on what a second is."""

    def __init__(self, device: torch.device, clock: str | None = None) -> None:
        from calib.engine import clock_kind

        self.cuda = device.type == "cuda"
        self.clock = "cuda-events" if self.cuda else (clock or clock_kind(device))
        self._read = time.thread_time if self.clock == "thread" else time.perf_counter

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        read = self._read
        t = read()
        fn()
        return read() - t


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


# ------------------------------------------------------------------------------------------------
# the linear probe: a forward pass whose attention only writes K/V
# ------------------------------------------------------------------------------------------------
@torch.inference_mode()
def linear_forward(runner: StepRunner, inputs) -> torch.Tensor:
    """``StepRunner.execute`` with attention replaced by its K/V write (the output is the queries)."""
    cache, slots = runner.cache, inputs.meta.slot_mapping

    def attend(layer, q, k, v):
        k_cache, v_cache = cache.layer(layer)
        write_kv(k_cache, v_cache, k, v, slots)
        return q

    hidden = runner.model(inputs.input_ids, inputs.meta.positions, attend)
    return runner.model.compute_logits(hidden.index_select(0, inputs.last_token_index)).argmax(dim=-1)


class ProbeGraphs:
    """The linear probe captured in CUDA graphs, one per token count, in one memory pool; the
    blocks its K/V writes go to stay allocated while the graphs live."""

    def __init__(self, runner: StepRunner, allocator: BlockAllocator, token_counts: Sequence[int]) -> None:
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.batches = []
        pool = None
        for tokens in sorted(token_counts, reverse=True):
            batch = synthetic_batch([(tokens, 0)], allocator, runner.block_size)
            self.batches.append(batch)
            inputs = runner.prepare(batch)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                linear_forward(runner, inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                linear_forward(runner, inputs)
            pool = graph.pool()
            self.graphs[tokens] = graph
        torch.cuda.synchronize()
        self.allocator = allocator

    def close(self) -> None:
        self.graphs.clear()
        for batch in self.batches:
            release(batch, self.allocator)
        self.batches = []
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
# filling what was not measured
# ------------------------------------------------------------------------------------------------
def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out.extend([s / c] * int(c))
    return out


def fill_rows(xs: Sequence[int], ys: Sequence[int], grid: dict[tuple[int, int], float]) -> tuple[np.ndarray, list]:
    """A full 2-D array from measured points: each row made non-decreasing along y, unmeasured
    points extrapolated linearly along y from the row's two last measured points (or, for a row
    with fewer, from the previous row scaled by x / x_prev). Returns (values, extrapolated points)."""
    values = np.zeros((len(xs), len(ys)))
    extrapolated = []
    prev = None
    for i, x in enumerate(xs):
        have = [j for j, y in enumerate(ys) if (x, y) in grid]
        if have:
            fitted = isotonic([max(grid[(x, ys[j])], 0.0) for j in have])
            for j, v in zip(have, fitted):
                values[i, j] = v
        for j, y in enumerate(ys):
            if (x, y) in grid:
                continue
            extrapolated.append([x, y])
            below = [k for k in have if k < j]
            if len(below) >= 2:
                a, b = below[-2], below[-1]
                slope = (values[i, b] - values[i, a]) / (ys[b] - ys[a])
                values[i, j] = values[i, b] + slope * (y - ys[b])
            elif prev is not None:
                base = values[i, have[0]] if have else 0.0
                ref_base = values[prev, have[0]] if have else 0.0
                values[i, j] = base + (values[prev, j] - ref_base) * x / xs[prev]
            elif below:
                values[i, j] = values[i, below[-1]]
        prev = i
    return np.maximum(values, 0.0), extrapolated


# ------------------------------------------------------------------------------------------------
# the sweep
# ------------------------------------------------------------------------------------------------
@dataclass
class Profiler:
    spec: ProfileSpec
    progress: Progress | None = None
    log: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from sim.models import get_model

        self.spec = self.spec.resolved()
        self.model_spec = get_model(self.spec.model)
        self.device = torch.device(self.spec.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            from sim.errors import CbsimError

            raise CbsimError("--device cuda but torch sees no CUDA device; use --device cpu")
        self._done = 0
        self._total = 0

    # --- progress ------------------------------------------------------------------------------
    def _tick(self, what: str) -> None:
        self._done += 1
        if self.progress is not None:
            self.progress(self._done, self._total, what)

    # --- set-up ----------------------------------------------------------------------------
    def _cache_blocks(self, dtype: torch.dtype) -> int:
        s, spec = self.model_spec, self.spec
        layers = spec.num_layers or s.num_layers
        per_block = PagedKVCache.bytes_per_block(layers, spec.block_size, s.kv_heads_per_rank(spec.tp), s.head_dim,
                                                 dtype)
        if spec.cache_gib is not None:
            budget = spec.cache_gib * GIB
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            weights = s.weight_bytes(spec.tp) * layers / s.num_layers
            budget = max(free - weights - 12 * GIB, 1 * GIB)  # 12 GiB: activations, graphs, Triton partials
        else:
            budget = 0.5 * GIB
        need = spec.max_num_seqs * cdiv(spec.max_model_len + 1, spec.block_size) + 1  # the largest decode point
        return int(max(min(budget // per_block, need), cdiv(spec.max_model_len + 1, spec.block_size) + 2))

    def run(self) -> Any:
        from calib.model import torch_dtype
        from sim.latency.table_format import LatencyTable, make_component

        spec = self.spec
        t_start = self._t_start = time.perf_counter()
        dtype = torch_dtype(spec.dtype or self.model_spec.dtype)
        num_blocks = self._cache_blocks(dtype)
        runner = make_runner(self.model_spec, num_blocks=num_blocks, block_size=spec.block_size,
                             device=self.device, dtype=dtype, tp=spec.tp, num_layers=spec.num_layers,
                             attention=spec.attention, seed=spec.seed)
        self.runner = runner
        executor, graphs_note = make_executor(runner, max_model_len=spec.max_model_len, max_batch=spec.max_num_seqs,
                                              cuda_graphs=spec.cuda_graphs)
        self.executor = executor
        # unshuffled: blocks come out of the pool in order and go back last-in first-out, so a
        # request's blocks lie close together, as in calib.engine (its pools reuse the blocks
        # freed last); on a CPU scattered tables cost 10-25 % more in the attention's gather
        allocator = BlockAllocator(num_blocks)
        self.timer = Timer(self.device, spec.clock)
        grids = profile_grids(spec)
        lin_axis, = grids["linear"]
        pre_n, pre_c = grids["prefill_attn"]
        dec_b, dec_c = grids["decode_attn"]
        bs = spec.block_size
        capacity = num_blocks - 1

        def fits(shapes) -> bool:
            return sum(cdiv(n + c, bs) for n, c in shapes) <= capacity

        jobs = [Job("linear", (T,), [(T, 0)]) for T in lin_axis[1:]]
        jobs += [Job("prefill", (n, c), [(n, c)]) for n in pre_n for c in pre_c
                 if n + c <= spec.max_model_len and fits([(n, c)])]
        jobs += [Job("decode", (b, c), [(1, c)] * b) for b in dec_b for c in dec_c if fits([(1, c)] * b)]
        rng = random.Random(spec.seed + 1)
        probe_cap = capacity - sum(cdiv(T, bs) for T in lin_axis[1:]) if executor.uses_graphs else capacity
        jobs += [Job("heldout", (i,), mixed_batch(rng, spec, probe_cap)) for i in range(spec.heldout)]

        probes = ProbeGraphs(runner, allocator, lin_axis[1:]) if executor.uses_graphs else None
        try:
            self.sweep(jobs, executor, allocator, probes)
            activation = self.activation_peak(runner, allocator)
        finally:
            if probes is not None:
                probes.close()

        # components from the medians (see the module docstring)
        L = {job.key[0]: job.median for job in jobs if job.kind == "linear"}
        overhead = max(0.0, min(L[lin_axis[1]], 2 * L[lin_axis[1]] - L[lin_axis[2]])) if len(lin_axis) > 2 else 0.0
        linear_vals = [0.0] + [max(L[T] - overhead, 0.0) for T in lin_axis[1:]]

        def L_at(tokens: int) -> float:
            return overhead + float(np.interp(tokens, lin_axis, linear_vals))

        pre = {job.key: job.median - L_at(job.key[0]) for job in jobs if job.kind == "prefill"}
        dec = {job.key: job.median - L_at(job.key[0]) for job in jobs if job.kind == "decode"}
        pre_vals, pre_extra = fill_rows(pre_n, pre_c, pre)
        dec_vals, dec_extra = fill_rows(dec_b, dec_c, dec)

        step_gap = self.measure_step_gap(runner)
        self._tick("engine overhead")
        components = {
            "overhead": make_component("overhead", (), overhead),
            "step_gap": make_component("step_gap", (), step_gap),
            "linear": make_component("linear", (lin_axis,), linear_vals),
            "prefill_attn": make_component("prefill_attn", (pre_n, pre_c), pre_vals),
            "decode_attn": make_component("decode_attn", (dec_b, dec_c), dec_vals),
        }
        table = LatencyTable(components, {})
        bandwidth, raw_copy = self.measure_bandwidth(runner, allocator)
        self._tick("swap bandwidth")
        heldout, heldout_rows = self.heldout_error(table, [j for j in jobs if j.kind == "heldout"], step_gap)
        table.metadata = self.metadata(
            table, dtype=dtype, bandwidth=bandwidth, raw_copy=raw_copy, heldout=heldout, heldout_rows=heldout_rows,
            activation=activation, linear_probe=L, extrapolated={"prefill_attn": pre_extra, "decode_attn": dec_extra},
            raw_steps=[[j.kind, *j.key, j.median] for j in jobs if j.kind in ("prefill", "decode")],
            graphs_note=graphs_note, seconds=time.perf_counter() - t_start, num_blocks=num_blocks,
        )
        return table

    def sweep(self, jobs: list[Job], executor: StepExecutor, allocator: BlockAllocator, probes) -> None:
        """Time every job in rounds, each round in a fresh random order, one run per job per round.

        Why rounds and not repeats in a row: an engine never runs the same step twice in a row
        (every step's batch differs), so a job is timed as a fresh step; and a slow drift of the
        machine (other tenants, clocks) then spreads evenly over grid and held-out jobs alike
        instead of biasing whatever was measured while it lasted. The first round runs each job
        ``warmup`` times untimed first (kernel compilation, allocator pools); with
        ``warm_visits`` (the CPU default) every later visit runs the batch once untimed before the
        timed run, because an engine's consecutive steps find the weights and most of the K/V
        they read still in the CPU's caches (on a GPU they stream from device memory every
        step, and the first run is timed). Slow jobs stop after 3 rounds once ``rounds x first
        time`` would exceed ``max_point_s``."""
        spec, timer, runner, bs = self.spec, self.timer, self.runner, self.spec.block_size
        rng = random.Random(spec.seed)
        self._total = len(jobs) * spec.repeats + 2
        for r in range(spec.repeats):
            if r == 1 and spec.time_budget_s is not None:
                self._fit_budget(jobs)
            order = list(jobs)
            rng.shuffle(order)
            for job in order:
                if r == 0:
                    job.rounds = spec.repeats
                elif r >= job.rounds:
                    self._tick(job.kind)
                    continue
                if job.kind == "linear" and probes is not None:
                    graph = probes.graphs[job.key[0]]
                    for _ in range(spec.warmup if r == 0 else 0):
                        graph.replay()
                    job.times.append(timer(graph.replay))
                else:
                    batch = engine_batch(job.shapes, allocator, bs)
                    try:
                        if job.kind == "linear":
                            def fn(b=batch):
                                return linear_forward(runner, runner.prepare(b)).tolist()
                        else:
                            def fn(b=batch):
                                return executor.run(b)
                        for _ in range(spec.warmup if r == 0 else int(spec.warm_visits)):
                            fn()
                        job.times.append(timer(fn))
                    finally:
                        release(batch, allocator)
                if r == 0:
                    job.rounds = max(3, min(spec.repeats, int(spec.max_point_s / max(job.times[0], 1e-9))))
                self._tick(job.kind)

    def _fit_budget(self, jobs: list[Job]) -> None:
        """After the first round: cut every job's rounds so that the profile ends within
        ``time_budget_s`` (a round costs about the sum of the jobs' first times, plus the
        allocation and launch work around each; what follows the sweep is given 15 s)."""
        spec = self.spec
        elapsed = time.perf_counter() - self._t_start
        per_round = 1.3 * sum(min(j.times[0], spec.max_point_s) for j in jobs)
        left = spec.time_budget_s - elapsed - 15.0
        extra = int(left // per_round) if per_round > 0 else spec.repeats
        cap = max(1, min(spec.repeats, 1 + extra))
        for job in jobs:
            job.rounds = min(job.rounds, cap)
        self.log["rounds_cap"] = cap
        self.log["first_round_s"] = round(elapsed, 1)

    # --- pieces ------------------------------------------------------------------------------
    def measure_step_gap(self, runner: StepRunner) -> float:
        """Mean host time per step of the real engine with the forward pass left out."""
        from calib.engine import RealEngine
        from policies.base import EngineLimits
        from policies.registry import make_policy
        from sim.request_spec import RequestSpec

        spec = self.spec
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

    def measure_bandwidth(self, runner: StepRunner, allocator: BlockAllocator):
        """Host<->device copy bandwidth through the engine's swap path (HostKVPool)."""
        cache, timer = runner.cache, self.timer
        per_block = cache.data[:, :, 0].numel() * cache.data.element_size()
        target = (256 if self.device.type == "cuda" else 64) * (1 << 20)
        blocks = max(1, min(allocator.num_free, target // per_block))
        device_blocks = allocator.allocate(blocks)
        pool = HostKVPool(cache, blocks, initial_blocks=blocks)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
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
        if self.device.type == "cuda":
            host = torch.empty(target, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(target, dtype=torch.uint8, device=self.device)
            dev.copy_(host)
            h = statistics.median(timer(lambda: dev.copy_(host)) for _ in range(5))
            d = statistics.median(timer(lambda: host.copy_(dev)) for _ in range(5))
            raw = {"pinned_h2d_bytes_per_s": target / h, "pinned_d2h_bytes_per_s": target / d, "bytes": target}
        return bandwidth, {"swap_path_bytes": nbytes, "swap_path_blocks": blocks, "raw_copy": raw}

    def activation_peak(self, runner: StepRunner, allocator: BlockAllocator) -> int | None:
        """Peak device memory of the largest step beyond what was allocated before it (GPU only)."""
        if self.device.type != "cuda":
            return None
        spec = self.spec
        n = min(spec.max_num_batched_tokens, spec.max_model_len)
        batch = synthetic_batch([(n, 0)], allocator, spec.block_size)
        try:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            runner.step(batch)
            peak = torch.cuda.max_memory_allocated(self.device) - before
        finally:
            release(batch, allocator)
        return int(peak)

    def heldout_error(self, table, jobs: list[Job], step_gap: float):
        """The held-out mixed batches' medians against the table's price (less step_gap)."""
        import warnings

        from policies.base import StepPlan
        from sim.hardware import get_gpu
        from sim.latency.base import step_shape
        from sim.latency.table import TableExtrapolationWarning, TableLatency

        spec = self.spec
        lat = TableLatency(table, self.model_spec, get_gpu("cpu"), spec.tp, spec.block_size)
        rows = []
        for job in jobs:
            plan = StepPlan(num_new_tokens=[n for n, _ in job.shapes], context=[c for _, c in job.shapes])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TableExtrapolationWarning)
                predicted = lat.price(step_shape(plan), plan)[0] - step_gap
            rows.append({"shapes": [list(s) for s in job.shapes], "measured_s": job.median, "predicted_s": predicted})
        real = np.array([r["measured_s"] for r in rows])
        pred = np.array([r["predicted_s"] for r in rows])
        rel = (pred - real) / real
        err = {
            "mean_abs_rel": round(float(np.mean(np.abs(rel))), 4),
            "p90_abs_rel": round(float(np.percentile(np.abs(rel), 90)), 4),
            "n": len(rows),
            "measured_on": (f"{len(rows)} random mixed batches (prefill chunks + decodes of unequal contexts, seed "
                            f"{spec.seed + 1}), off the grid, each measured whole (median over the sweep's rounds) "
                            f"and priced by the table less step_gap"),
            "sum_rel": round(float(pred.sum() / real.sum() - 1), 4),
        }
        return err, rows

    def metadata(self, table, *, dtype, bandwidth, raw_copy, heldout, heldout_rows, activation, linear_probe,
                 extrapolated, raw_steps, graphs_note, seconds, num_blocks) -> dict[str, Any]:
        from sim.latency.table_format import FORMAT_VERSION

        spec, s = self.spec, self.model_spec
        dtype_name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        per_block_full = PagedKVCache.bytes_per_block(s.num_layers, spec.block_size, s.kv_heads_per_rank(spec.tp),
                                                      s.head_dim, dtype)
        memory = device_memory(self.device)
        reserve = activation if activation is not None else CPU_ACTIVATION_RESERVE
        weights = s.weight_bytes(spec.tp)
        usable = int((memory * spec.gpu_memory_utilization - weights - reserve) // per_block_full) - 1
        model_dict = s.to_dict()
        model_dict["dtype"] = dtype_name
        if spec.num_layers is not None and spec.num_layers != s.num_layers:  # the table prices this depth
            model_dict["num_layers"] = spec.num_layers
            model_dict["name"] = f"{s.name}-{spec.num_layers}-layers"
        return {
            "format_version": FORMAT_VERSION,
            "source": "calib",
            "device": device_name(self.device),
            "model": model_dict,
            "dtype": dtype_name,
            "block_size": spec.block_size,
            "tensor_parallel": spec.tp,
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "grid": table.grid(),
            "torch_version": torch.__version__,
            "driver_version": driver_version(self.device),
            "num_gpu_blocks": max(usable, 0),
            "gpu_memory_utilization": spec.gpu_memory_utilization,
            "bandwidth": {k: round(v, 1) for k, v in bandwidth.items()},
            "heldout_error": heldout,
            "fit": {
                "method": "measured: linear = forward pass with attention reduced to its K/V write (one sequence of "
                          "T tokens); prefill_attn(n, c) and decode_attn(b, c̄) = whole step - L; overhead = "
                          "intercept of L; step_gap = engine host time per step without the forward pass "
                          "(vllm-v1, synthetic workload); see calib/profile.py",
                "limits": {"max_num_batched_tokens": spec.max_num_batched_tokens,
                           "max_model_len": spec.max_model_len, "max_num_seqs": spec.max_num_seqs},
                "timing": {"clock": self.timer.clock, "warmup": spec.warmup, "rounds": spec.repeats,
                           "max_point_s": spec.max_point_s,
                           "statistic": "median over rounds; each round times every job once, in random order"},
                "time_budget_s": spec.time_budget_s,
                "rounds_cap": self.log.get("rounds_cap"),
                "cuda_graphs": self.executor.uses_graphs,
                "cuda_graphs_note": graphs_note,
                "attention": self.runner.backend,
                "num_layers": spec.num_layers or s.num_layers,
                "torch_threads": torch.get_num_threads(),
                "profile_cache_blocks": num_blocks,
                "memory_bytes": memory,
                "activation_peak_bytes": activation,
                "kv_capacity": (f"(memory {memory} B x {spec.gpu_memory_utilization} - weights {weights} B - "
                                f"{'measured activation peak' if activation is not None else 'reserve'} {reserve} B)"
                                f" // {per_block_full} B per block - 1 null block"),
                "bandwidth_path": ("calib.executor.HostKVPool swap out (gather, copy to pinned host memory) and in"
                                   if self.device.type == "cuda" else
                                   "calib.executor.HostKVPool on a CPU: host memory to host memory (a memcpy "
                                   "figure, not PCIe)"),
                "bandwidth_detail": raw_copy,
                "linear_probe_s": {str(k): v for k, v in linear_probe.items()},
                "extrapolated": extrapolated,
                "measured_steps": [list(r) for r in raw_steps],
                "heldout_batches": heldout_rows,
                "profile_seconds": round(seconds, 1),
                "seed": spec.seed,
            },
        }


def engine_batch(shapes, allocator: BlockAllocator, block_size: int) -> list[SeqInput]:
    """:func:`calib.step.synthetic_batch` with explicit token ids, prepared as the engine's are."""
    return [SeqInput(s.num_new_tokens, s.context_len, s.block_table, [(i * 7 + 3) % 997] * s.num_new_tokens)
            for i, s in enumerate(synthetic_batch(shapes, allocator, block_size))]


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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu ({cpu}, {torch.get_num_threads()} torch thread(s))"


def device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def driver_version(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - optional: NVML may be missing; then try nvidia-smi
        import subprocess

        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            return None


def profile(spec: ProfileSpec, progress: Progress | None = None):
    """Run the sweep; returns a :class:`sim.latency.table_format.LatencyTable` with its metadata."""
    return Profiler(spec, progress).run()


def calibrate(spec: ProfileSpec, out, progress: Progress | None = None):
    """Profile and write the table folder ``out``; returns the table."""
    from sim.latency.table_format import write_table

    table = profile(spec, progress)
    write_table(out, table)
    return table
