"""Per-step records: the step table's columns and each replica's rows, kept as typed arrays.

Why a module of its own: the engine appends one row per step (and batches of pure-decode rows
at once) on its hot path, so a replica's rows are typed ``array`` columns, never Python objects
or DataFrames; turning them into the ``steps`` frame, merged over replicas in the order the steps
ended, happens once at the end. Column layout and merge live here together.

Memory: a million-request run has three million steps, so the bytes per step are the run's
memory. Counts (tokens, requests, blocks) are stored as 4-byte ints (``array('i')``, the frame's
``int32``): every one is bounded by a batch, a KV pool or a workload, all far below 2**31. A
value that does not fit (a pool of more than two billion tokens) widens that replica's int
columns to 8 bytes (``int64`` in the frame) rather than failing. Times, ``flops``, ``bytes`` and
``swap_s`` stay 8-byte floats (or ``int64`` when every value was an integer). A single replica's
frame columns are views of its buffers, not copies (:func:`merge_steps_frame`).
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from policies.base import StepPlan

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
    "recomputed_tokens",  # of the step's tokens, KV computed again after a recompute preemption
    "spec_proposed",  # speculative decoding: draft tokens the step verified (in batch_tokens)
    "spec_accepted",  # of those, the ones the target accepted (each emitted with the bonus token)
    "prefix_hit_tokens",  # prompt tokens the prefix cache served to the requests first admitted this step
    "flops",
    "bytes",
    "swap_s",  # of duration_s, the time charged for swapping KV blocks over PCIe
)
# columns a replica stores per step (``replica`` and ``step`` are added when frames are built)
STORED_COLUMNS = STEP_COLUMNS[2:]
# columns added after results folders were first written: a folder without them still loads
ADDED_STEP_COLUMNS = ("prefix_hit_tokens",)
_FLOAT_COLUMNS = ("start_s", "duration_s", "flops", "bytes", "swap_s")
_MAYBE_INT = ("flops", "bytes")  # int64 in the frame if every value was an integer
_EXACT_INT_FLOAT = 2**53
COUNT_DTYPE = np.int32  # the frame's dtype of the count columns, and of ``replica`` and ``step``
_NUMPY_OF = {"i": np.int32, "q": np.int64, "d": np.float64}


def _put(col: array, values) -> None:
    """``col.extend(values)``; a list through ``array.fromlist``, 2-2.5x faster for a stretch's
    15 values (and all or nothing on an overflow, where extend leaves the values before it)."""
    if type(values) is list:
        col.fromlist(values)
    else:
        col.extend(values)


def _raw(values) -> np.ndarray:
    """float64 values as raw bytes for ``array('d').frombytes``."""
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint8)


# columns written for every row (a stretch's steps differ in them), and those a stretch of
# pure-decode steps holds constant (or zero) over its rows, kept once per stretch
_DENSE_COLUMNS = ("start_s", "duration_s", "kv_blocks_used", "kv_reserved_tokens", "kv_used_tokens", "flops",
                  "bytes")
_SPARSE_COLUMNS = tuple(c for c in STORED_COLUMNS if c not in _DENSE_COLUMNS)
# a stretch's rows: sparse column -> its field of the stretch table for every row but the last,
# and for the last (absent: 0)
_STRETCH_FIELDS = {
    "running": ("running", "running_last"),
    "waiting": ("waiting", "waiting_last"),
    "num_seqs": ("num_seqs", "num_seqs"),
    "decode_tokens": ("num_seqs", "num_seqs"),
    "batch_tokens": ("num_seqs", "num_seqs"),
    "cpu_blocks_used": ("cpu", "cpu"),
    "finished": (None, "finished"),
}
_RUN_FIELDS = ("first", "running", "running_last", "waiting", "waiting_last", "num_seqs", "cpu", "finished", "k")


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim``; elsewhere nothing).
    The stepped rows' arrays grew in the heap during the run; freed when their columns are laid
    out, they leave holes the heap keeps (about 30 MB at 300k requests) at the run's memory peak,
    the summary's, which comes after."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


class _RowsFinal:
    """Stands in for a replica's bound appends once :meth:`ReplicaSteps.column` laid its rows out:
    a later step unpacks it and learns why it cannot be recorded (free on the hot path)."""

    def __iter__(self):
        raise RuntimeError("the replica's step rows are final once a frame laid them out (ReplicaSteps.column): "
                           "no step can be recorded after the frame is built")


_ROWS_FINAL = _RowsFinal()


class ReplicaSteps:
    """One replica's step rows: typed columns, and each step's end time.

    A step scheduled alone (:meth:`append`) writes every column. A stretch of ``k`` pure-decode
    steps (:meth:`extend_decodes`) writes its ``k`` rows only in the columns that change from
    step to step (times, durations, KV figures, FLOPs and bytes: ``_DENSE_COLUMNS``); the rest
    are the same on every row of the stretch but its last (running, waiting, batch size, CPU
    blocks, finishes) or zero, and are kept once per stretch in ``runs``. :meth:`column` lays
    both out as one column of every row, in order: the frame is the same as if every row had
    been written, for a fraction of the work and memory per stretched step."""

    def __init__(self, replica: int) -> None:
        self.replica = replica
        self.columns = {c: array("d" if c in _FLOAT_COLUMNS else "i") for c in STORED_COLUMNS}
        self.ends = array("d")  # the clock when each step ended: the time of its tokens
        self.stepped = array("q")  # the row of each step written by append (the sparse columns' rows)
        # one entry per stretch (extend_decodes): its first row and length, and its counts (4
        # bytes, widened with the columns)
        self.runs = {f: array("q" if f in ("first", "k") else "i") for f in _RUN_FIELDS}
        self.all_int = {c: True for c in _MAYBE_INT}
        self._full: dict[str, np.ndarray] = {}  # sparse columns laid out over every row (column())
        self._layout = None  # (row count key, stretch rows) cached by _stretch_rows
        # stretch rows whose waiting is not their stretch's, and their waiting (set_last_waiting)
        self.waiting_rows, self.waiting_of_rows = array("q"), array("q")
        self._bind()

    def _bind(self) -> None:
        cols = self.columns
        self._append = tuple(cols[c].append for c in STORED_COLUMNS[:-3])
        runs = self.runs
        self._run_append = tuple(runs[f].append for f in _RUN_FIELDS)
        self._dense_ints = tuple(cols[c] for c in ("kv_blocks_used", "kv_reserved_tokens", "kv_used_tokens"))

    def _rollback(self) -> None:
        """Drop what a failed append or extend wrote: dense columns longer than ``ends``, sparse
        columns longer than ``stepped``, stretch fields longer than their ``k``."""
        n, m, r = len(self.ends), len(self.stepped), len(self.runs["k"])
        for name, col in self.columns.items():
            del col[n if name in _DENSE_COLUMNS else m:]
        for col in self.runs.values():
            del col[r:]

    def _widen(self) -> None:
        """A count did not fit in 4 bytes: drop the row being written and make every int column
        8 bytes wide."""
        if all(col.typecode != "i" for col in self.columns.values()):
            raise OverflowError("a step count does not fit in 8 bytes")
        self._rollback()
        for table in (self.columns, self.runs):
            for name, col in table.items():
                if col.typecode == "i":
                    table[name] = array("q", col)
        self._bind()

    def __len__(self) -> int:
        return len(self.ends)

    def append(self, end: float, start: float, duration: float, policy, shape, plan: StepPlan,
               n_finished: int, flops, bytes_, swap_s: float = 0.0, recomputed: int = 0,
               spec_proposed: int = 0, spec_accepted: int = 0) -> None:
        """One step's row: its times, its shape and plan, and the policy's figures after it
        (after ``finish_step``)."""
        try:
            reserved, used = policy.kv_tokens_reserved_and_used()
            (a_start, a_dur, a_run, a_wait, a_seqs, a_pre, a_dec, a_tok, a_pad, a_adm, a_fin, a_pree,
             a_rej, a_so, a_si, a_kv, a_cpu, a_res, a_used, a_recomp, a_prop, a_acc, a_hit) = self._append
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
            a_recomp(recomputed)
            a_prop(spec_proposed)
            a_acc(spec_accepted)
            hits = plan.prefix_hit_tokens
            a_hit(sum(hits.values()) if hits else 0)
            self._add_maybe_int("flops", flops)
            self._add_maybe_int("bytes", bytes_)
            self.columns["swap_s"].append(swap_s)
            self.stepped.append(len(self.ends))
            self.ends.append(end)
        except OverflowError:  # a count past 2**31: 8-byte columns from here on, and the row again
            self._widen()
            self.append(end, start, duration, policy, shape, plan, n_finished, flops, bytes_, swap_s, recomputed,
                        spec_proposed, spec_accepted)

    def _add_maybe_int(self, name: str, value) -> None:
        if self.all_int[name] and isinstance(value, float):
            self.all_int[name] = False
        self.columns[name].append(value)

    def extend_decodes(self, times, durations, running: int, waiting: int,
                       num_seqs: int, kv_blocks_used, cpu_blocks_used: int, reserved, used,
                       flops, bytes_, finished: int = 0,
                       running_after: int | None = None) -> None:
        """Rows of ``k`` pure-decode steps at once: ``times`` holds the clock before the first
        step and after each one (``k + 1`` values). ``finished`` requests end in the last step,
        leaving ``running_after`` running. The float sequences are NumPy arrays or lists (a
        short stretch priced in Python floats)."""
        try:
            cols = self.columns
            a_kv, a_res, a_used = self._dense_ints
            _put(a_kv, kv_blocks_used)
            _put(a_res, reserved)
            _put(a_used, used)
            (r_first, r_run, r_run_last, r_wait, r_wait_last, r_seqs, r_cpu, r_fin, r_k) = self._run_append
            r_first(len(self.ends))
            r_run(running)
            r_run_last(running_after if finished else running)
            r_wait(waiting)
            r_wait_last(waiting)
            r_seqs(num_seqs)
            r_cpu(cpu_blocks_used)
            r_fin(finished)
            r_k(len(durations))
            if type(times) is list:
                cols["start_s"].fromlist(times[:-1])
                _put(cols["duration_s"], durations)
                for name, values in (("flops", flops), ("bytes", bytes_)):
                    if self.all_int[name] and not all(type(v) is int for v in values):
                        self.all_int[name] = False
                    _put(cols[name], values)
                self.ends.fromlist(times[1:])
            else:
                cols["start_s"].frombytes(_raw(times[:-1]))
                cols["duration_s"].frombytes(_raw(durations))
                for name, values in (("flops", flops), ("bytes", bytes_)):
                    if values.dtype.kind == "f":
                        self.all_int[name] = False
                    cols[name].frombytes(_raw(values))
                self.ends.frombytes(_raw(times[1:]))
        except OverflowError:  # a count past 2**31: 8-byte columns from here on, and the rows again
            self._widen()
            self.extend_decodes(times, durations, running, waiting, num_seqs, kv_blocks_used, cpu_blocks_used,
                                reserved, used, flops, bytes_, finished, running_after)

    def _stretch_rows(self):
        """(every stretch row, in order; each stretch's last row; each stretch's length), as arrays."""
        key = (len(self.ends), len(self.runs["k"]))
        cached = self._layout
        if cached is not None and cached[0] == key:
            return cached[1]
        first = np.frombuffer(self.runs["first"], dtype=np.int64)
        k = np.frombuffer(self.runs["k"], dtype=np.int64)
        total = int(k.sum())
        offsets = np.cumsum(k) - k  # where each stretch starts among the stretch rows
        rows = np.arange(total, dtype=np.int64) + np.repeat(first - offsets, k)
        layout = (rows, first + k - 1, k)
        self._layout = (key, layout)
        return layout

    def column(self, name: str) -> np.ndarray:
        """The column over every row (int32, int64 or float64): a view of its buffer (no copy)
        for a column every row writes, an array laid out once (and kept in place of its stepped
        rows) for one a stretch keeps once. The replica's rows are final from then on."""
        col = self.columns[name]
        dtype = _NUMPY_OF[col.typecode]
        if name in _DENSE_COLUMNS:
            values = np.frombuffer(col, dtype=dtype)
            if name in _MAYBE_INT and self.all_int[name] and (
                    not len(values) or np.abs(values).max() < _EXACT_INT_FLOAT):
                return values.astype(np.int64)
            return values
        full = self._full.get(name)
        if full is not None:
            return full
        out = np.zeros(len(self.ends), dtype=dtype)
        out[np.frombuffer(self.stepped, dtype=np.int64)] = np.frombuffer(col, dtype=dtype)
        fields = _STRETCH_FIELDS.get(name)
        if fields is not None and len(self.runs["k"]):
            rows, last, k = self._stretch_rows()
            body, tail = fields
            if body is not None:
                body = self.runs[body]
                out[rows] = np.repeat(np.frombuffer(body, dtype=_NUMPY_OF[body.typecode]), k)
            tail = self.runs[tail]
            out[last] = np.frombuffer(tail, dtype=_NUMPY_OF[tail.typecode])
        if name == "waiting" and self.waiting_rows:
            out[np.frombuffer(self.waiting_rows, dtype=np.int64)] = np.frombuffer(self.waiting_of_rows, dtype=np.int64)
            self.waiting_rows, self.waiting_of_rows = array("q"), array("q")
        # the column laid out replaces its stepped rows' storage (no second copy beside the frame's
        # column); the rows are final: a later append or stretch fails instead of misplacing rows
        self._full[name] = out
        self.columns[name] = array(col.typecode)
        self._append = self._run_append = self._dense_ints = _ROWS_FINAL
        if len(self._full) == len(_SPARSE_COLUMNS):  # every column laid out: the layout's arrays go,
            self._layout = None  # and the stretch table (44 bytes a stretch: 42 MB for 1M requests)
            self.stepped = array("q")
            self.runs = {f: array(col.typecode) for f, col in self.runs.items()}
            release_freed_memory()
        return out

    def end_times(self) -> np.ndarray:
        return np.frombuffer(self.ends, dtype=np.float64)

    def set_last_waiting(self, waiting: int, rows: int = 1) -> None:
        """The last row's ``waiting``: requests arrived during a stretch's last step queue after
        it only (``sim.engine.Replica._apply_stretch``; the rows before keep the count before).
        ``rows`` 2: the last two rows of a stretch, the arrival in the step before its last
        (``sim.engine.Replica._prepare_stretch``'s ``late``): the one before the last is kept
        aside and laid over the column (:meth:`column`)."""
        if self.stepped and self.stepped[-1] == len(self.ends) - 1:
            self.columns["waiting"][-1] = waiting
        else:
            self.runs["waiting_last"][-1] = waiting
            if rows == 2:
                self.waiting_rows.append(len(self.ends) - 2)
                self.waiting_of_rows.append(waiting)


