"""How one measurement is taken: the timer, the linear probe, and batches laid out as the engine's.

Why a module of its own: what a "second" means (CUDA events, the thread's CPU time, or wall
time) and how a batch is prepared must be the same for every grid point and held-out batch, and
the same as :mod:`calib.engine` uses; keeping it apart from the sweep's bookkeeping makes that
one place to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from calib.paged import write_kv
from calib.step import BlockAllocator, SeqInput, StepRunner, release, synthetic_batch


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


# the linear probe: a forward pass whose attention only writes K/V
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


def engine_batch(shapes, allocator: BlockAllocator, block_size: int) -> list[SeqInput]:
    """:func:`calib.step.synthetic_batch` with explicit token ids, prepared as the engine's are."""
    return [SeqInput(s.num_new_tokens, s.context_len, s.block_table, [(i * 7 + 3) % 997] * s.num_new_tokens)
            for i, s in enumerate(synthetic_batch(shapes, allocator, block_size))]
