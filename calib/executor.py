"""How calib runs a step on the device: the one path the profiler times and the real engine runs.

Why a layer above :class:`calib.step.StepRunner`: serving engines do not launch every step the
same way, and the way matters for step time. vLLM replays *CUDA graphs* for pure-decode steps
(one graph per captured batch size; the batch is padded up to the next captured size), because a
decode step of a large model issues hundreds of small kernels whose launch time would otherwise
exceed the GPU time; steps with prefill tokens run eagerly. :class:`StepExecutor` does the same,
and both :mod:`calib.profile.calibrate` and :mod:`calib.engine` go through it, so a table measures exactly
how the engine runs.

:class:`DecodeGraphs` holds the static input buffers of the graphs: per padded request, the new
token, its position, its slot, its sequence length and its block table row (the table is as wide
as ``max_model_len`` needs, so any context fits one graph). Padding requests are one-token
sequences at position 0 whose block table is all null block (block 0): they write their K/V into
the null block, which no real request reads, and attend to themselves only. The Triton kernel
sizes its launch from shapes alone and reads lengths from device memory, so one captured graph
serves every batch of its size; its split-KV factor is fixed at capture for the longest context.
Without CUDA (or with the reference attention) ``DecodeGraphs(..., capture=False)`` runs the same
padded buffers eagerly: that is how the tests check the padding on a CPU.

:class:`HostKVPool` is the swap space: a request's blocks are gathered out of the device cache
into host memory (pinned on CUDA) and scattered back into freshly allocated blocks later; the
profiler times this very path to measure the swap bandwidth.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from calib.paged import AttentionMetadata, cdiv
from calib.step import SeqInput, StepInputs, StepRunner, synthetic_token_ids


def default_graph_sizes(max_batch: int) -> list[int]:
    """vLLM's capture sizes: 1, 2, 4, then every multiple of 8, up to ``max_batch`` (included)."""
    sizes = [s for s in (1, 2, 4) if s <= max_batch]
    sizes += list(range(8, max_batch + 1, 8))
    if not sizes or sizes[-1] < max_batch:
        sizes.append(max_batch)
    return sizes


def is_decode_batch(batch: Sequence[SeqInput]) -> bool:
    """Every request computes exactly one token (what a decode graph can run)."""
    return all(seq.num_new_tokens == 1 for seq in batch)


