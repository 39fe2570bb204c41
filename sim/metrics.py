"""Per-request and per-step records of one run, collected as the engine goes.

Records are typed columns while the run is hot and become pandas DataFrames once at the end: no
DataFrame is built per step, and no Python object is made per step or per token.

* Steps: each replica appends its rows to its own :class:`ReplicaSteps` (one ``array`` of 8-byte
  values per column, plus the exact time each step ended). ``steps_frame()`` merges the replicas'
  rows in the order their steps ended (ties by replica index); the ``step`` column numbers the
  merged rows.
* Token times: a request's tokens are emitted at the ends of steps of its replica, and a running
  request emits at every step until it finishes, so its token times are stored as *runs* of
  consecutive steps, ``(first step, number of tokens)``, usually one or two runs per request.
  Token ``t`` of a request is at the end time of step ``run_step + (t - run_tok)`` of its current
  run; earlier runs (broken by a preemption, or by a step that did not schedule it) are closed
  into ``runs``. Every time is the very float the engine's clock showed when the token was
  emitted, so nothing is approximated.
* ``requests_frame()`` has one row per request; ``token_times_s`` holds every token's time as a
  NumPy array, unless the run emitted more than ``token_times_limit`` tokens (default
  :data:`TOKEN_TIMES_LIMIT`, environment variable ``CBSIM_TOKEN_TIMES_LIMIT``): then the column is
  left out to keep memory bounded (8 bytes per token would be 1.7 GB for a million chat
  requests), and :meth:`Recorder.itl_stats` gives the inter-token-latency figures of the summary
  exactly from the runs. :meth:`Recorder.token_times` still gives any one request's times.
"""

from __future__ import annotations

import math
import os
from array import array

import numpy as np
import pandas as pd

from policies.base import Request, Status, StepPlan

STEP_COLUMNS = (
    "replica",
    "step",
    "start_s",
    "duration_s",
    "running",
    "waiting",
    "num_seqs",
    "prefill_tokens",
    "decode_tokens",
    "batch_tokens",
    "padding_tokens",
    "admitted",
    "finished",
    "preempted",
    "rejected",
    "swap_out_blocks",
    "swap_in_blocks",
    "kv_blocks_used",
    "cpu_blocks_used",
    "kv_reserved_tokens",
    "kv_used_tokens",
    "flops",
    "bytes",
    "swap_s",  # of duration_s, the time charged for swapping KV blocks over PCIe
)
REQUEST_COLUMNS = (
    "id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "max_tokens", "generated",
    "admitted_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "state", "reason",
    "preemptions", "swaps", "token_times_s",
)
# columns a replica stores per step (``replica`` and ``step`` are added when frames are built)
STORED_COLUMNS = STEP_COLUMNS[2:]
_FLOAT_COLUMNS = ("start_s", "duration_s", "flops", "bytes", "swap_s")
_MAYBE_INT = ("flops", "bytes")  # int64 in the frame if every value was an integer

HORIZON_REACHED = "horizon reached"  # the reason of requests still held when simulated time stops
_FINISHED = Status.FINISHED

TOKEN_TIMES_LIMIT = 20_000_000  # tokens (160 MB of times); beyond this, token_times_s stays out of memory
_EXACT_INT_FLOAT = 2**53


def token_times_limit() -> int:
    value = os.environ.get("CBSIM_TOKEN_TIMES_LIMIT")
    return int(value) if value else TOKEN_TIMES_LIMIT


def _raw(values) -> np.ndarray:
    """float64 values as raw bytes for ``array('d').frombytes``."""
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint8)


