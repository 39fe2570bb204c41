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

Module layout: :mod:`calib.profile.plan` (spec, grids, jobs), :mod:`calib.profile.timing` (timer,
linear probe, batches), :mod:`calib.profile.fill` (filling unmeasured points),
:mod:`calib.profile.extra_measures` (step_gap, bandwidth, activation peak),
:mod:`calib.profile.heldout` (held-out error) and :mod:`calib.profile.metadata` (the table's
metadata); this module runs the sweep and re-exports their public names.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from calib.executor import StepExecutor, make_executor
from calib.paged import PagedKVCache, cdiv
from calib.profile.extra_measures import activation_peak, measure_bandwidth, measure_step_gap
from calib.profile.fill import fill_rows, isotonic
from calib.profile.heldout import heldout_error
from calib.profile.metadata import (
    CPU_ACTIVATION_RESERVE,
    device_memory,
    device_name,
    driver_version,
    profile_metadata,
)
from calib.profile.plan import (
    DEVICE_LIMITS,
    DEVICE_TIMING,
    GIB,
    Job,
    ProfileSpec,
    Progress,
    mixed_batch,
    profile_grids,
)
from calib.profile.timing import ProbeGraphs, Timer, engine_batch, linear_forward
from calib.step import BlockAllocator, make_runner, release

__all__ = [
    "CPU_ACTIVATION_RESERVE", "DEVICE_LIMITS", "DEVICE_TIMING", "GIB", "Job", "ProbeGraphs", "ProfileSpec",
    "Profiler", "Progress", "Timer", "calibrate", "device_memory", "device_name", "driver_version",
    "engine_batch", "fill_rows", "isotonic", "linear_forward", "mixed_batch", "profile", "profile_grids",
]


@dataclass
class Profiler:
    """Runs one calibration: sets up the model and cache, times the jobs in rounds, and turns the
    medians into the table's components (see the module docstring)."""

    spec: ProfileSpec
    progress: Progress | None = None
    log: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from sim.hardware.models import get_model

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
            activation = activation_peak(spec, runner, allocator, self.device)
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

        step_gap = measure_step_gap(spec, runner)
        self._tick("engine overhead")
        components = {
            "overhead": make_component("overhead", (), overhead),
            "step_gap": make_component("step_gap", (), step_gap),
            "linear": make_component("linear", (lin_axis,), linear_vals),
            "prefill_attn": make_component("prefill_attn", (pre_n, pre_c), pre_vals),
            "decode_attn": make_component("decode_attn", (dec_b, dec_c), dec_vals),
        }
        table = LatencyTable(components, {})
        bandwidth, raw_copy = measure_bandwidth(runner, allocator, self.timer, self.device)
        self._tick("swap bandwidth")
        heldout, heldout_rows = heldout_error(spec, self.model_spec, table, [j for j in jobs if j.kind == "heldout"],
                                              step_gap)
        table.metadata = profile_metadata(
            spec, self.model_spec, self.device, table, dtype=dtype, bandwidth=bandwidth, raw_copy=raw_copy, heldout=heldout, heldout_rows=heldout_rows,
            activation=activation, linear_probe=L, extrapolated={"prefill_attn": pre_extra, "decode_attn": dec_extra},
            raw_steps=[[j.kind, *j.key, j.median] for j in jobs if j.kind in ("prefill", "decode")],
            graphs_note=graphs_note, seconds=time.perf_counter() - t_start, num_blocks=num_blocks,
            clock=self.timer.clock, cuda_graphs=executor.uses_graphs, attention=runner.backend,
            rounds_cap=self.log.get("rounds_cap"),
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


def profile(spec: ProfileSpec, progress: Progress | None = None):
    """Run the sweep; returns a :class:`sim.latency.table_format.LatencyTable` with its metadata."""
    return Profiler(spec, progress).run()


def calibrate(spec: ProfileSpec, out, progress: Progress | None = None):
    """Profile and write the table folder ``out``; returns the table."""
    from sim.latency.table_format import write_table

    table = profile(spec, progress)
    write_table(out, table)
    return table