def merge_steps_frame(replicas) -> pd.DataFrame:
    """One row per step, every replica's, in the order the steps ended (ties: replica index)."""
    reps = [s for s in replicas if len(s)]
    n = sum(len(s) for s in reps)
    cols: dict[str, np.ndarray] = {}
    if len(reps) <= 1:
        rep = reps[0] if reps else None
        cols["replica"] = np.full(n, rep.replica if rep else 0, dtype=COUNT_DTYPE)
        cols["step"] = np.arange(n, dtype=COUNT_DTYPE if n < 2**31 else np.int64)
        for name in STORED_COLUMNS:
            cols[name] = rep.column(name) if rep else np.zeros(0, dtype=np.float64 if name in _FLOAT_COLUMNS else COUNT_DTYPE)
    else:
        replica = np.concatenate([np.full(len(s), s.replica, dtype=COUNT_DTYPE) for s in reps])
        order = np.lexsort((replica, np.concatenate([s.end_times() for s in reps])))
        cols["replica"] = replica[order]
        del replica
        cols["step"] = np.arange(n, dtype=COUNT_DTYPE if n < 2**31 else np.int64)
        for name in STORED_COLUMNS:
            parts = [s.column(name) for s in reps]
            if name in _MAYBE_INT and len({p.dtype for p in parts}) > 1:
                parts = [p.astype(np.float64) for p in parts]
            cols[name] = np.concatenate(parts)[order]  # a replica widened to int64: int64 for all
    # the columns are fresh arrays or views of the replicas' buffers, which no longer change:
    # no copy (one block per column)
    return pd.DataFrame(cols, columns=list(STEP_COLUMNS), copy=False)
