"""A real continuous-batching engine: the simulator's policies choose, a real model runs.

This is the ground truth of ``cbsim validate X.yaml``. It serves a scenario's workload with the
same :mod:`policies` object the simulator drives, through the same protocol (``add_request`` on
arrival, ``schedule()``, the step, ``emit_tokens``, ``finish_step``), but the step is a real
forward pass of the model over a real paged KV cache (:class:`calib.executor.StepExecutor`) and
time is the engine's clock: a request is handed to the policy once the clock has passed its
arrival time, and a token's time is when the step that produced it returned. Whatever differs
between this run and a simulation of it is therefore the latency model's error, not the
scheduler's. The clock is the wall clock, except on a CPU with one torch thread, where it is the
engine thread's CPU time plus the idle waits (:func:`clock_kind` says why: a shared CPU).

Blocks. vLLM V1's policy keeps real block ids (:class:`policies.kv.paged.PagedKVManager`, pool
ids ``1..N`` with block 0 the null block, as vLLM): its block tables *are* the cache's, and its
prefix-cache hits point at blocks this engine really filled. The other policies keep counts only
(vLLM V0's and Sarathi's block managers, Orca's and static batching's reservations), so the
engine maps their requests onto real blocks on the side (:class:`calib.step.BlockAllocator` over
a pool of the policy's size), giving each request the blocks its computed tokens need and taking
them back when the policy preempts (recompute), swaps out or finishes it. Swaps copy the blocks
through :class:`calib.executor.HostKVPool` (really, paying the copy time inside the step).

Tokens. Prompt token ids are a stable hash of each token's identity ``(run key, index)``, so
prompts that share a prefix share ids (and prefix-cache hits hold the right K/V); generated
tokens are the model's own greedy choices, fed back; a recomputed request prefills its prompt and
its generated tokens again. Static batching's padding runs for real: its dummy tokens are
sequences whose block tables are all null block.

Records are :mod:`sim.metrics.recorder`' own (``Recorder``), filled through the same functions
:class:`sim.engine.Replica` uses (``RequestRecord.open``, ``emit_step_tokens``,
``ReplicaSteps.append``), so ``requests_frame()``, ``steps_frame()`` and
:func:`sim.metrics.summary.summarize` apply unchanged and the two runs are compared column for column.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from calib.paged import cdiv
from calib.step import BlockAllocator, SeqInput
from policies.base import Policy, Request, StepPlan
from policies.kv.paged import PagedKVManager
from sim.latency.base import LatencyModel, step_shape
from sim.metrics.recorder import Recorder, RequestRecord, emit_step_tokens, explain_unfinished
from sim.workload.request_spec import RequestSpec

NULL_BLOCK = 0


def token_id(identity: Any, vocab_size: int) -> int:
    """A stable token id for a token identity (the same in every process, unlike ``hash``)."""
    return zlib.crc32(repr(identity).encode()) % vocab_size


def prompt_token_ids(req: Request, vocab_size: int) -> list[int]:
    ids: list[int] = []
    for key, length in req.prompt_runs:
        ids.extend(token_id((key, i), vocab_size) for i in range(length))
    return ids[: req.prompt_tokens]


# ------------------------------------------------------------------------------------------------
# blocks: the policy's view -> the cache's blocks
# ------------------------------------------------------------------------------------------------
class PolicyBlocks:
    """Block tables read from a policy that keeps real block ids (vLLM V1's paged manager)."""

    shared = True

    def __init__(self, kv: PagedKVManager) -> None:
        self.kv = kv

    def table(self, req: Request, tokens: int) -> list[int]:
        table = self.kv.blocks_of(req)
        if len(table) * self.kv.block_size < tokens:
            raise AssertionError(f"{req.id}: the policy's block table covers {len(table)} blocks, "
                                 f"{tokens} tokens need {cdiv(tokens, self.kv.block_size)}")
        return table

    def holds(self, req: Request) -> list[int]:
        return self.kv.blocks_of(req)

    def drop(self, req: Request) -> None:  # the policy frees its own blocks
        pass

    def take(self, req: Request) -> list[int]:
        raise AssertionError("vllm-v1 does not swap")

    def give(self, req: Request, count: int) -> list[int]:
        raise AssertionError("vllm-v1 does not swap")

    def in_use(self) -> int:
        return self.kv.num_used_blocks


class SideBlocks:
    """Real blocks for a policy that keeps counts only: each request gets the blocks its tokens
    need, from a pool of the policy's size (plus the null block)."""

    shared = False

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self.tables: dict[str, list[int]] = {}

    def table(self, req: Request, tokens: int) -> list[int]:
        table = self.tables.setdefault(req.id, [])
        need = cdiv(tokens, self.block_size) - len(table)
        if need > 0:
            table.extend(self.allocator.allocate(need))
        return list(table)

    def holds(self, req: Request) -> list[int]:
        return list(self.tables.get(req.id, ()))

    def drop(self, req: Request) -> None:
        table = self.tables.pop(req.id, None)
        if table:
            self.allocator.free(table)

    def take(self, req: Request) -> list[int]:
        """Hand the request's blocks over (a swap out copies them first) and free them."""
        table = self.tables.pop(req.id, [])
        blocks = list(table)
        if table:
            self.allocator.free(table)
        return blocks

    def give(self, req: Request, count: int) -> list[int]:
        table = self.allocator.allocate(count)
        self.tables[req.id] = table
        return list(table)

    def in_use(self) -> int:
        return self.allocator.num_blocks - 1 - self.allocator.num_free


# ------------------------------------------------------------------------------------------------
# the engine
# ------------------------------------------------------------------------------------------------
@dataclass
class StepTrace:
    """What one step ran (kept for the tests and the step log): per request in batch order, (id,
    new tokens, context); the wall-clock span; who was preempted."""

    start_s: float
    end_s: float
    batch: tuple[tuple[str, int, int], ...]
    preempted: tuple[str, ...] = ()
    swap_blocks: int = 0
    swap_s: float = 0.0  # of the step, the time spent copying blocks to and from the host pool
    gap_s: float = 0.0  # host time after the forward pass: emitting, finishing, recording


@dataclass
class EngineRun:
    """The result of a real run: the recorder (sim.metrics.recorder), the step traces, the engine's settings."""

    recorder: Recorder
    steps: list[StepTrace]
    policy: Policy
    wall_s: float
    info: dict[str, Any] = field(default_factory=dict)

    def requests_frame(self):
        return self.recorder.requests_frame(token_times=True)

    def steps_frame(self):
        return self.recorder.steps_frame()


def clock_kind(device) -> str:
    """The clock a run on ``device`` keeps: ``"wall"`` (``time.perf_counter``), or ``"thread"`` on a
    CPU with one torch thread: the engine thread's CPU time, to which waits for arrivals are added
    without sleeping. Why: on a shared CPU the wall clock also counts the time other processes
    held the core, at random; the engine's own CPU time is what its steps would take on a core of
    its own (``calib.profile.calibrate`` times the table with the same clock). With several torch threads
    the work is spread over threads and only the wall clock measures it."""
    import torch

    device = torch.device(device)
    return "thread" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall"


class Clock:
    """Seconds since the run started, on the wall clock or the engine thread's CPU clock."""

    def __init__(self, kind: str = "wall") -> None:
        if kind not in ("wall", "thread"):
            raise ValueError(f"clock must be 'wall' or 'thread', got {kind!r}")
        self.kind = kind
        self._read = time.perf_counter if kind == "wall" else time.thread_time
        self.t0 = self._read()
        self.skipped = 0.0  # thread clock: idle time jumped over

    def now(self) -> float:
        return self._read() - self.t0 + self.skipped

    def sleep_until(self, t: float) -> None:
        delay = t - self.now()
        if delay <= 0:
            return
        if self.kind == "wall":
            time.sleep(delay)
        else:
            self.skipped += delay


class RealEngine:
    """Serves ``specs`` with ``policy`` on a real model (``executor``), on the engine's clock
    (the wall clock; on a CPU with one torch thread, that thread's CPU time: see :func:`clock_kind`)."""

    def __init__(self, policy: Policy, executor, *, max_model_len: int, latency: LatencyModel | None = None,
                 num_cpu_blocks: int = 0, check: bool = False, on_progress: Callable[[int], None] | None = None,
                 clock: Clock | None = None) -> None:
        self.policy = policy
        self.executor = executor
        runner = executor.runner
        self.block_size = runner.block_size
        self.vocab = runner.model.shape.vocab_size
        limits = policy.limits
        if runner.cache.num_blocks < limits.num_gpu_blocks + 1:
            raise ValueError(f"the cache holds {runner.cache.num_blocks} blocks; the policy's pool needs "
                             f"{limits.num_gpu_blocks} usable blocks plus the null block")
        if runner.block_size != limits.block_size:
            raise ValueError(f"cache block size {runner.block_size} != engine.block_size {limits.block_size}")
        kv = getattr(policy, "kv", None)
        self.blocks = PolicyBlocks(kv) if isinstance(kv, PagedKVManager) else SideBlocks(
            limits.num_gpu_blocks + 1, limits.block_size)
        self.max_model_len = max_model_len
        self.latency = latency
        self.check = check
        self.on_progress = on_progress
        self.clock = clock
        self.host_pool = None
        if num_cpu_blocks > 0:
            from calib.executor import HostKVPool

            self.host_pool = HostKVPool(runner.cache, num_cpu_blocks)
        self.swapped: dict[str, list[int]] = {}  # request id -> host blocks
        self.tokens: dict[str, list[int]] = {}  # request id -> prompt + generated token ids
        self.records: dict[str, RequestRecord] = {}

    # --- requests ------------------------------------------------------------------------------
    def _submit(self, rec: RequestRecord, seq: int) -> None:
        req = rec.open(seq, self.max_model_len, 0, rec.steps)
        self.records[req.id] = rec
        self.tokens[req.id] = prompt_token_ids(req, self.vocab)
        self.policy.add_request(req)

    def _end(self, req: Request, state: str, reason: str = "") -> None:
        self.records[req.id].end(state, reason)
        self.blocks.drop(req)
        host = self.swapped.pop(req.id, None)
        if host and self.host_pool is not None:
            self.host_pool.release(host)
        self.tokens.pop(req.id, None)
        if self.on_progress is not None:
            self.on_progress(1)

    # --- one step --------------------------------------------------------------------------
    def _apply_memory(self, plan: StepPlan) -> int:
        """Move real blocks as the plan says (before the forward pass, as engines do); returns the
        blocks copied."""
        copied = 0
        swapped_out = {id(r) for r in plan.swapped_out}
        for req in plan.preempted:  # recompute: its KV is dropped
            if id(req) not in swapped_out:
                self.blocks.drop(req)
        for req in plan.swapped_out:
            blocks = self.blocks.take(req)
            self.swapped[req.id] = self._pool().swap_out(blocks)
            copied += len(blocks)
        for req in plan.swapped_in:
            host = self.swapped.pop(req.id)
            self._pool().swap_in(host, self.blocks.give(req, len(host)))
            copied += len(host)
        return copied

    def _pool(self):
        if self.host_pool is None:
            raise RuntimeError("the policy swaps but the engine has no host swap pool (engine.swap_space_gib is 0)")
        return self.host_pool

    def _keep_sampled(self, plan: StepPlan, next_tokens) -> Callable[[Request], None]:
        """``on_token`` for :func:`sim.metrics.recorder.emit_step_tokens`: a request that emits keeps the
        token the model sampled for it (its next input)."""
        position = {req.id: i for i, req in enumerate(plan.scheduled)}
        tokens = self.tokens
        return lambda req: tokens[req.id].append(int(next_tokens[position[req.id]]))

    def _batch(self, plan: StepPlan) -> list[SeqInput]:
        batch = []
        for req, n, c in zip(plan.scheduled, plan.num_new_tokens, plan.context):
            ids = self.tokens[req.id]
            if c + n > len(ids):
                raise AssertionError(f"{req.id}: {n} tokens at context {c} but only {len(ids)} are known")
            batch.append(SeqInput(n, c, self.blocks.table(req, c + n), ids[c:c + n]))
        batch.extend(self._padding(plan))
        return batch

    def _padding(self, plan: StepPlan) -> list[SeqInput]:
        """Static batching's dummy tokens: in a prefill step one dummy sequence holding them all;
        in a decode step one dummy decode per finished slot, sharing the padding context evenly."""
        pad, ctx = plan.padding_tokens, plan.padding_context
        if pad <= 0:
            return []
        bs = self.block_size
        if ctx == 0:
            return [SeqInput(pad, 0, [NULL_BLOCK] * cdiv(pad, bs), [0] * pad)]
        out = []
        for i in range(pad):
            c = ctx // pad + (1 if i < ctx % pad else 0)
            out.append(SeqInput(1, c, [NULL_BLOCK] * cdiv(c + 1, bs), [0]))
        return out

    def check_blocks(self) -> None:
        """Conservation: every real block in use belongs to a request the policy holds, none is
        held twice (unless shared through the prefix cache), and the count matches the policy's."""
        policy = self.policy
        if isinstance(self.blocks, PolicyBlocks):
            held = set()
            for rec in self.records.values():
                if rec.req is not None:
                    held.update(self.blocks.holds(rec.req))
            if NULL_BLOCK in held:
                raise AssertionError("a request holds the null block")
            if len(held) != policy.kv_blocks_used():
                raise AssertionError(f"requests hold {len(held)} distinct blocks, the policy counts "
                                     f"{policy.kv_blocks_used()}")
            return
        side = self.blocks
        tables = [b for t in side.tables.values() for b in t]
        if len(tables) != len(set(tables)):
            raise AssertionError("a real block is mapped to two requests")
        if len(tables) != side.in_use():
            raise AssertionError(f"{len(tables)} blocks in tables, {side.in_use()} allocated")
        if side.in_use() > policy.kv_blocks_used():
            raise AssertionError(f"{side.in_use()} real blocks in use but the policy accounts for "
                                 f"{policy.kv_blocks_used()}")
        live = {rid for rid, rec in self.records.items() if rec.req is not None}
        if not set(side.tables) <= live:
            raise AssertionError(f"blocks held by ended requests {sorted(set(side.tables) - live)}")

    # --- the loop ------------------------------------------------------------------------------
    def run(self, specs: Sequence[RequestSpec], horizon_s: float | None = None) -> EngineRun:
        policy, executor = self.policy, self.executor
        recorder = Recorder()
        steps_out = recorder.replica_steps(0)
        records = [RequestRecord(s) for s in sorted(specs, key=lambda s: s.arrival_s)]
        for rec in records:
            recorder.add_request(rec)
            rec.steps = steps_out
        traces: list[StepTrace] = []
        clock = self.clock or Clock(clock_kind(self.executor.runner.cache.device))
        pending = 0  # next record to hand to the policy
        at_horizon = False
        while True:
            now = clock.now()
            if horizon_s is not None and now >= horizon_s:
                at_horizon = True
                break
            while pending < len(records) and records[pending].spec.arrival_s <= now:
                self._submit(records[pending], pending)
                pending += 1
            if not policy.has_work():
                if pending == len(records):
                    break
                clock.sleep_until(records[pending].spec.arrival_s)
                continue
            start = clock.now()
            plan = policy.schedule()
            for req in plan.rejected:
                self._end(req, "rejected", req.reject_reason or "rejected by the policy")
            if plan.is_empty:
                if pending == len(records):
                    for req in policy.drain():
                        self._end(req, "unfinished", "stuck: the policy cannot schedule it")
                    break
                clock.sleep_until(records[pending].spec.arrival_s)
                continue
            for req in plan.admitted:
                self.records[req.id].mark_admitted(start)
            before_swap = clock.now()
            copied = self._apply_memory(plan)
            swap_s = clock.now() - before_swap if copied else 0.0
            batch = self._batch(plan)
            next_tokens = executor.run(batch) if plan.scheduled or plan.padding_tokens else []
            end = clock.now()
            finished = emit_step_tokens(plan.scheduled, self.records, len(steps_out), end,
                                        on_token=self._keep_sampled(plan, next_tokens))
            policy.finish_step(plan, finished)
            for req in finished:
                self._end(req, "finished")
            shape = step_shape(plan)
            flops, bytes_ = self.latency.step_flops_bytes(shape) if self.latency is not None else (0.0, 0.0)
            steps_out.append(end, start, end - start, policy, shape, plan, len(finished), flops, bytes_, swap_s)
            if self.check:
                self.check_blocks()
            traces.append(StepTrace(start, end, tuple((r.id, n, c) for r, n, c in
                                                      zip(plan.scheduled, plan.num_new_tokens, plan.context)),
                                    tuple(r.id for r in plan.preempted), copied, swap_s))
            traces[-1].gap_s = clock.now() - end
        explain_unfinished(records, horizon_s)
        if self.check and not at_horizon:
            self.check_end()
        info = {"graphs": getattr(executor, "uses_graphs", False), "blocks": "policy" if self.blocks.shared else "side",
                "clock": clock.kind, "device": str(executor.runner.cache.device)}
        return EngineRun(recorder, traces, policy, clock.now(), info)

    def check_end(self) -> None:
        """After a run every request has ended: no real block, host block or token list is left."""
        if isinstance(self.blocks, SideBlocks) and self.blocks.in_use():
            raise AssertionError(f"{self.blocks.in_use()} real blocks still allocated after the run")
        if self.host_pool is not None and self.host_pool.num_used:
            raise AssertionError(f"{self.host_pool.num_used} host blocks still allocated after the run")
        if self.swapped:
            raise AssertionError(f"requests still swapped out: {sorted(self.swapped)}")
        if isinstance(self.blocks, PolicyBlocks) and self.policy.kv_blocks_used():
            raise AssertionError(f"the policy still holds {self.policy.kv_blocks_used()} blocks after the run")
