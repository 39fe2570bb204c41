"""The steps frame's storage: 4-byte counts, 8-byte times, and a replica whose count does not fit
in 4 bytes widened to 8 rather than failing or wrapping (sim.metrics.steps, issue 33: a million
requests are three million steps, and the bytes per step are the run's memory)."""

from __future__ import annotations

import numpy as np

from policies.base import StepPlan
from sim.latency.base import step_shape
from sim.metrics.steps import STEP_COLUMNS, ReplicaSteps, merge_steps_frame


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
    assert len(steps) == 5 and all(len(c) == 5 for c in steps.columns.values())
    frame = merge_steps_frame([steps])
    assert frame["kv_reserved_tokens"].dtype == np.int64
    assert frame["kv_reserved_tokens"].tolist() == [1000, 2**31 + 5] + [2**33] * k
    assert frame["kv_used_tokens"].tolist() == [999, 2**31 + 4, 9, 9, 9]
    assert frame["start_s"].tolist() == [0.0, 1.0, 2.0, 2.5, 3.0]


def test_replicas_of_both_widths_merge_to_int64_by_end_time():
    narrow, wide = ReplicaSteps(0), ReplicaSteps(1)
    _row(narrow, 0.0, 10)
    _row(narrow, 2.0, 11)
    _row(wide, 1.0, 2**32)
    frame = merge_steps_frame([narrow, wide])
    assert frame["replica"].tolist() == [0, 1, 0]
    assert frame["kv_reserved_tokens"].dtype == np.int64
    assert frame["kv_reserved_tokens"].tolist() == [10, 2**32, 11]