class ReplicaSteps:
    """One replica's step rows: a typed column per stored field, and each step's end time."""

    def __init__(self, replica: int) -> None:
        self.replica = replica
        self.columns = {c: array("d" if c in _FLOAT_COLUMNS else "q") for c in STORED_COLUMNS}
        self.ends = array("d")  # the clock when each step ended: the time of its tokens
        self.all_int = {c: True for c in _MAYBE_INT}
        cols = self.columns
        self._append = tuple(cols[c].append for c in STORED_COLUMNS[:-3])

    def __len__(self) -> int:
        return len(self.ends)

    def append(self, end: float, start: float, duration: float, policy, shape, plan: StepPlan,
               n_finished: int, flops, bytes_, swap_s: float = 0.0) -> None:
        """One step's row: its times, its shape and plan, and the policy's figures after it
        (after ``finish_step``)."""
        reserved, used = policy.kv_tokens_reserved_and_used()
        (a_start, a_dur, a_run, a_wait, a_seqs, a_pre, a_dec, a_tok, a_pad, a_adm, a_fin, a_pree,
         a_rej, a_so, a_si, a_kv, a_cpu, a_res, a_used) = self._append
        a_start(start)
        a_dur(duration)
        a_run(policy.num_running)
        a_wait(policy.num_waiting)
        a_seqs(shape.num_seqs)
        a_pre(shape.prefill_tokens)
        a_dec(shape.decode_tokens)
        a_tok(shape.num_tokens)
        a_pad(plan.padding_tokens)
        a_adm(len(plan.admitted))
        a_fin(n_finished)
        a_pree(len(plan.preempted))
        a_rej(len(plan.rejected))
        a_so(plan.swap_out_blocks)
        a_si(plan.swap_in_blocks)
        a_kv(policy.kv_blocks_used())
        a_cpu(policy.cpu_blocks_used())
        a_res(reserved)
        a_used(used)
        self._add_maybe_int("flops", flops)
        self._add_maybe_int("bytes", bytes_)
        self.columns["swap_s"].append(swap_s)
        self.ends.append(end)

    def _add_maybe_int(self, name: str, value) -> None:
        if self.all_int[name] and isinstance(value, float):
            self.all_int[name] = False
        self.columns[name].append(value)

    def extend_decodes(self, times: np.ndarray, durations: np.ndarray, running: int, waiting: int,
                       num_seqs: int, kv_blocks_used, cpu_blocks_used: int, reserved, used,
                       flops: np.ndarray, bytes_: np.ndarray, finished: int = 0,
                       running_after: int | None = None) -> None:
        """Rows of ``k`` pure-decode steps at once: ``times`` holds the clock before the first
        step and after each one (``k + 1`` values). ``finished`` requests end in the last step,
        leaving ``running_after`` running."""
        k = len(durations)
        cols = self.columns
        cols["start_s"].frombytes(_raw(times[:-1]))
        cols["duration_s"].frombytes(_raw(durations))
        for name, value in (("running", running), ("waiting", waiting), ("num_seqs", num_seqs),
                            ("decode_tokens", num_seqs), ("batch_tokens", num_seqs),
                            ("cpu_blocks_used", cpu_blocks_used)):
            cols[name].extend(array("q", (value,)) * k)
        zeros = array("q", (0,)) * k
        for name in ("prefill_tokens", "padding_tokens", "admitted", "finished", "preempted",
                     "rejected", "swap_out_blocks", "swap_in_blocks"):
            cols[name].extend(zeros)
        if finished:
            cols["finished"][-1] = finished
            cols["running"][-1] = running_after
        cols["swap_s"].extend(array("d", (0.0,)) * k)
        cols["kv_blocks_used"].extend(kv_blocks_used)
        cols["kv_reserved_tokens"].extend(reserved)
        cols["kv_used_tokens"].extend(used)
        for name, values in (("flops", flops), ("bytes", bytes_)):
            if values.dtype.kind == "f":
                self.all_int[name] = False
            cols[name].frombytes(_raw(values))
        self.ends.frombytes(_raw(times[1:]))

    def column(self, name: str) -> np.ndarray:
        values = np.frombuffer(self.columns[name], dtype=np.float64 if name in _FLOAT_COLUMNS else np.int64)
        if name in _MAYBE_INT and self.all_int[name] and (not len(values) or np.abs(values).max() < _EXACT_INT_FLOAT):
            return values.astype(np.int64)
        return values

    def end_times(self) -> np.ndarray:
        return np.frombuffer(self.ends, dtype=np.float64)


