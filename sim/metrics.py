"""Per-request and per-step records of one run, collected as the engine goes.

Records are plain columns (lists of numbers) while the run is hot and become pandas DataFrames
once at the end: no DataFrame is built per step. ``requests`` has one row per request (with every
token time); ``steps`` one row per step. ``sim.summary`` turns both into the summary.
"""

from __future__ import annotations

from array import array

import pandas as pd

from policies.base import Request, StepPlan

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
)


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
        "generated",
        "token_times",
        "req",
    )

    def __init__(self, spec, replica: int = 0) -> None:
        self.spec = spec
        self.replica = replica
        self.admitted_s = float("nan")
        self.first_token_s = float("nan")
        self.finish_s = float("nan")
        self.state = "unfinished"
        self.reason = ""
        self.generated = 0
        self.token_times = array("d")
        self.req: Request | None = None


class Recorder:
    """Collects one policy's run. The engine calls ``on_step`` once per step."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.cols: dict[str, list] = {c: [] for c in STEP_COLUMNS}
        self._step = 0

    def add_request(self, rec: RequestRecord) -> None:
        self.records.append(rec)

    def on_step(self, replica: int, start: float, duration: float, plan: StepPlan, policy,
                n_finished: int, shape, flops: float, bytes_: float) -> None:
        c = self.cols
        reserved, used = policy.kv_tokens_reserved_and_used()
        row = (
            replica, self._step, start, duration, policy.num_running, policy.num_waiting,
            shape.num_seqs, shape.prefill_tokens, shape.decode_tokens, shape.num_tokens,
            plan.padding_tokens, len(plan.admitted), n_finished, len(plan.preempted),
            len(plan.rejected), plan.swap_out_blocks, plan.swap_in_blocks,
            policy.kv_blocks_used(), policy.cpu_blocks_used(), reserved, used, flops, bytes_,
        )
        for name, value in zip(STEP_COLUMNS, row):
            c[name].append(value)
        self._step += 1

    def requests_frame(self) -> pd.DataFrame:
        rows = []
        for r in self.records:
            s = r.spec
            ttft = r.first_token_s - s.arrival_s
            e2e = r.finish_s - s.arrival_s if r.state == "finished" else float("nan")
            tpot = (
                (r.finish_s - r.first_token_s) / (r.generated - 1)
                if r.state == "finished" and r.generated > 1
                else float("nan")
            )
            req = r.req
            rows.append(
                (
                    s.id, r.replica, s.arrival_s, s.prompt_tokens, s.output_tokens, s.max_tokens,
                    r.generated, r.admitted_s, r.first_token_s, r.finish_s, ttft, tpot, e2e,
                    r.state, r.reason,
                    req.num_preemptions if req is not None else 0,
                    req.num_swaps if req is not None else 0,
                    r.token_times.tolist(),
                )
            )
        return pd.DataFrame(
            rows,
            columns=[
                "id", "replica", "arrival_s", "prompt_tokens", "output_tokens", "max_tokens",
                "generated", "admitted_s", "first_token_s", "finish_s", "ttft_s", "tpot_s",
                "e2e_s", "state", "reason", "preemptions", "swaps", "token_times_s",
            ],
        )

    def steps_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.cols, columns=list(STEP_COLUMNS))
