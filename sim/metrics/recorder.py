"""Per-request and per-step records of one run, collected as the engine goes.

Records are typed columns while the run is hot and become pandas DataFrames once at the end: no
DataFrame is built per step, and no Python object is made per step or per token.

* Steps: each replica appends its rows to its own :class:`ReplicaSteps` (one typed ``array`` per
  column, 4-byte counts and 8-byte times, plus the exact time each step ended). ``steps_frame()`` merges the replicas'
  rows in the order their steps ended (ties by replica index); the ``step`` column numbers the
  merged rows.
* Token times: a request's tokens are emitted at the ends of steps of its replica, and a running
  request emits at every step until it finishes, so its token times are stored as *runs* of
  consecutive steps, ``(first step, number of tokens)``, usually one or two runs per request.
  Token ``t`` of a request is at the end time of step ``run_step + (t - run_tok)`` of its current
  run; earlier runs (broken by a preemption, or by a step that did not schedule it) are closed
  into ``runs``. Every time is the very float the engine's clock showed when the token was
  emitted, so nothing is approximated.
* Requests: each request's figures go to a :class:`sim.metrics.request_table.RequestTable` (one
  typed array per field), when it ends in a compact run (its record is then let go), else when a
  frame is built; ``requests_frame()`` is that table, one row per request; ``token_times_s`` holds every token's time as a
  read-only NumPy array (for a request of one run, a slice of the step end times), unless the run emitted more than ``token_times_limit`` tokens (default
  :data:`TOKEN_TIMES_LIMIT`, environment variable ``CBSIM_TOKEN_TIMES_LIMIT``): then the column is
  left out to keep memory bounded (8 bytes per token would be 1.7 GB for a million chat
  requests), and :meth:`Recorder.itl_stats` gives the inter-token-latency figures of the summary
  exactly from the runs. :meth:`Recorder.token_times` still gives any one request's times.

Module layout: :mod:`sim.metrics.steps` (step columns, :class:`ReplicaSteps`, the steps frame),
:mod:`sim.metrics.requests` (:class:`RequestRecord`, :func:`emit_step_tokens`),
:mod:`sim.metrics.request_table` (the requests' columns),
:mod:`sim.metrics.token_times` (runs to times, ITL statistics); this module holds the
:class:`Recorder` that ties them together and the requests frame, and re-exports their names.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd

from sim.metrics.request_table import STATES, RequestTable
from sim.metrics.requests import HORIZON_REACHED, RequestRecord, emit_step_tokens, explain_unfinished
from sim.metrics.steps import STEP_COLUMNS, STORED_COLUMNS, ReplicaSteps, merge_steps_frame
from sim.metrics.token_times import flat_times_of_runs, itl_stats_of_runs, times_per_request, weighted_stats

__all__ = [
    "HORIZON_REACHED", "KV_REQUEST_COLUMNS", "REQUEST_COLUMNS", "SPEC_REQUEST_COLUMNS", "STEP_COLUMNS", "STORED_COLUMNS", "TOKEN_TIMES_LIMIT", "Recorder",
    "ReplicaSteps", "RequestRecord", "emit_step_tokens", "explain_unfinished", "token_times_limit",
    "weighted_stats",
]

REQUEST_COLUMNS = (
    "id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "max_tokens", "generated",
    "admitted_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "state", "reason",
    "refused", "preemptions", "swaps", "client", "session", "turn", "token_times_s",
)

# speculative decoding, per request: steps that verified drafts, drafts verified, drafts accepted
# (zeros without speculation; not in REQUEST_COLUMNS, so results written before them still load)
SPEC_REQUEST_COLUMNS = ("spec_steps", "spec_proposed", "spec_accepted")

# prefix caching, per request: prompt tokens found cached at admission (any tier), those of them
# loaded from tiers below the GPU instead of recomputed, and the seconds their copies took (zeros without offloading; not in REQUEST_COLUMNS either)
KV_REQUEST_COLUMNS = ("prefix_hit_tokens", "tier_hit_tokens", "kv_load_s")

STATE_FINISHED = STATES.index("finished")

TOKEN_TIMES_LIMIT = 20_000_000  # tokens (160 MB of times); beyond this, token_times_s stays out of memory


def token_times_limit() -> int:
    value = os.environ.get("CBSIM_TOKEN_TIMES_LIMIT")
    return int(value) if value else TOKEN_TIMES_LIMIT


class Recorder:
    """Collects one policy's run. Each replica appends its steps to :meth:`replica_steps`.

    ``compact``: a request's record is written to the :class:`RequestTable` when it ends
    (:meth:`ended`) and leaves ``records`` (its slot becomes None), so a long run holds only the
    requests in flight as objects; ``specs``: the workload's list, whose entries go with them
    (the caller is done with it). Without ``compact`` every record stays for the caller to read
    and is written to the table when a frame is built. Both build the frames from the table."""

    def __init__(self, compact: bool = False, specs: list | None = None) -> None:
        self.records: list[RequestRecord | None] = []
        self.replicas: list[ReplicaSteps] = []
        self.token_times_limit = token_times_limit()
        self.compact = compact
        self._specs = specs
        self._source = None  # a compact run's workload (expect)
        self._table: RequestTable | None = None

    def replica_steps(self, replica: int) -> ReplicaSteps:
        while len(self.replicas) <= replica:
            self.replicas.append(ReplicaSteps(len(self.replicas)))
        return self.replicas[replica]

    def add_request(self, rec: RequestRecord) -> None:
        rec.index = len(self.records)
        self.records.append(rec)

    def add_requests(self, records: list[RequestRecord]) -> None:
        """Every record of a run at once; an empty recorder takes the list itself (a Simulation's
        arrivals walk the same list that ended records leave)."""
        if self.records:
            for rec in records:
                self.add_request(rec)
            return
        for i, rec in enumerate(records):
            rec.index = i
        self.records = records

    def expect(self, specs, records: list) -> None:
        """A compact run of ``specs``: ``records`` (all None) gets each request's record as it
        arrives; the table is made now, with the ids."""
        self.records = records
        ids = specs.ids() if hasattr(specs, "ids") else [s.id for s in specs]
        self._table = RequestTable(len(records), ids)
        self._source = specs

    def open_the_rest(self, shareable) -> None:
        """At the end of a compact run: a record for every request that never arrived (its row
        not written, its slot empty), so the run's end can say why it is unfinished."""
        table, records = self._table, self.records
        missing = np.flatnonzero(~table.written).tolist()
        for i in missing:
            if records[i] is None:
                rec = RequestRecord(self._source[i])
                rec.shareable = shareable[i]
                rec.index = i
                records[i] = rec

    def ended(self, rec: RequestRecord) -> None:
        """A request has ended: with ``compact``, its row is written and its record let go."""
        if self.compact:
            i = rec.index
            self._rows().write(i, rec)
            self.records[i] = None
            if self._specs is not None:
                self._specs[i] = None

    def _rows(self) -> RequestTable:
        """The compact recorder's table, made at the first request's end (every request is added
        before the run starts)."""
        table = self._table
        if table is None:
            table = self._table = RequestTable(len(self.records), [r.spec.id for r in self.records])
        elif len(self.records) > table.n:
            raise RuntimeError("requests were added to a compact recorder after one had ended")
        return table

    def table(self) -> RequestTable:
        """The table with every record still held written in: the compact recorder's own (with the
        records left at the end), else a fresh one of every record (no frame shares a buffer with
        another, or changes when the records do)."""
        table = self._rows() if self.compact else RequestTable(len(self.records), [r.spec.id for r in self.records])
        for rec in self.records:
            if rec is not None:
                table.write(rec.index, rec)
        return table

    def _offsets(self) -> list[int]:
        offsets, total = [], 0
        for s in self.replicas:
            offsets.append(total)
            total += len(s)
        return offsets

    # --- token times --------------------------------------------------------------------------
    def total_tokens(self) -> int:
        return int(self.table().ints["generated"].sum())

    def token_times(self, index: int) -> np.ndarray:
        """Token times of the ``index``-th request (in workload order)."""
        rec = self.records[index]
        if rec is not None:
            return np.asarray(rec.token_times, dtype=float)
        starts, lengths, _ = self.table().token_run_arrays(self._offsets(), np.array([index]))
        return flat_times_of_runs(self.replicas, starts, lengths)

    def itl_stats(self, finished_only: bool = True) -> dict:
        """Inter-token-latency mean and percentiles over the finished requests (all with
        ``finished_only=False``), exact from the runs: :func:`sim.metrics.token_times.itl_stats_from_runs`."""
        table = self.table()
        rows = np.flatnonzero(table.state == STATE_FINISHED) if finished_only else None
        return itl_stats_of_runs(self.replicas, *table.token_run_arrays(self._offsets(), rows))

    # --- frames ------------------------------------------------------------------------------
    def requests_frame(self, token_times: bool | None = None) -> pd.DataFrame:
        """One row per request. ``token_times``: include ``token_times_s`` (default: when the
        run emitted at most ``token_times_limit`` tokens)."""
        t = self.table()
        ints, floats = t.ints, t.floats
        gen = ints["generated"]
        if token_times is None:
            token_times = int(gen.sum()) <= self.token_times_limit
        arrival, first, finish = floats["arrival_s"], floats["first_token_s"], floats["finish_s"]
        done = t.state == STATE_FINISHED
        nan = math.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            ttft = first - arrival
            e2e = np.where(done, finish - arrival, nan)
            tpot = np.where(done & (gen > 1), (finish - first) / np.where(gen > 1, gen - 1, 1), nan)
        cols = {
            "id": t.ids,
            "replica": ints["replica"],
            "arrival_s": arrival,
            "prompt_tokens": ints["prompt_tokens"],
            "output_tokens": ints["output_tokens"],
            "max_tokens": ints["max_tokens"],
            "generated": gen,
            "admitted_s": floats["admitted_s"],
            "first_token_s": first,
            "finish_s": finish,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "state": t.state_names(),
            "reason": t.reasons,
            "refused": t.refused,
            "preemptions": ints["preemptions"],
            "swaps": ints["swaps"],
            # closed loop: the client that sent it; sessions: session and turn (-1: none)
            "client": ints["client"],
            "session": ints["session"],
            "turn": ints["turn"],
        }
        for name in SPEC_REQUEST_COLUMNS + ("prefix_hit_tokens", "tier_hit_tokens"):
            cols[name] = ints[name]
        cols["kv_load_s"] = floats["kv_load_s"]
        columns = list(REQUEST_COLUMNS)
        columns[columns.index("swaps") + 1:columns.index("swaps") + 1] = SPEC_REQUEST_COLUMNS + KV_REQUEST_COLUMNS
        if token_times:
            cols["token_times_s"] = times_per_request(self.replicas, *t.token_run_arrays(self._offsets()))
        else:
            columns.remove("token_times_s")
        return pd.DataFrame(cols, columns=columns, copy=False)

    def steps_frame(self) -> pd.DataFrame:
        """One row per step, every replica's, in the order the steps ended (ties: replica index)."""
        return merge_steps_frame(self.replicas)
