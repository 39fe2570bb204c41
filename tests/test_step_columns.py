"""The steps frame's storage: 4-byte counts, 8-byte times, and a replica whose count does not fit
in 4 bytes widened to 8 rather than failing or wrapping (sim.metrics.steps, issue 33: a million
requests are three million steps, and the bytes per step are the run's memory)."""

from __future__ import annotations

import numpy as np
import pytest

from policies.base import StepPlan
from sim.latency.base import step_shape
from sim.metrics.steps import STEP_COLUMNS, STORED_COLUMNS, ReplicaSteps, merge_steps_frame


class _Policy:
    """The figures a step row reads from a policy after the step."""

    def __init__(self, running: int, kv_tokens: int) -> None:
        self.num_running, self.num_waiting = running, 3
        self.kv_tokens = kv_tokens

    def kv_tokens_reserved_and_used(self):
        return self.kv_tokens, self.kv_tokens - 1

    def kv_blocks_used(self):
        return 7

    def cpu_blocks_used(self):
        return 0


def _row(steps: ReplicaSteps, t: float, kv_tokens: int) -> None:
    plan = StepPlan(scheduled=[], num_new_tokens=[5, 1], context=[0, 9])
    steps.append(t + 0.5, t, 0.5, _Policy(2, kv_tokens), step_shape(plan), plan, 0, 100, 2000.5)


def test_counts_are_int32_and_times_float64_in_the_frame():
    steps = ReplicaSteps(0)
    for i in range(3):
        _row(steps, float(i), 1000 + i)
    frame = merge_steps_frame([steps])
    assert list(frame.columns) == list(STEP_COLUMNS)
    assert frame["kv_reserved_tokens"].dtype == np.int32 and frame["step"].dtype == np.int32
    assert frame["start_s"].dtype == np.float64 and frame["bytes"].dtype == np.float64
    assert frame["flops"].dtype == np.int64  # every value an integer
    assert frame["kv_reserved_tokens"].tolist() == [1000, 1001, 1002]
    assert frame["prefill_tokens"].tolist() == [5] * 3 and frame["decode_tokens"].tolist() == [1] * 3


def test_a_count_past_int32_widens_the_replica_and_keeps_every_row():
    steps = ReplicaSteps(0)
    _row(steps, 0.0, 1000)
    _row(steps, 1.0, 2**31 + 5)  # does not fit in 4 bytes: this row again, 8-byte columns
    k = 3
    times = np.array([2.0, 2.5, 3.0, 3.5])
    steps.extend_decodes(
        times, np.full(k, 0.5), 4, 0, 4, [8] * k, 0, [2**33] * k, [9] * k, np.full(k, 50.0), np.full(k, 60.0)
    )
    assert len(steps) == 5 and all(len(steps.column(c)) == 5 for c in STORED_COLUMNS)
    assert all(c.typecode == "q" for c in steps.runs.values())  # the stretch's counts widened too
    frame = merge_steps_frame([steps])
    assert frame["kv_reserved_tokens"].dtype == np.int64
    assert frame["kv_reserved_tokens"].tolist() == [1000, 2**31 + 5] + [2**33] * k
    assert frame["kv_used_tokens"].tolist() == [999, 2**31 + 4, 9, 9, 9]
    assert frame["start_s"].tolist() == [0.0, 1.0, 2.0, 2.5, 3.0]


def test_a_stretch_of_lists_past_int32_widens_and_keeps_every_row():
    """A short stretch's values come as lists (``array.fromlist``: all or nothing); one that does
    not fit in 4 bytes (the last step's reserved tokens) writes the stretch again in 8 bytes."""
    steps = ReplicaSteps(0)
    _row(steps, 0.0, 1000)
    k = 3
    steps.extend_decodes([1.0, 1.5, 2.0, 2.5], [0.5] * k, 4, 0, 4, [8, 8, 9], 0, [2**20, 2**20, 2**31 + 7],
                         [9, 10, 11], [50.0] * k, [60, 61, 62])
    assert len(steps) == 4 and all(len(steps.column(c)) == 4 for c in STORED_COLUMNS)
    frame = merge_steps_frame([steps])
    assert frame["kv_reserved_tokens"].dtype == np.int64
    assert frame["kv_reserved_tokens"].tolist() == [1000, 2**20, 2**20, 2**31 + 7]
    assert frame["kv_blocks_used"].tolist() == [7, 8, 8, 9] and frame["kv_used_tokens"].tolist() == [999, 9, 10, 11]
    assert frame["start_s"].tolist() == [0.0, 1.0, 1.5, 2.0] and frame["duration_s"].tolist() == [0.5] * 4
    assert frame["bytes"].tolist() == [2000.5, 60.0, 61.0, 62.0] and frame["flops"].tolist() == [100, 50, 50, 50]


