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

Module layout: :mod:`sim.metrics.steps` (step columns, :class:`ReplicaSteps`, the steps frame),
:mod:`sim.metrics.requests` (:class:`RequestRecord`, :func:`emit_step_tokens`),
:mod:`sim.metrics.token_times` (runs to times, ITL statistics); this module holds the
:class:`Recorder` that ties them together and the requests frame, and re-exports their names.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd

from sim.metrics.requests import HORIZON_REACHED, RequestRecord, emit_step_tokens, explain_unfinished
from sim.metrics.steps import STEP_COLUMNS, STORED_COLUMNS, ReplicaSteps, merge_steps_frame
from sim.metrics.token_times import flat_token_times, itl_stats_from_runs, weighted_stats

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

TOKEN_TIMES_LIMIT = 20_000_000  # tokens (160 MB of times); beyond this, token_times_s stays out of memory


def token_times_limit() -> int:
    value = os.environ.get("CBSIM_TOKEN_TIMES_LIMIT")
    return int(value) if value else TOKEN_TIMES_LIMIT


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

    def token_times(self, index: int) -> np.ndarray:
        """Token times of the ``index``-th request (in workload order)."""
        return np.asarray(self.records[index].token_times, dtype=float)

    def itl_stats(self, finished_only: bool = True) -> dict:
        """Inter-token-latency mean and percentiles over the finished requests (all with
        ``finished_only=False``), exact from the runs: :func:`sim.metrics.token_times.itl_stats_from_runs`."""
        records = [r for r in self.records if r.state == "finished"] if finished_only else self.records
        return itl_stats_from_runs(self.replicas, records)

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
            "refused": np.fromiter((r.refused for r in recs), dtype=bool, count=len(recs)),
            "preemptions": np.fromiter((r.preemptions for r in recs), dtype=np.int64, count=len(recs)),
            "swaps": np.fromiter((r.swaps for r in recs), dtype=np.int64, count=len(recs)),
            # closed loop: the client that sent it; sessions: session and turn (-1: none)
            "client": np.fromiter((r.spec.client for r in recs), dtype=np.int64, count=len(recs)),
            "session": np.fromiter((r.spec.session for r in recs), dtype=np.int64, count=len(recs)),
            "turn": np.fromiter((r.spec.turn for r in recs), dtype=np.int64, count=len(recs)),
        }
        for name in SPEC_REQUEST_COLUMNS:
            cols[name] = np.fromiter((getattr(r, name) for r in recs), dtype=np.int64, count=len(recs))
        cols["prefix_hit_tokens"] = np.fromiter((r.prefix_hit_tokens for r in recs), dtype=np.int64,
                                                count=len(recs))
        cols["tier_hit_tokens"] = np.fromiter((r.tier_hit_tokens for r in recs), dtype=np.int64, count=len(recs))
        cols["kv_load_s"] = np.fromiter((r.kv_load_s for r in recs), dtype=np.float64, count=len(recs))
        columns = list(REQUEST_COLUMNS)
        columns[columns.index("swaps") + 1:columns.index("swaps") + 1] = SPEC_REQUEST_COLUMNS + KV_REQUEST_COLUMNS
        if token_times:
            flat, counts = flat_token_times(self.replicas, recs)
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
        return merge_steps_frame(self.replicas)