class RequestRecord:
    """What happened to one request (seconds of simulated time; NaN = never happened)."""

    __slots__ = (
        "spec",
        "replica",
        "admitted_s",
        "first_token_s",
        "finish_s",
        "state",
        "reason",
        "req",
        # engine bookkeeping: the token count that ends the request, and the token-time runs
        "finish_at",
        "run_step",
        "run_tok",
        "runs",
        "steps",
        "_generated",
        "_preemptions",
        "_swaps",
    )

    def __init__(self, spec, replica: int = 0) -> None:
        self.spec = spec
        self.replica = replica
        self.admitted_s = float("nan")
        self.first_token_s = float("nan")
        self.finish_s = float("nan")
        self.state = "unfinished"
        self.reason = ""
        self.req: Request | None = None
        self.finish_at = 0
        self.run_step = 0  # replica step of the current run's first token
        self.run_tok = 0  # index of the current run's first token
        self.runs: list[tuple[int, int]] | None = None  # closed runs: (first step, tokens)
        self.steps: ReplicaSteps | None = None
        self._generated = 0
        self._preemptions = 0
        self._swaps = 0

    @property
    def generated(self) -> int:
        """Tokens emitted so far (the request's ``num_output_tokens``)."""
        return self.req.num_output_tokens if self.req is not None else self._generated

    @property
    def preemptions(self) -> int:
        return self.req.num_preemptions if self.req is not None else self._preemptions

    @property
    def swaps(self) -> int:
        return self.req.num_swaps if self.req is not None else self._swaps

    def open(self, seq: int, max_model_len: int, replica: int = 0, steps: ReplicaSteps | None = None) -> Request:
        """The request's scheduler state (a :class:`Request`, handed to a policy), and when it is
        done: once it has emitted its true output length, ``max_tokens``, or reached
        ``max_model_len`` (emitted tokens are ``num_output_tokens``: the engine is the only emitter)."""
        s = self.spec
        req = Request(s.id, s.arrival_s, s.prompt_tokens, s.max_tokens, s.priority, s.prompt_runs,
                      s.output_key, seq=seq)
        self.req = req
        self.replica = replica
        self.steps = steps
        self.finish_at = min(s.output_tokens, s.max_tokens, max_model_len - s.prompt_tokens)
        return req

    def mark_admitted(self, now: float) -> None:
        """A policy admitted the request; ``admitted_s`` keeps the first admission."""
        if self.admitted_s != self.admitted_s:  # NaN: not admitted before
            self.admitted_s = now

    def end(self, state: str, reason: str = "") -> None:
        """The request has ended (finished, rejected or unfinished): keep its counters and let its
        scheduler state go."""
        self.state = state
        self.reason = reason
        self.release()

    def break_run(self, step: int, token: int) -> None:
        """Token ``token`` is emitted at ``step``, not right after the previous token's step."""
        if self.runs is None:
            self.runs = []
        self.runs.append((self.run_step, token - self.run_tok))
        self.run_step = step
        self.run_tok = token

    def release(self) -> None:
        """The request has ended: keep its counters and let its scheduler state go."""
        req = self.req
        if req is not None:
            self._generated = req.num_output_tokens
            self._preemptions = req.num_preemptions
            self._swaps = req.num_swaps
            self.req = None

    def token_runs(self) -> list[tuple[int, int]]:
        """Every run of consecutive steps of this request's tokens: ``(first step, tokens)``."""
        out = list(self.runs) if self.runs else []
        n = self.generated - self.run_tok
        if n > 0:
            out.append((self.run_step, n))
        return out

    @property
    def token_times(self) -> array:
        """Every token's time (built from the runs and the replica's step end times)."""
        out = array("d")
        if self.steps is None:
            return out
        ends = self.steps.ends
        for first, n in self.token_runs():
            out.extend(ends[first:first + n])
        return out


def emit_step_tokens(scheduled: list[Request], records: dict[str, RequestRecord], step: int, now: float,
                     on_token=None) -> list[Request]:
    """After step ``step`` (of one replica) ended at ``now``: ``policies.base.emit_tokens`` and the
    end-of-request test in one pass, in batch order. Every scheduled request whose prompt (plus
    earlier outputs) is fully computed emits one token, recorded in its :class:`RequestRecord`'s
    token-time runs (and passed to ``on_token(req)`` when given); those that reach their
    ``finish_at`` are marked finished at ``now`` and returned, in batch order, for
    ``policy.finish_step``. Both engines (``sim.engine`` and ``calib.engine``) step through here."""
    finished = []
    for req in scheduled:
        out = req.num_output_tokens
        if req.num_computed_tokens >= req.prompt_tokens + out:
            req.num_output_tokens = out + 1
            if on_token is not None:
                on_token(req)
            rec = records[req.id]
            if out == 0:
                rec.first_token_s = now
                rec.run_step = step
                rec.run_tok = 0
            elif step - rec.run_step != out - rec.run_tok:
                rec.break_run(step, out)
            if out + 1 >= rec.finish_at:
                req.status = _FINISHED
                rec.finish_s = now
                finished.append(req)
    return finished


def explain_unfinished(records, horizon_s: float | None, horizon_reason: str = HORIZON_REACHED) -> None:
    """When a run stops: requests that are unfinished with no reason yet were held (queued,
    running or not yet arrived) at the horizon (``horizon_reason``), or, without one, never
    scheduled."""
    reason = horizon_reason if horizon_s is not None else "never scheduled"
    for rec in records:
        if rec.state == "unfinished" and not rec.reason:
            rec.reason = reason