def test_replicas_of_both_widths_merge_to_int64_by_end_time():
    narrow, wide = ReplicaSteps(0), ReplicaSteps(1)
    _row(narrow, 0.0, 10)
    _row(narrow, 2.0, 11)
    _row(wide, 1.0, 2**32)
    frame = merge_steps_frame([narrow, wide])
    assert frame["replica"].tolist() == [0, 1, 0]
    assert frame["kv_reserved_tokens"].dtype == np.int64
    assert frame["kv_reserved_tokens"].tolist() == [10, 2**32, 11]


def _decode_rows(steps: ReplicaSteps, times, running, waiting, b, kv, cpu, reserved, used, flops, bytes_,
                 finished=0, running_after=None, last_waiting=None):
    """The rows ``extend_decodes`` stands for, written one by one through ``append``."""
    k = len(times) - 1
    plan = StepPlan(scheduled=[None] * b, num_new_tokens=[1] * b, context=[9] * b)
    shape = step_shape(plan)
    for j in range(k):
        last = j == k - 1
        pol = _Policy(running_after if last and finished else running, 0)
        pol.num_waiting = last_waiting if last and last_waiting is not None else waiting
        pol.kv_tokens_reserved_and_used = lambda j=j: (reserved[j], used[j])
        pol.kv_blocks_used = lambda j=j: kv[j]
        pol.cpu_blocks_used = lambda: cpu
        steps.append(times[j + 1], times[j], times[j + 1] - times[j], pol, shape, plan, finished if last else 0,
                     flops[j], bytes_[j])


def test_stretches_kept_once_give_the_frame_of_rows_written_one_by_one():
    """A stretch writes only the columns that change per step; the frame lays its constant
    columns (running, waiting, batch, CPU blocks, finishes in its last row, zeros) over its rows
    as if every row had been appended, between rows scheduled alone, lists or arrays alike."""
    kept, rows = ReplicaSteps(0), ReplicaSteps(0)
    for steps in (kept, rows):
        _row(steps, 0.0, 100)
    t1 = [0.5, 0.75, 1.0, 1.5]
    kept.extend_decodes(t1, [0.25, 0.25, 0.5], 4, 2, 4, [5, 6, 7], 3, [40, 44, 48], [39, 43, 47],
                        [1.5, 2.5, 3.5], [10.0, 11.0, 12.0], 2, 2)
    _decode_rows(rows, t1, 4, 2, 4, [5, 6, 7], 3, [40, 44, 48], [39, 43, 47], [1.5, 2.5, 3.5], [10.0, 11.0, 12.0],
                 2, 2)
    t2 = np.array([1.5, 2.0, 2.25])
    kept.extend_decodes(t2, np.diff(t2), 2, 1, 2, [7, 7], 0, [50, 52], [49, 51], np.array([4.0, 5.0]),
                        np.array([13.0, 14.0]))
    kept.set_last_waiting(6)  # an arrival in the stretch's last step
    _decode_rows(rows, t2, 2, 1, 2, [7, 7], 0, [50, 52], [49, 51], [4.0, 5.0], [13.0, 14.0], last_waiting=6)
    for steps in (kept, rows):
        _row(steps, 2.25, 101)
    rows.set_last_waiting(9)
    kept.set_last_waiting(9)  # on a row scheduled alone
    assert len(kept.columns["running"]) == 2  # the stretches' rows are not stored per row
    a, b = merge_steps_frame([kept]), merge_steps_frame([rows])
    assert len(a) == 7 and a.dtypes.tolist() == b.dtypes.tolist()
    assert a.equals(b)
    assert a["finished"].tolist() == [0, 0, 0, 2, 0, 0, 0] and a["running"].tolist() == [2, 4, 4, 2, 2, 2, 2]
    assert a["waiting"].tolist() == [3, 2, 2, 2, 1, 6, 9]
    # the laid-out columns replace the stepped rows' storage (no second copy), and are kept
    assert len(kept.columns["running"]) == 0 and merge_steps_frame([kept]).equals(a)
    assert not any(kept.runs.values())  # and the stretch table goes once every column is laid out
    with pytest.raises(RuntimeError, match="rows are final"):  # once a frame was built: no row lands misplaced
        _row(kept, 3.0, 102)
