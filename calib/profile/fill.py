"""Filling a component's grid from its measured points: isotonic rows, linear extrapolation.

Why a module of its own: some grid points cannot be measured (no engine of the limits produces
them, or they exceed the profiling cache); turning noisy medians into a full, monotone table is
pure numerics, tested on its own without a device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out.extend([s / c] * int(c))
    return out


def fill_rows(xs: Sequence[int], ys: Sequence[int], grid: dict[tuple[int, int], float]) -> tuple[np.ndarray, list]:
    """A full 2-D array from measured points: each row made non-decreasing along y, unmeasured
    points extrapolated linearly along y from the row's two last measured points (or, for a row
    with fewer, from the previous row scaled by x / x_prev). Returns (values, extrapolated points)."""
    values = np.zeros((len(xs), len(ys)))
    extrapolated = []
    prev = None
    for i, x in enumerate(xs):
        have = [j for j, y in enumerate(ys) if (x, y) in grid]
        if have:
            fitted = isotonic([max(grid[(x, ys[j])], 0.0) for j in have])
            for j, v in zip(have, fitted):
                values[i, j] = v
        for j, y in enumerate(ys):
            if (x, y) in grid:
                continue
            extrapolated.append([x, y])
            below = [k for k in have if k < j]
            if len(below) >= 2:
                a, b = below[-2], below[-1]
                slope = (values[i, b] - values[i, a]) / (ys[b] - ys[a])
                values[i, j] = values[i, b] + slope * (y - ys[b])
            elif prev is not None:
                base = values[i, have[0]] if have else 0.0
                ref_base = values[prev, have[0]] if have else 0.0
                values[i, j] = base + (values[prev, j] - ref_base) * x / xs[prev]
            elif below:
                values[i, j] = values[i, below[-1]]
        prev = i
    return np.maximum(values, 0.0), extrapolated
