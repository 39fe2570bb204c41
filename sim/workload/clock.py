"""The simulation clock's resolution against the workload's time span.

Why: simulated time is a float64 count of seconds, so it resolves ``math.ulp(t)`` at time ``t``:
1e-7 s around a Unix epoch in seconds (1.7e9), but 256 s around epoch nanoseconds (1.7e18) and
1e284 s around the arrivals of a rate of 1e-300 req/s. There a 10 ms step adds nothing to the
clock, and every TTFT, TPOT and E2E comes out exactly 0: a silently wrong result. So before
anything runs, the workload's arrivals are checked against :data:`RESOLUTION_S`:

- arrivals that start late (a trace's absolute timestamps) are re-based to start at 0 when that
  alone makes the clock fine enough; a warning says so (only the origin moves: the gaps, which
  are what a simulation uses, stay as they were);
- a span too long for the clock even from 0 is an error naming the field to fix (the arrival
  rate, the trace's ``arrival_s`` unit, or a written-out request's ``arrival_s``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from sim.errors import ScenarioError

RESOLUTION_S = 1e-6  # the clock must resolve a microsecond (steps are 1e-4 s and longer)
# the latest arrival the clock resolves RESOLUTION_S at, with room for the run after it
# (the default time cap ends a run by twice the arrival span plus an hour): 2**32 s, 136 years
LATEST_ARRIVAL_S = 2.0**32


class ClockRebased(UserWarning):
    """Arrivals were moved to start at 0 so the float clock resolves the run."""


def fit_to_clock(arrivals: np.ndarray, field: str, hint: str) -> np.ndarray:
    """``arrivals`` (seconds, sorted or not) if the clock resolves them, else re-based to start at
    0 (with a :class:`ClockRebased` warning) if that suffices, else a :class:`ScenarioError`
    naming ``field``; ``hint`` says how to fix it."""
    if len(arrivals) == 0:
        return arrivals
    first, last = float(np.min(arrivals)), float(np.max(arrivals))
    if _resolved(last):
        return arrivals
    span = last - first
    if _resolved(span):
        warnings.warn(f"{field}: the arrivals start at {first:.6g} s, where the simulation clock (float "
                      f"seconds) resolves only {math.ulp(first):.3g} s; re-based them to start at 0 (the gaps "
                      f"between arrivals are unchanged, reported arrival times count from the first; arrival_s is seconds: "
                      f"convert epoch milliseconds or nanoseconds first)",
                      ClockRebased, stacklevel=2)
        return arrivals - first
    raise ScenarioError(f"{field}: the arrivals span {span:.3g} s ({span / 3.15576e7:.3g} years), where the "
                        f"simulation clock (float seconds) resolves only {math.ulp(max(span, 1.0)):.3g} s, coarser "
                        f"than one step: every latency would come out 0; {hint} (the clock resolves "
                        f"{RESOLUTION_S:g} s up to {LATEST_ARRIVAL_S:.3g} s)")


def _resolved(t: float) -> bool:
    return math.isfinite(t) and abs(t) <= LATEST_ARRIVAL_S
