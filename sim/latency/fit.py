"""Fit a latency table (:mod:`sim.latency.table_format`) to an engine's recorded steps.

``cbsim calibrate --from-steplog FILE --out TABLE`` lets a user calibrate cbsim to the engine they
actually run, on hardware we never saw: every step of a real run is a measurement of the whole
composition (``overhead + linear(T) + Σ prefill_attn(n, c) + decode_attn(b, c̄)``) at one point.

Why this method:

- **Grids cover the engine, not the file.** The grids span the recorded engine's limits (tokens
  up to ``max_num_batched_tokens``, context up to ``max_model_len``, decode batch up to
  ``max_num_seqs``), so a simulated run with other rates, lengths or knobs under the same config
  stays inside them. Points are powers of two (dense where steps are small), plus the limit.
- **Linear in the table values.** Linear interpolation makes every step's time a linear
  function of the grid values (hat-function / bilinear weights), so the fit is least squares.
- **Physics as constraints, solved by NNLS.** Each grid is written as cumulative sums of
  non-negative increments: values are non-negative, non-decreasing in every dimension (more
  tokens or context never make a step faster), and for the 2-D attention terms the extra cost of
  context grows with the number of queries (attention work is a product). Pins:
  ``linear(0) = 0``, ``decode_attn(0, ·) = decode_attn(·, 0) = 0`` (no keys read, no work), so
  ``overhead`` is the cost of a step with no work. A Lawson–Hanson active-set NNLS (numpy only)
  solves it.
- **Smoothness where the data are silent.** Grid points no step touches are fixed by a weak
  penalty on each interior point's distance from the chord of its neighbours (linear
  continuation), weighted :data:`SMOOTHNESS` × √(steps) so that observed cells follow the data.
- **Least squares on seconds, not relative error**: the simulator sums step times, so the fit
  targets the conditional mean of each step's duration, the quantity whose sum is a TPOT or a
  makespan.
- **step_gap** is measured, not fitted: the mean gap from a step's end to the next step's start
  while requests were in the engine (idle waits for arrivals excluded).
- **Held-out error**: a seeded random 20 % of the steps is left out of the fit; the shipped table
  is the one fitted on the rest, and its error on the held-out steps, measured whole (model time
  plus the gap that followed), priced through :class:`sim.latency.table.TableLatency` itself, is
  what metadata.json reports.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.errors import CbsimError
from sim.latency.table_format import COMPONENTS, FORMAT_VERSION, LatencyTable, make_component
from sim.recorded.steplog import LoggedStep, StepLog

SMOOTHNESS = 0.1  # penalty weight per interior grid point, relative to sqrt(number of steps)
HELDOUT_FRACTION = 0.2


# ------------------------------------------------------------------------------------------------
# grids
# ------------------------------------------------------------------------------------------------
def powers_of_two(lo: int, hi: int) -> list[int]:
    """lo, then the powers of two strictly between lo and hi, then hi."""
    out = [lo]
    p = 1
    while p <= lo:
        p *= 2
    while p < hi:
        out.append(p)
        p *= 2
    if hi > lo:
        out.append(hi)
    return out


def default_grids(config) -> dict[str, tuple[list[int], ...]]:
    """Grids spanning the engine's limits (``config``: a steplog.EngineConfig)."""
    budget = config.max_num_batched_tokens
    max_len = config.max_model_len
    ctx = [0] + powers_of_two(max(config.block_size, 16), max_len)
    return {
        "linear": (powers_of_two(0, budget),),
        "prefill_attn": (powers_of_two(1, budget), ctx),
        "decode_attn": (powers_of_two(0, config.max_num_seqs), ctx),
    }


# ------------------------------------------------------------------------------------------------
# the linear model: step time = row · increments
# ------------------------------------------------------------------------------------------------
def _weights1(axis: np.ndarray, x: float) -> tuple[tuple[int, float], ...]:
    """Hat-function weights of x on axis (clamped to the grid)."""
    x = min(max(x, axis[0]), axis[-1])
    if len(axis) == 1:
        return ((0, 1.0),)
    i = int(np.searchsorted(axis, x, side="right")) - 1
    i = min(max(i, 0), len(axis) - 2)
    t = (x - axis[i]) / (axis[i + 1] - axis[i])
    return ((i, 1.0 - t), (i + 1, t))


