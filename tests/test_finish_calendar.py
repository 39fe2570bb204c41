"""The engine's finish calendar (sim.finish_calendar): who finishes when, without a pass per step.

The calendar itself against its definition (the least margin, the finishing members in rank
order), and the engine with it: on the fast-forward's workloads the calendar is used (stretches
and bulk steps without a pass over their batch) and the runs equal those stepped one by one, and
whenever it is kept it holds exactly the running requests with their true margins."""

from __future__ import annotations

import random

import pytest

import sim.engine
from sim.finish_calendar import FinishCalendar
from tests.test_fast_forward import CASES, run_with_and_without_fast_forward


def test_margin_and_finishes_follow_the_definition():
    rng = random.Random(3)
    for _ in range(200):
        margins = {i: rng.randint(1, 30) for i in range(rng.randint(0, 40))}  # rank -> tokens to go
        cal = FinishCalendar([(m, i, f"r{i}") for i, m in margins.items()], len(margins))
        next_rank = len(margins)
        while margins:
            least = min(margins.values())
            assert cal.margin(999) == least
            k = rng.randint(1, least)
            out = cal.advance(k)
            margins = {i: m - k for i, m in margins.items()}
            assert out == [f"r{i}" for i in sorted(margins) if margins[i] == 0]  # rank order
            margins = {i: m for i, m in margins.items() if m > 0}
            if rng.random() < 0.3:  # a request joins the running list's end
                m = rng.randint(1, 20)
                cal.enter(f"r{next_rank}", m)
                margins[next_rank] = m
                next_rank += 1
        assert cal.margin(7) == 7 and cal.advance(3) == [] and not cal.heap


@pytest.mark.parametrize("case", ["plain", "preemption-pressure", "queue-held-by-max-num-seqs", "horizon",
                                  "replicas", "max-model-len-cut"])
def test_the_engine_keeps_the_running_requests_with_their_true_margins(case, monkeypatch):
    """After every step and stretch the calendar (when kept) holds exactly the policy's running
    requests at tick + finish_at - num_output_tokens, and the runs stay exact."""
    seen = {"kept": 0, "fast stretches": 0, "stretches": 0, "calendar steps": 0}
    apply, finish, step = (sim.engine.Replica._apply_stretch, sim.engine.Replica.finish_planned,
                           sim.engine.Replica._calendar_step)

    def check(rep):
        cal = rep.calendar
        if cal is None:
            return
        seen["kept"] += 1
        members = sorted((rank, req.id, key - cal.tick) for key, rank, req in cal.heap)
        running = rep.policy.running
        assert [m[1] for m in members] == [r.id for r in running]  # ranks order it as running
        assert [m[2] for m in members] == [rep.records[r.id].finish_at - r.num_output_tokens for r in running]

    def applied(self, batch, k, *args, **kw):
        seen["stretches"] += 1
        passes = []
        monkeypatch.setattr(self, "_stretch_pass", lambda *a: passes.append(1) or type(self)._stretch_pass(self, *a))
        out = apply(self, batch, k, *args, **kw)
        seen["fast stretches"] += not passes
        check(self)
        return out

    def finished(self, *args):
        finish(self, *args)
        check(self)

    def calendar_step(self, *args):
        seen["calendar steps"] += 1
        return step(self, *args)

    monkeypatch.setattr(sim.engine.Replica, "_apply_stretch", applied)
    monkeypatch.setattr(sim.engine.Replica, "finish_planned", finished)
    monkeypatch.setattr(sim.engine.Replica, "_calendar_step", calendar_step)
    run_with_and_without_fast_forward(CASES[case])
    assert seen["kept"] > 0 and seen["calendar steps"] > 0
    assert 0 < seen["fast stretches"] < seen["stretches"]


def test_no_calendar_for_a_policy_whose_arrivals_may_change_its_running_list():
    """Only a policy whose add_request only queues (stretch_past_arrivals) gets one."""
    seen = []
    orig = sim.engine.Replica._stretch_pass

    def spy(self, *a):
        out = orig(self, *a)
        seen.append(self.calendar)
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(sim.engine.Replica, "_stretch_pass", spy)
    try:
        from tests.test_fast_forward import LIMITS, simulate, workload

        on = simulate("trtllm", workload(1), LIMITS)
    finally:
        mp.undo()
    assert on[3] > 0 and seen and all(c is None for c in seen)  # it fast-forwarded, with no calendar
