"""Each request's outcome as typed columns: what the requests frame and the token-time statistics
are built from, written when the request ends so its record can go.

Why a module of its own: a :class:`sim.metrics.requests.RequestRecord` is a Python object of a few
hundred bytes (its slots, its times, its spec) kept from the start of the run to the frames; a
million-request run held a million of them beside the step columns at its peak. The
:class:`RequestTable` holds the same figures in one array per field (about 200 bytes a request),
so a run that lets its records go as they end (``Recorder(compact=True)``) keeps only the
requests in flight as objects. Every run builds its frame from the table (a run that keeps its
records writes them all at the end), so both ways give the same frame by construction.

Token times stay runs (``sim.metrics.requests``): per request the current run's first step and
first token, and, for the few whose runs were broken (a preemption, a step that skipped it),
the closed runs in a dict. :meth:`RequestTable.token_run_arrays` lays them out exactly as
:func:`sim.metrics.token_times.token_run_arrays` does from records.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STATES = ("unfinished", "finished", "rejected")  # a request's end state, by code
_CODE = {s: i for i, s in enumerate(STATES)}
_INT_FIELDS = (
    "replica",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "generated",
    "preemptions",
    "swaps",
    "client",
    "session",
    "turn",
    "spec_steps",
    "spec_proposed",
    "spec_accepted",
    "prefix_hit_tokens",
    "tier_hit_tokens",
    "run_step",
    "run_tok",
)
_FLOAT_FIELDS = ("arrival_s", "admitted_s", "first_token_s", "finish_s", "kv_load_s")


_FLUSH_ROWS = 4096  # rows written at once (RequestTable.write keeps them as tuples until then)



def _flushed(name: str) -> property:
    """A column read through the table: rows still buffered are written first, so a reader never
    sees a column without the requests that finished last."""
    def read(self):
        self.flush()
        return getattr(self, name)
    return property(read)

class RequestTable:
    """``n`` requests' figures, row ``i`` for the ``i``-th request added to the recorder.

    :meth:`write` keeps each row as two tuples and writes them into the columns a few thousand at
    once (one NumPy assignment per column, not one per field and request); every reader of the
    columns (the attributes below) writes the rows pending first."""

    def __init__(self, n: int, ids: list) -> None:
        """``ids``: every request's id, in row order, taken when the table is made (while every
        record is still held)."""
        self.n = n
        # np.empty: pages become resident as rows are written (every row is, before any frame)
        self._ints = {f: np.empty(n, dtype=np.int32) for f in _INT_FIELDS}
        self._floats = {f: np.empty(n, dtype=np.float64) for f in _FLOAT_FIELDS}
        self._state = np.empty(n, dtype=np.uint8)
        self._refused = np.empty(n, dtype=bool)
        self._opened = np.empty(n, dtype=bool)  # handed to a replica (its token runs index its steps)
        self._written = np.zeros(n, dtype=bool)
        # the frame's id column as pandas infers it from the list, but built now: the ids' str
        # objects then go with their specs (kept, they would hold the specs' memory pages too)
        self.ids = pd.array(ids, dtype="str") if all(type(i) is str for i in ids) else ids
        self.reasons: list = [None] * n
        self.closed_runs: dict[int, list[tuple[int, int]]] = {}  # broken runs: (first step, tokens)
        self._pending_ints: list[tuple] = []  # (row, the int fields...) per row written, not yet flushed
        self._pending_rest: list[tuple] = []  # (the float fields..., state, refused, opened)

    def write(self, i: int, rec) -> None:
        """Row ``i`` from a record (``rec.spec`` as it stands: a closed loop stamps its send)."""
        s = rec.spec
        req = rec.req
        if req is not None:
            generated, preemptions, swaps = req.num_output_tokens, req.num_preemptions, req.num_swaps
        else:
            generated, preemptions, swaps = rec._generated, rec._preemptions, rec._swaps
        self._pending_ints.append((
            i,
            rec.replica,
            s.prompt_tokens,
            s.output_tokens,
            s.max_tokens,
            generated,
            preemptions,
            swaps,
            s.client,
            s.session,
            s.turn,
            rec.spec_steps,
            rec.spec_proposed,
            rec.spec_accepted,
            rec.prefix_hit_tokens,
            rec.tier_hit_tokens,
            rec.run_step,
            rec.run_tok,
        ))
        self._pending_rest.append((s.arrival_s, rec.admitted_s, rec.first_token_s, rec.finish_s, rec.kv_load_s,
                                   _CODE[rec.state], rec.refused, rec.steps is not None))
        self.reasons[i] = rec.reason
        if rec.runs:
            self.closed_runs[i] = list(rec.runs)
        elif self.closed_runs:
            self.closed_runs.pop(i, None)
        if len(self._pending_ints) >= _FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write the rows kept by :meth:`write` into the columns, one NumPy assignment per column
        (every reader of the columns flushes first)."""
        if not self._pending_ints:
            return
        ints = np.array(self._pending_ints, dtype=np.int64)  # past 2**63: OverflowError, as before
        rest = np.array(self._pending_rest, dtype=np.float64)
        self._pending_ints, self._pending_rest = [], []
        rows = ints[:, 0]
        for j, f in enumerate(_INT_FIELDS, 1):
            col, values = self._ints[f], ints[:, j]
            if col.dtype == np.int32 and (values.min() < -(2**31) or values.max() >= 2**31):
                col = self._ints[f] = col.astype(np.int64)  # a count past 2**31 (a huge max_tokens)
            col[rows] = values
        for j, f in enumerate(_FLOAT_FIELDS):
            self._floats[f][rows] = rest[:, j]
        m = len(_FLOAT_FIELDS)
        self._state[rows] = rest[:, m]
        self._refused[rows] = rest[:, m + 1] != 0
        self._opened[rows] = rest[:, m + 2] != 0
        self._written[rows] = True

    ints = _flushed("_ints")
    floats = _flushed("_floats")
    state = _flushed("_state")
    refused = _flushed("_refused")
    opened = _flushed("_opened")
    written = _flushed("_written")

    def state_names(self) -> list[str]:
        return [STATES[c] for c in self.state.tolist()]

    def token_run_arrays(self, offsets: list[int], rows: np.ndarray | None = None):
        """(first step of every run, its length, runs per request) over ``rows`` (all when None), in
        row order then run order: a run's first step indexes every replica's steps laid end to end
        (``offsets``: where each replica's steps start), as the records' version does."""
        ints = self.ints
        rows = np.arange(self.n) if rows is None else rows
        gen = ints["generated"][rows].astype(np.int64)
        last = gen - ints["run_tok"][rows]
        has_last = last > 0
        base = np.zeros(len(rows), dtype=np.int64)
        opened = self.opened[rows]
        if len(offsets):
            base[opened] = np.asarray(offsets, dtype=np.int64)[ints["replica"][rows][opened]]
        n_closed = np.zeros(len(rows), dtype=np.int64)
        where = {}  # position in rows -> that request's closed runs
        for i, runs in self.closed_runs.items():
            j = int(np.searchsorted(rows, i))  # rows ascend
            if j < len(rows) and rows[j] == i:
                n_closed[j] = len(runs)
                where[j] = runs
        counts = n_closed + has_last
        first = np.cumsum(counts) - counts  # each request's first run's place
        total = int(counts.sum())
        starts = np.empty(total, dtype=np.int64)
        lengths = np.empty(total, dtype=np.int64)
        at = (first + n_closed)[has_last]
        starts[at] = (base + ints["run_step"][rows].astype(np.int64))[has_last]
        lengths[at] = last[has_last]
        for j, runs in where.items():
            b, f = int(base[j]), int(first[j])
            for k, (step, n) in enumerate(runs):
                starts[f + k] = b + step
                lengths[f + k] = n
        return starts, lengths, counts