class Recorder:
    """Collects one policy's run. Each replica appends its steps to :meth:`replica_steps`."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.replicas: list[ReplicaSteps] = []
        self.token_times_limit = token_times_limit()

    def replica_steps(self, replica: int) -> ReplicaSteps:
        while len(self.replicas) <= replica:
            self.replicas.append(ReplicaSteps(len(self.replicas)))
        return self.replicas[replica]

    def add_request(self, rec: RequestRecord) -> None:
        self.records.append(rec)

    # --- token times --------------------------------------------------------------------------
    def total_tokens(self) -> int:
        return sum(r.generated for r in self.records)

    def _runs(self, records):
        """Arrays over every run of the given records, in order: its first step (an index into
        every replica's steps laid end to end, as ``_all_ends``), its length, and per record
        the number of runs."""
        offsets, total = [], 0
        for s in self.replicas:
            offsets.append(total)
            total += len(s)
        starts, lengths, counts = [], [], []
        for r in records:
            n_runs = 0
            base = offsets[r.replica] if r.steps is not None else 0
            for first, n in r.token_runs():
                starts.append(base + first)
                lengths.append(n)
                n_runs += 1
            counts.append(n_runs)
        return (np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64),
                np.asarray(counts, dtype=np.int64))

    def _all_ends(self) -> np.ndarray:
        if not self.replicas:
            return np.zeros(0)
        return np.concatenate([s.end_times() for s in self.replicas])

    def _flat_token_times(self, records) -> tuple[np.ndarray, np.ndarray]:
        """Every token time of ``records``, flattened, and each record's token count."""
        starts, lengths, _ = self._runs(records)
        total = int(lengths.sum())
        if total == 0:
            return np.zeros(0), np.asarray([r.generated for r in records], dtype=np.int64)
        run_off = np.cumsum(lengths) - lengths
        idx = np.arange(total, dtype=np.int64) + np.repeat(starts - run_off, lengths)
        return self._all_ends()[idx], np.asarray([r.generated for r in records], dtype=np.int64)

    def token_times(self, index: int) -> np.ndarray:
        """Token times of the ``index``-th request (in workload order)."""
        return np.asarray(self.records[index].token_times, dtype=float)

    def itl_stats(self, finished_only: bool = True) -> dict:
        """Mean and percentiles of every gap between consecutive tokens of a request, over the
        finished requests, computed from the runs without building the per-token list.

        Within a run, a gap is the difference of two consecutive step end times, so each
        step's gap is counted once per request decoding across it (a weighted multiset);
        gaps across runs are added one by one. Percentiles are order statistics of that
        multiset, interpolated as ``numpy.percentile`` does (its default, linear method), so
        they equal what ``numpy.percentile`` gives on the full list."""
        from sim.summary import PERCENTILES

        records = [r for r in self.records if r.state == "finished"] if finished_only else self.records
        starts, lengths, counts = self._runs(records)
        ends = self._all_ends()
        n_steps = len(ends)
        weight = np.zeros(n_steps + 1, dtype=np.int64)
        long_runs = lengths > 1
        np.add.at(weight, starts[long_runs], 1)
        np.add.at(weight, starts[long_runs] + lengths[long_runs] - 1, -1)
        weight = np.cumsum(weight)[: max(n_steps - 1, 0)]
        gaps = np.diff(ends) if n_steps > 1 else np.zeros(0)
        # gaps between the runs of one request: previous run's last token to next run's first
        multi = np.flatnonzero(counts > 1)
        cross = []
        if multi.size:
            first_run = np.cumsum(counts) - counts
            for i in multi:
                a = int(first_run[i])
                for j in range(a, a + int(counts[i]) - 1):
                    cross.append(ends[starts[j + 1]] - ends[starts[j] + lengths[j] - 1])
        keep = weight > 0
        values = np.concatenate([gaps[keep], np.asarray(cross, dtype=np.float64)])
        weights = np.concatenate([weight[keep], np.ones(len(cross), dtype=np.int64)])
        return weighted_stats(values, weights, PERCENTILES)

    # --- frames ------------------------------------------------------------------------------
    def requests_frame(self, token_times: bool | None = None) -> pd.DataFrame:
        """One row per request. ``token_times``: include ``token_times_s`` (default: when the
        run emitted at most ``token_times_limit`` tokens)."""
        recs = self.records
        gen = np.fromiter((r.generated for r in recs), dtype=np.int64, count=len(recs))
        if token_times is None:
            token_times = int(gen.sum()) <= self.token_times_limit
        arrival = np.fromiter((r.spec.arrival_s for r in recs), dtype=np.float64, count=len(recs))
        first = np.fromiter((r.first_token_s for r in recs), dtype=np.float64, count=len(recs))
        finish = np.fromiter((r.finish_s for r in recs), dtype=np.float64, count=len(recs))
        state = [r.state for r in recs]
        done = np.fromiter((s == "finished" for s in state), dtype=bool, count=len(recs))
        nan = math.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            ttft = first - arrival
            e2e = np.where(done, finish - arrival, nan)
            tpot = np.where(done & (gen > 1), (finish - first) / np.where(gen > 1, gen - 1, 1), nan)
        cols = {
            "id": [r.spec.id for r in recs],
            "replica": np.fromiter((r.replica for r in recs), dtype=np.int64, count=len(recs)),
            "arrival_s": arrival,
            "prompt_tokens": np.fromiter((r.spec.prompt_tokens for r in recs), dtype=np.int64, count=len(recs)),
            "output_tokens": np.fromiter((r.spec.output_tokens for r in recs), dtype=np.int64, count=len(recs)),
            "max_tokens": np.fromiter((r.spec.max_tokens for r in recs), dtype=np.int64, count=len(recs)),
            "generated": gen,
            "admitted_s": np.fromiter((r.admitted_s for r in recs), dtype=np.float64, count=len(recs)),
            "first_token_s": first,
            "finish_s": finish,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "state": state,
            "reason": [r.reason for r in recs],
            "preemptions": np.fromiter((r.preemptions for r in recs), dtype=np.int64, count=len(recs)),
            "swaps": np.fromiter((r.swaps for r in recs), dtype=np.int64, count=len(recs)),
        }
        columns = list(REQUEST_COLUMNS)
        if token_times:
            flat, counts = self._flat_token_times(recs)
            bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
            tt = np.empty(len(recs), dtype=object)
            for i in range(len(recs)):
                tt[i] = flat[bounds[i]:bounds[i + 1]]
            cols["token_times_s"] = tt
        else:
            columns.remove("token_times_s")
        return pd.DataFrame(cols, columns=columns, copy=False)

    def steps_frame(self) -> pd.DataFrame:
        """One row per step, every replica's, in the order the steps ended (ties: replica index)."""
        reps = [s for s in self.replicas if len(s)]
        n = sum(len(s) for s in reps)
        cols: dict[str, np.ndarray] = {}
        if len(reps) <= 1:
            rep = reps[0] if reps else None
            cols["replica"] = np.full(n, rep.replica if rep else 0, dtype=np.int64)
            cols["step"] = np.arange(n, dtype=np.int64)
            for name in STORED_COLUMNS:
                cols[name] = rep.column(name) if rep else np.zeros(0, dtype=np.float64 if name in _FLOAT_COLUMNS else np.int64)
        else:
            replica = np.concatenate([np.full(len(s), s.replica, dtype=np.int64) for s in reps])
            order = np.lexsort((replica, np.concatenate([s.end_times() for s in reps])))
            cols["replica"] = replica[order]
            cols["step"] = np.arange(n, dtype=np.int64)
            for name in STORED_COLUMNS:
                parts = [s.column(name) for s in reps]
                if name in _MAYBE_INT and len({p.dtype for p in parts}) > 1:
                    parts = [p.astype(np.float64) for p in parts]
                cols[name] = np.concatenate(parts)[order]
        # the columns are fresh arrays or views of the replicas' buffers, which no longer change:
        # no copy (one block per column)
        return pd.DataFrame(cols, columns=list(STEP_COLUMNS), copy=False)


def weighted_stats(values: np.ndarray, weights: np.ndarray, percentiles) -> dict:
    """``sim.summary.stats`` of a multiset given as distinct-or-not values with integer counts."""
    n = int(weights.sum()) if len(weights) else 0
    if n == 0:
        return {"mean": None, **{f"p{p}": None for p in percentiles}}
    order = np.argsort(values, kind="stable")
    v = values[order]
    cum = np.cumsum(weights[order])
    out = {"mean": float(np.dot(values, weights.astype(np.float64)) / n)}

    def nth(i: int) -> np.float64:  # the i-th smallest element (0-based) of the multiset
        return v[int(np.searchsorted(cum, i, side="right"))]

    for p in percentiles:
        # numpy.percentile, method "linear": virtual index (n - 1) * q, then its _lerp
        q = np.true_divide(p, 100)
        virtual = (n - 1) * q
        lo = math.floor(virtual)
        if virtual >= n - 1:
            out[f"p{p}"] = float(nth(n - 1))
            continue
        a, b = nth(lo), nth(lo + 1)
        gamma = np.float64(virtual - lo)
        diff = b - a
        value = b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
        out[f"p{p}"] = float(value)
    return out
