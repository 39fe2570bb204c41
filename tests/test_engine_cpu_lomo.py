"""bench/engine_cpu_lomo.py's stretch of a simulated row by a candidate CPU term, in closed form: an
asynchronous engine's step is max(gpu, cpu), a synchronous one's gpu + cpu (sim/latency/engine_cpu.py),
and a request's TTFT and decode time gain the stretch of the steps inside them."""

from __future__ import annotations

import numpy as np
import pytest


def _run(ttft_ms=10.0, tpot_ms=10.0):
    """One request sent at 0: its prefill step (10 ms) gives the first token at 10 ms, two decode
    steps of 10 ms its other two; a step of no sequence (an idle gap) at the end."""
    return {"model": "m", "concurrency": 1, "osl": 3, "ttft_ms": ttft_ms, "tpot_ms": tpot_ms,
            "sent": np.array([0.0]), "first": np.array([0.01]), "finish": np.array([0.03]),
            "end": np.array([0.01, 0.02, 0.03, 0.04]), "d": np.array([0.01, 0.01, 0.01, 0.01]),
            "n": np.array([1, 1, 1, 0])}


def test_an_asynchronous_term_shows_only_where_it_is_longer_than_the_gpu_step():
    from bench.engine_cpu_lomo import errors

    run = _run()
    assert errors(run, "async", 0.0, 0.0) == pytest.approx((0.0, 0.0))
    assert errors(run, "async", 5e-3, 40e-6) == pytest.approx((0.0, 0.0))  # hidden under 10 ms steps
    # 15 ms of CPU: every step 5 ms longer; the TTFT holds one step, the decode two
    assert errors(run, "async", 15e-3, 0.0) == pytest.approx((0.5, 0.5))


def test_a_synchronous_term_adds_to_every_step_that_runs_a_sequence():
    from bench.engine_cpu_lomo import errors

    run = _run()
    assert errors(run, "sync", 2e-3, 1e-3) == pytest.approx((0.3, 0.3))  # 3 ms a step
    assert errors(_run(ttft_ms=13.0, tpot_ms=13.0), "sync", 3e-3, 0.0) == pytest.approx((0.0, 0.0), abs=1e-12)


def test_the_term_is_chosen_on_the_grid_and_ties_go_to_the_smaller_asynchronous_one():
    from bench.engine_cpu_lomo import NONE, choose

    # measured 13 ms a step: only a synchronous 3 ms on the grid meets it exactly
    assert choose([_run(13.0, 13.0)], ("async", "sync")) == ("sync", 3e-3, 0.0)
    # measured as simulated: no term, whichever forms are allowed
    assert choose([_run()], ("async", "sync")) == NONE
    assert choose([_run(15.0, 15.0)], ("async",)) == ("async", 16e-3, 0.0)  # the nearest the grid has (16 vs 12.08)