class _Block:
    """One gridded component: grid values v = C @ increments, with some increments pinned to 0."""

    def __init__(self, name: str, axes: tuple[list[int], ...], pinned) -> None:
        self.name = name
        self.axes = tuple(np.asarray(a, dtype=float) for a in axes)
        self.shape = tuple(len(a) for a in axes)
        size = int(np.prod(self.shape))
        idx = np.array(list(np.ndindex(*self.shape)))  # (size, ndim), row-major like reshape
        # v[p] = sum of increments q with q <= p in every dimension
        cum = np.all(idx[None, :, :] <= idx[:, None, :], axis=2).astype(float)  # cum[p, q]
        keep = [q for q in range(size) if not pinned(tuple(idx[q]))]
        self.C = cum[:, keep]
        self.size = size

    @property
    def n_params(self) -> int:
        return self.C.shape[1]

    def flat_weights(self, points) -> np.ndarray:
        """Sum over points (each a tuple of coordinates) of their interpolation weights on v."""
        w = np.zeros(self.shape)
        for pt in points:
            per_dim = [_weights1(a, x) for a, x in zip(self.axes, pt)]
            if len(per_dim) == 1:
                for i, wi in per_dim[0]:
                    w[i] += wi
            else:
                for i, wi in per_dim[0]:
                    for j, wj in per_dim[1]:
                        w[i, j] += wi * wj
        return w.reshape(-1)

    def smoothness_rows(self) -> np.ndarray:
        """One row (over v) per interior grid point per dimension: the point minus the chord."""
        rows = []
        for d, axis in enumerate(self.axes):
            for idx in np.ndindex(*self.shape):
                k = idx[d]
                if k == 0 or k == len(axis) - 1:
                    continue
                lo, hi = list(idx), list(idx)
                lo[d], hi[d] = k - 1, k + 1
                g0, g1, g2 = axis[k - 1], axis[k], axis[k + 1]
                row = np.zeros(self.shape)
                row[idx] = 1.0
                row[tuple(lo)] = -(g2 - g1) / (g2 - g0)
                row[tuple(hi)] = -(g1 - g0) / (g2 - g0)
                rows.append(row.reshape(-1))
        return np.array(rows).reshape(-1, self.size)


def _blocks(grids) -> list[_Block]:
    return [
        _Block("linear", grids["linear"], lambda q: q[0] == 0),  # linear(0) = 0
        _Block("prefill_attn", grids["prefill_attn"], lambda q: False),
        _Block("decode_attn", grids["decode_attn"], lambda q: q[0] == 0 or q[1] == 0),
    ]


def _step_points(step: LoggedStep) -> dict[str, list[tuple[float, ...]]]:
    decodes = step.decode_contexts
    return {
        "linear": [(step.num_tokens,)] if step.num_tokens > 0 else [],
        "prefill_attn": [(n, c) for n, c in step.prefill_chunks],
        "decode_attn": [(len(decodes), sum(decodes) / len(decodes))] if decodes else [],
    }


def design_matrix(steps: list[LoggedStep], blocks: list[_Block]) -> np.ndarray:
    cols = 1 + sum(b.n_params for b in blocks)
    A = np.zeros((len(steps), cols))
    A[:, 0] = 1.0  # overhead
    for r, step in enumerate(steps):
        pts = _step_points(step)
        at = 1
        for b in blocks:
            w = b.flat_weights(pts[b.name])
            A[r, at:at + b.n_params] = w @ b.C
            at += b.n_params
    return A