class DecodeGraphs:
    """CUDA graphs of one-token-per-request steps, one per padded batch size."""

    def __init__(self, runner: StepRunner, *, max_model_len: int, batch_sizes: Sequence[int],
                 capture: bool = True) -> None:
        if not batch_sizes:
            raise ValueError("DecodeGraphs needs at least one batch size")
        self.runner = runner
        self.block_size = runner.block_size
        self.width = cdiv(max_model_len + 1, self.block_size)  # a decode at context max_model_len fits
        self.sizes = sorted(set(int(s) for s in batch_sizes))
        self.captured = False
        device = runner.cache.device
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(n, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((n, self.width), dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.last_token_index = torch.arange(n, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        # host staging, one contiguous pinned row per buffer: ids, positions, slots, lengths
        self._host_rows = torch.zeros((4, n), dtype=torch.int64, pin_memory=pin)
        self._host_tables = torch.zeros((n, self.width), dtype=torch.int32, pin_memory=pin)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture()

    def inputs(self, size: int, context_lens: Sequence[int] | None = None) -> StepInputs:
        """The static buffers' first ``size`` rows as a step. ``context_lens`` are the host-side
        lengths (what launches are sized from); captured graphs use the longest possible."""
        if context_lens is None:
            context_lens = (self.width * self.block_size - 1,) * size
        meta = AttentionMetadata(
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            slot_mapping=self.slot_mapping[:size],
            positions=self.positions[:size],
            query_lens=(1,) * size,
            context_lens=tuple(int(c) for c in context_lens),
            block_size=self.block_size,
        )
        return StepInputs(self.input_ids[:size], meta, self.last_token_index[:size])

    def _capture(self) -> None:
        """Capture every size, largest first, in one shared memory pool (as vLLM does)."""
        runner = self.runner
        pool = None
        for size in reversed(self.sizes):
            inputs = self.inputs(size)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up (compiles the kernels) off the capture
                runner.execute(inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = runner.execute(inputs)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        self.captured = True

    def size_for(self, batch_size: int) -> int | None:
        for s in self.sizes:
            if s >= batch_size:
                return s
        return None

    def fits(self, batch: Sequence[SeqInput]) -> bool:
        return (is_decode_batch(batch) and self.size_for(len(batch)) is not None
                and all(cdiv(s.context_len + 1, self.block_size) <= self.width for s in batch))

    def run(self, batch: Sequence[SeqInput]) -> torch.Tensor:
        """Fill the buffers with ``batch`` (padded) and run it; each request's next token [B]
        on the device (no host synchronisation)."""
        b = len(batch)
        size = self.size_for(b)
        bs = self.block_size
        rows = self._host_rows[:, :size].numpy()
        tables = self._host_tables[:size].numpy()
        rows[:] = 0
        rows[3] = 1  # padding: one token at position 0, in the null block
        tables[:] = 0
        vocab = self.runner.model.shape.vocab_size
        for i, seq in enumerate(batch):
            c = seq.context_len
            need = cdiv(c + 1, bs)
            table = seq.block_table
            tables[i, :need] = table[:need]
            token = (int(seq.token_ids[0]) if seq.token_ids is not None
                     else int(synthetic_token_ids(i, c, 1, vocab)[0]))
            rows[:, i] = (token, c, int(table[c // bs]) * bs + c % bs, c + 1)
        host = self._host_rows
        self.input_ids[:size].copy_(host[0, :size], non_blocking=True)
        self.positions[:size].copy_(host[1, :size], non_blocking=True)
        self.slot_mapping[:size].copy_(host[2, :size], non_blocking=True)
        self.seq_lens[:size].copy_(host[3, :size], non_blocking=True)
        self.block_tables[:size].copy_(self._host_tables[:size], non_blocking=True)
        if self.captured:
            self.graphs[size].replay()
            return self.outputs[size][:b]
        contexts = [seq.context_len for seq in batch] + [0] * (size - b)
        return self.runner.execute(self.inputs(size, contexts))[:b]


class StepExecutor:
    """Runs a batch the way the engine does: decode steps from CUDA graphs when there are any,
    everything else eagerly through :meth:`StepRunner.step`."""

    def __init__(self, runner: StepRunner, *, max_model_len: int, max_batch: int,
                 cuda_graphs: bool | None = None, graph_sizes: Sequence[int] | None = None) -> None:
        self.runner = runner
        device = runner.cache.device
        possible = device.type == "cuda" and runner.backend == "triton"
        if cuda_graphs is None:
            cuda_graphs = possible
        if cuda_graphs and not possible:
            raise ValueError(f"CUDA graphs need a CUDA device and the Triton attention; this runner is on "
                             f"{device} with the {runner.backend!r} attention")
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs:
            sizes = graph_sizes or default_graph_sizes(max_batch)
            self.graphs = DecodeGraphs(runner, max_model_len=max_model_len, batch_sizes=sizes)

    @property
    def uses_graphs(self) -> bool:
        return self.graphs is not None

    def launch(self, batch: Sequence[SeqInput]) -> torch.Tensor:
        """Start the step; next tokens [B] on the device (not yet synchronised)."""
        if self.graphs is not None and self.graphs.fits(batch):
            return self.graphs.run(batch)
        return self.runner.execute(self.runner.prepare(batch))

    def run(self, batch: Sequence[SeqInput]) -> list[int]:
        """Run the step to completion; each request's next token, in batch order."""
        return self.launch(batch).tolist()


def make_executor(runner: StepRunner, *, max_model_len: int, max_batch: int,
                  cuda_graphs: bool | None = None) -> tuple[StepExecutor, str | None]:
    """A :class:`StepExecutor`, and a note when CUDA graphs were wanted by default but could not
    be captured (then decode steps run eagerly; an explicit ``cuda_graphs=True`` raises instead)."""
    try:
        return StepExecutor(runner, max_model_len=max_model_len, max_batch=max_batch, cuda_graphs=cuda_graphs), None
    except Exception as exc:  # noqa: BLE001 - any capture failure (CUDA, Triton) falls back, and is reported
        if cuda_graphs:
            raise
        if runner.cache.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        note = f"CUDA graph capture failed ({type(exc).__name__}: {exc}); decode steps run eagerly"
        return StepExecutor(runner, max_model_len=max_model_len, max_batch=max_batch, cuda_graphs=False), note


class HostKVPool:
    """Host memory for swapped-out KV blocks, grown on demand up to ``max_blocks``.

    Blocks are stored block-major (``[blocks, layers, 2, block_size, kv_heads, head_dim]``) so that
    one block's K and V of every layer are one contiguous run of bytes. On CUDA the copies go
    through a pinned staging buffer (full-speed DMA, no page-locking per swap) and are
    synchronous, so a step's swaps are complete, and paid for, before its forward pass."""

    def __init__(self, cache, max_blocks: int, initial_blocks: int = 64) -> None:
        self.cache = cache
        self.max_blocks = max(max_blocks, 1)
        self.pin = cache.device.type == "cuda"
        self.block_shape = (cache.num_layers, 2, *cache.data.shape[3:])
        self.data = self._alloc(min(max(initial_blocks, 1), self.max_blocks), pin=False)
        self._free = list(range(self.data.shape[0] - 1, -1, -1))
        self._staging = self._alloc(min(max(initial_blocks, 1), self.max_blocks), pin=self.pin) if self.pin else None

    def _alloc(self, blocks: int, pin: bool) -> torch.Tensor:
        return torch.empty((blocks, *self.block_shape), dtype=self.cache.dtype, pin_memory=pin)

    @property
    def num_used(self) -> int:
        return self.data.shape[0] - len(self._free)

    def _take(self, n: int) -> list[int]:
        if n > len(self._free):
            have = self.data.shape[0]
            need = self.num_used + n
            if need > self.max_blocks:
                raise RuntimeError(f"host swap pool exhausted: {need} blocks needed, {self.max_blocks} allowed")
            grown = self._alloc(min(self.max_blocks, max(need, 2 * have)), pin=False)
            grown[:have].copy_(self.data)
            self._free = list(range(grown.shape[0] - 1, have - 1, -1)) + self._free
            self.data = grown
        return [self._free.pop() for _ in range(n)]

    def _stage(self, n: int) -> torch.Tensor:
        if self._staging.shape[0] < n:
            self._staging = self._alloc(max(n, 2 * self._staging.shape[0]), pin=True)
        return self._staging[:n]

    def swap_out(self, device_blocks: Sequence[int]) -> list[int]:
        """Copy blocks out of the device cache; returns their host ids."""
        host = self._take(len(device_blocks))
        if host:
            idx = torch.as_tensor(list(device_blocks), dtype=torch.int64, device=self.cache.device)
            gathered = self.cache.data.index_select(2, idx).movedim(2, 0)  # [n, layers, 2, ...]
            if self.pin:
                staged = self._stage(len(host))
                staged.copy_(gathered)
                gathered = staged
            self.data.index_copy_(0, torch.as_tensor(host, dtype=torch.int64), gathered)
        return host

    def swap_in(self, host_blocks: Sequence[int], device_blocks: Sequence[int]) -> None:
        """Copy host blocks back into the given device blocks and release the host ones."""
        if len(host_blocks) != len(device_blocks):
            raise ValueError(f"swap in of {len(host_blocks)} host blocks into {len(device_blocks)} device blocks")
        if host_blocks:
            hidx = torch.as_tensor(list(host_blocks), dtype=torch.int64)
            if self.pin:
                src = torch.index_select(self.data, 0, hidx, out=self._stage(len(host_blocks)))
                src = src.to(self.cache.device)
            else:
                src = self.data.index_select(0, hidx)
            idx = torch.as_tensor(list(device_blocks), dtype=torch.int64, device=self.cache.device)
            self.cache.data.index_copy_(2, idx, src.movedim(0, 2))
        self.release(host_blocks)

    def release(self, host_blocks: Sequence[int]) -> None:
        self._free.extend(host_blocks)
