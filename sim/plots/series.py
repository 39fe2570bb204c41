"""Per-step values as curves over time.

A step is an interval ``[start_s, start_s + duration_s)`` on one replica, so a per-step value is a
piecewise-constant function of time. Small runs are drawn exactly (each step a flat segment, a
break where the engine sat idle). Long runs, or several replicas whose steps interleave, are
drawn as means over equal time bins, each weighted by how long its steps ran inside the bin:
the same duration-weighted mean ``sim.metrics.summary`` reports, restricted to the bin. A bin in which
no step ran is a break in the curve, not a zero: nothing was scheduled there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

EXACT_MAX_STEPS = 2000
BINS = 300


def step_series(steps: pd.DataFrame, values, *, exact_max_steps: int = EXACT_MAX_STEPS,
                bins: int = BINS) -> tuple[np.ndarray, np.ndarray]:
    """(t, y) arrays for ``ax.plot``: flat segments per step (or per bin), NaN at idle gaps."""
    values = np.asarray(values, dtype=float)
    if len(steps) == 0:
        return np.array([]), np.array([])
    start = steps["start_s"].to_numpy(dtype=float)
    end = start + steps["duration_s"].to_numpy(dtype=float)
    replica = steps["replica"].to_numpy() if "replica" in steps else np.zeros(len(steps), int)
    if len(steps) <= exact_max_steps and len(np.unique(replica)) == 1:
        order = np.argsort(start, kind="stable")
        return segments(start[order], end[order], values[order])
    edges = np.linspace(start.min(), end.max(), bins + 1)
    area = np.zeros(bins + 1)  # integral of value * dt up to each edge, summed over replicas
    busy = np.zeros(bins + 1)  # step time up to each edge, summed over replicas
    for r in np.unique(replica):
        m = replica == r
        order = np.argsort(start[m], kind="stable")
        s, e, v = start[m][order], end[m][order], values[m][order]
        v = np.where(np.isnan(v), 0.0, v)
        # cumulative integrals at every step boundary; linear inside a step, flat across gaps
        t = np.empty(2 * len(s))
        t[0::2], t[1::2] = s, e
        a = np.concatenate([[0.0], np.cumsum(v * (e - s))])
        b = np.concatenate([[0.0], np.cumsum(e - s)])
        fa = np.empty(2 * len(s))
        fb = np.empty(2 * len(s))
        fa[0::2], fa[1::2] = a[:-1], a[1:]
        fb[0::2], fb[1::2] = b[:-1], b[1:]
        area += np.interp(edges, t, fa)
        busy += np.interp(edges, t, fb)
    d_area, d_busy = np.diff(area), np.diff(busy)
    width = edges[1] - edges[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(d_busy > 1e-9 * max(width, 1e-12), d_area / d_busy, np.nan)
    return segments(edges[:-1], edges[1:], mean)


def segments(start: np.ndarray, end: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two points per interval, and a NaN point wherever the next interval does not start where
    this one ends (so the line breaks across idle time instead of bridging it)."""
    n = len(start)
    gap = np.zeros(n, dtype=bool)
    if n > 1:
        tol = 1e-9 * max(1.0, float(np.abs(end).max()))
        gap[:-1] = start[1:] > end[:-1] + tol
    per = 2 + gap.astype(int)
    idx = np.concatenate([[0], np.cumsum(per)[:-1]])
    t = np.full(per.sum(), np.nan)
    y = np.full(per.sum(), np.nan)
    t[idx], y[idx] = start, values
    t[idx + 1], y[idx + 1] = end, values
    g = idx[gap] + 2
    t[g] = end[gap]  # y stays NaN: the break
    return t, y


def value_at(steps: pd.DataFrame, values, mask) -> tuple[np.ndarray, np.ndarray]:
    """(start_s, value) of the steps selected by ``mask``: where to put an event marker."""
    mask = np.asarray(mask, dtype=bool)
    return steps["start_s"].to_numpy(dtype=float)[mask], np.asarray(values, dtype=float)[mask]