# ------------------------------------------------------------------------------------------------
# non-negative least squares (Lawson & Hanson, "Solving Least Squares Problems", 1974, ch. 23)
# ------------------------------------------------------------------------------------------------
def nnls(A: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """argmin ||A x − b|| subject to x >= 0 (active-set method).

    Works on the normal equations (columns scaled to unit norm first): the design has thousands of
    rows but about a hundred columns, so each inner solve is a small symmetric system.
    """
    m, n = A.shape
    norms = np.linalg.norm(A, axis=0)
    usable = norms > 0
    scale = np.where(usable, norms, 1.0)
    As = A / scale
    G = As.T @ As
    g = As.T @ b
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(float(np.abs(g).max()), 1e-300)
    max_iter = max_iter or 3 * n + 30
    for _ in range(max_iter):
        w = g - G @ x
        w[passive | ~usable] = -np.inf
        j = int(np.argmax(w))
        if not np.isfinite(w[j]) or w[j] <= tol:
            break
        passive[j] = True
        while True:
            s = np.zeros(n)
            s[passive] = _solve(G[np.ix_(passive, passive)], g[passive])
            if np.all(s[passive] > 0):
                x = s
                break
            bad = passive & (s <= 0)
            alpha = np.min(x[bad] / (x[bad] - s[bad]))
            x = x + alpha * (s - x)
            passive &= x > 0
            x[~passive] = 0.0
    return x / scale


def _solve(G: np.ndarray, g: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(G, g)
    except np.linalg.LinAlgError:  # a singular passive set: the least-norm solution
        return np.linalg.lstsq(G, g, rcond=None)[0]


# ------------------------------------------------------------------------------------------------
# the fit
# ------------------------------------------------------------------------------------------------
@dataclass
class FitResult:
    table: LatencyTable
    heldout: dict[str, Any]  # the metadata's heldout_error
    train_steps: int
    step_gap_s: float


def fit_components(steps: list[LoggedStep], grids, smoothness: float = SMOOTHNESS) -> dict[str, Any]:
    """Fit overhead, linear, prefill_attn and decode_attn to the steps' model times (end − start)."""
    if len(steps) < 10:
        raise CbsimError(f"a fit needs at least 10 steps with work, got {len(steps)}")
    blocks = _blocks(grids)
    A = design_matrix(steps, blocks)
    y = np.array([s.duration_s for s in steps])
    weight = smoothness * np.sqrt(len(steps))
    pen = []
    at = 1
    for b in blocks:
        rows = b.smoothness_rows()
        if len(rows):
            P = np.zeros((len(rows), A.shape[1]))
            P[:, at:at + b.n_params] = rows @ b.C
            pen.append(P * weight)
        at += b.n_params
    A_all = np.vstack([A, *pen])
    y_all = np.concatenate([y, np.zeros(A_all.shape[0] - len(y))])
    x = nnls(A_all, y_all)
    out: dict[str, Any] = {"overhead": float(x[0])}
    at = 1
    for b in blocks:
        v = b.C @ x[at:at + b.n_params]
        out[b.name] = make_component(b.name, [a.tolist() for a in b.axes], v.reshape(b.shape))
        at += b.n_params
    return out


def split_steps(n: int, fraction: float = HELDOUT_FRACTION, seed: int = 0) -> np.ndarray:
    """A boolean mask of held-out steps: a seeded random ``fraction`` of them."""
    rng = np.random.default_rng(seed)
    held = np.zeros(n, dtype=bool)
    k = int(round(n * fraction))
    held[rng.choice(n, size=k, replace=False)] = True
    return held


def fit_steplog(log: StepLog, heldout_fraction: float = HELDOUT_FRACTION, seed: int = 0,
                smoothness: float = SMOOTHNESS) -> FitResult:
    """Fit a table to a step log; report its error on a held-out share of the steps."""
    if not 0 < heldout_fraction < 1:
        raise CbsimError(f"heldout fraction must be between 0 and 1, got {heldout_fraction}")
    steps = [s for s in log.steps if s.batch]
    gaps_all = log.busy_gaps()
    gap_of = {id(s): g for s, g in zip(log.steps, gaps_all)}
    busy = [g for g in gaps_all if g is not None]
    if not busy:
        raise CbsimError(f"{log.path}: no two consecutive steps while requests were in the engine; cannot measure "
                         f"the between-step gap")
    held = split_steps(len(steps), heldout_fraction, seed)
    train = [s for s, h in zip(steps, held) if not h]
    test = [s for s, h in zip(steps, held) if h]
    grids = default_grids(log.config)
    comps = fit_components(train, grids, smoothness)
    step_gap = float(np.mean([gap_of[id(s)] for s in train if gap_of[id(s)] is not None]))
    components = {
        "overhead": make_component("overhead", (), comps["overhead"]),
        "step_gap": make_component("step_gap", (), step_gap),
        "linear": comps["linear"],
        "prefill_attn": comps["prefill_attn"],
        "decode_attn": comps["decode_attn"],
    }
    assert set(components) == set(COMPONENTS)
    table = LatencyTable(components, _metadata(log, len(train), seed, heldout_fraction, smoothness, steps))
    measured = [(s, s.duration_s + gap_of[id(s)]) for s in test if gap_of[id(s)] is not None]
    name = log.path.name if log.path is not None else "the step log"
    heldout = heldout_error(table, log, measured,
                            f"{len(measured)} held-out steps of {name} (a random "
                            f"{heldout_fraction:.0%}, seed {seed}), each measured whole: start to the "
                            f"next step's start")
    table.metadata["heldout_error"] = heldout
    return FitResult(table, heldout, len(train), step_gap)


def predict_steps(table: LatencyTable, model: dict, block_size: int, steps: list[LoggedStep]) -> np.ndarray:
    """Each step's time as the table backend prices it (the shipped code path)."""
    import warnings

    from policies.base import StepPlan
    from sim.hardware.gpus import get_gpu
    from sim.hardware.models import get_model
    from sim.latency.base import step_shape
    from sim.latency.table import TableExtrapolationWarning, TableLatency

    lat = TableLatency(table, get_model(model), get_gpu("cpu"), table.metadata.get("tensor_parallel", 1),
                       block_size)
    out = np.empty(len(steps))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TableExtrapolationWarning)
        for i, s in enumerate(steps):
            plan = StepPlan(num_new_tokens=[n for _, n, _ in s.batch], context=[c for _, _, c in s.batch])
            out[i] = lat.price(step_shape(plan), plan)[0]
    return out


def heldout_error(table: LatencyTable, log: StepLog, measured: list[tuple[LoggedStep, float]],
                  measured_on: str) -> dict[str, Any]:
    if not measured:
        return {"mean_abs_rel": None, "p90_abs_rel": None, "n": 0, "measured_on": measured_on}
    steps = [s for s, _ in measured]
    real = np.array([t for _, t in measured])
    pred = predict_steps(table, log.model, log.config.block_size, steps)
    rel = (pred - real) / real
    mixed = np.array([bool(s.prefill_chunks) and bool(s.decode_contexts) for s in steps])
    out = {
        "mean_abs_rel": round(float(np.mean(np.abs(rel))), 4),
        "p90_abs_rel": round(float(np.percentile(np.abs(rel), 90)), 4),
        "n": int(len(rel)),
        "measured_on": measured_on,
        # bias of the sum: what a simulated TPOT or makespan inherits
        "sum_rel": round(float(pred.sum() / real.sum() - 1), 4),
    }
    if mixed.any():
        out["mixed"] = {
            "mean_abs_rel": round(float(np.mean(np.abs(rel[mixed]))), 4),
            "p90_abs_rel": round(float(np.percentile(np.abs(rel[mixed]), 90)), 4),
            "n": int(mixed.sum()),
            "measured_on": "the held-out steps holding both prefill chunks and decodes",
        }
    return out


def _metadata(log: StepLog, n_train: int, seed: int, fraction: float, smoothness: float,
              steps: list[LoggedStep]) -> dict[str, Any]:
    chunks = [pc for s in steps for pc in s.prefill_chunks]
    decodes = [(len(s.decode_contexts), np.mean(s.decode_contexts)) for s in steps if s.decode_contexts]
    coverage = {
        "tokens": [min(s.num_tokens for s in steps), max(s.num_tokens for s in steps)],
        "chunk_tokens": [min(n for n, _ in chunks), max(n for n, _ in chunks)] if chunks else None,
        "context": [min(c for _, c in chunks), max(c for _, c in chunks)] if chunks else None,
        "batch": [min(b for b, _ in decodes), max(b for b, _ in decodes)] if decodes else None,
        "mean_context": [round(float(min(c for _, c in decodes)), 1),
                         round(float(max(c for _, c in decodes)), 1)] if decodes else None,
    }
    return {
        "format_version": FORMAT_VERSION,
        "source": "steplog",
        "device": log.device,
        "model": log.model,
        "dtype": log.model["dtype"],
        "block_size": log.config.block_size,
        "tensor_parallel": log.config.tensor_parallel,
        "torch_version": None,
        "driver_version": None,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "grid": {},
        "num_gpu_blocks": log.config.num_gpu_blocks,
        "gpu_memory_utilization": None,
        "bandwidth": None,
        "heldout_error": None,
        "fit": {
            "method": "NNLS on non-negative increments of piecewise-linear grids, chord smoothness "
                      f"penalty {smoothness} x sqrt(steps); step_gap = mean busy between-step gap",
            "steplog": str(log.path) if log.path is not None else None,
            "engine": log.engine,
            "steps_fitted": n_train,
            "heldout_fraction": fraction,
            "seed": seed,
            "data_coverage": coverage,
        },
    }
