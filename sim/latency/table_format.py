"""The latency-table folder: one format for tables measured by ``calib`` and fitted from step logs.

Why a folder of two plain files: the simulator must read a table without torch, a person must be
able to read and diff it, and both calibration paths (``calib.profile.calibrate`` on a device,
``cbsim calibrate --from-steplog`` from an engine's log) must write the same thing.

A table folder holds::

    table.csv       the component grids (seconds)
    metadata.json   what was measured, where, how, and how well it predicts

The model (DESIGN.md, "Latency model")
--------------------------------------
A step's time is composed additively from five components::

    step_s = overhead
           + linear(T)                          T = tokens through the linear layers (padding included)
           + Σ over prefill chunks  prefill_attn(n, c)   n = chunk tokens, c = tokens already in KV
           + decode_attn(b, c̄)                  b = decode sequences, c̄ = their mean context
           + step_gap

A request's entry in a step is a *decode* when it computes exactly one token on top of a
non-empty context (n == 1 and c > 0); every other entry is a *prefill chunk* (a whole prompt, a
piece of one, or the recompute of a preempted request). Context means tokens already in the KV
cache before the step (the step log's ``context``).

- ``overhead`` (0-D): fixed per-step time (scheduling, input preparation, sampling, launches).
- ``linear`` (1-D, ``tokens``): the GEMMs and everything else that scales with tokens; the
  per-token part of per-sequence work (a decode sequence is one token) lands here too.
- ``prefill_attn`` (2-D, ``chunk_tokens`` × ``context``): the attention of ONE chunk of n query
  tokens over c cached plus its own causal tokens; summed over the chunks of a step. Its value
  at small n carries any fixed per-chunk cost.
- ``decode_attn`` (2-D, ``batch`` × ``mean_context``): the attention of the WHOLE decode batch
  of b sequences whose mean context is c̄ (so b·c̄ keys are read).
- ``step_gap`` (0-D): engine time *between* steps (output processing, adding requests): in a
  step log, the gap from one step's end to the next step's start while the engine is busy. The
  backend adds it to every step (tokens therefore appear one gap late, a bias of a fraction of
  a millisecond). A table measured by timing forward passes alone writes 0.

A component with no work in a step contributes 0 (no decodes: no ``decode_attn``; T = 0: no
``linear``).

Optional components (a table may leave any of them out; old tables have none):

- ``per_seq`` (1-D, ``sequences``): work per scheduled sequence, priced at S = sequences in the
  step: the LM head and the sampler (vLLM V1 computes logits for every scheduled request's last
  position, partial prefill chunks included). Absent: 0 (the LM head is then inside ``linear``).
- ``decode_attn_mixed`` (2-D, ``batch`` × ``mean_context``): the attention of the decodes of a step
  that also holds a prefill chunk. In one varlen attention launch beside a chunk, decodes can cost
  far more than alone (up to 2.5× in the RTX 4090 profile of Llama-3.1-8B); a step with at least
  one prefill chunk prices its decodes here instead of ``decode_attn``. Absent: ``decode_attn``.
- ``engine_cpu`` (1-D, ``sequences``): the engine's own CPU time per step (scheduling, input
  preparation, output processing), by sequences in the step; not a kernel, so it is *combined*
  with the GPU time rather than added: ``step = gpu + engine_cpu`` for a synchronous engine,
  ``max(gpu, engine_cpu)`` with asynchronous scheduling (the scenario's
  ``engine.async_scheduling``; :mod:`sim.latency.engine_cpu`). Absent: 0. ``overhead`` and
  ``step_gap`` are always added.
- ``moe_group`` (1-D, ``tokens``): in a table made for attention data parallelism (metadata
  ``parallel.data_parallel`` D > 1), the part of ``linear(T)`` that is the routed experts and their
  dispatch / combine, which run over every rank's tokens (``linear(T)`` prices them at T tokens on
  each of the D ranks). Not added to a step: a lockstep group (:mod:`sim.lockstep`) re-prices it at
  the group's mean tokens per rank when its ranks ran unequal token counts. Absent: a group step is
  its slowest rank's own price.

Decode skew (metadata ``decode_skew_alpha``, default 0): decodes of unequal contexts cost more
than a batch all at the mean context; with α > 0 the decode attention of a step is
``d(b, c̄) + α × (d(b, c_max) − d(b, c̄))`` (``d`` = ``decode_attn`` or ``decode_attn_mixed``,
``c_max`` = the longest decode context): LLMServingSim's skew correction, whose α its profiler
measures per GPU.

Interpolation: each grid is interpolated **linearly between grid points, not in log space**
(bilinearly for 2-D). Outside the grid each dimension is extrapolated linearly from its two
outermost points, and the backend warns once per dimension (naming it and how far outside). A
dimension with a single grid point is constant along it.

table.csv
---------
UTF-8 CSV with exactly the header ``component,x,y,seconds``; one row per grid point:

- 0-D components (``overhead``, ``step_gap``): one row, ``x`` and ``y`` empty.
- 1-D (``linear``): ``x`` = the grid value of its dimension, ``y`` empty.
- 2-D (``prefill_attn``, ``decode_attn``): ``x`` = first dimension, ``y`` = second.

Each component's rows must form the full Cartesian product of its grid (every (x, y) pair
exactly once). ``seconds`` must be finite and >= 0. Every required component must be present
(write 0 for one you did not measure, e.g. ``step_gap`` of a forward-pass-only table); optional
ones may be left out. Row order is free.

metadata.json
-------------
A JSON object (format version 1). Required keys:

- ``format_version``: 1.
- ``source``: ``"calib"`` (measured on a device by ``calib.profile.calibrate``) or ``"steplog"`` (fitted
  from an engine's recorded steps by ``cbsim calibrate --from-steplog``).
- ``device``: the device's name, in words (e.g. ``"NVIDIA H200"``, ``"cpu"``).
- ``model``: the model spec as ``sim.hardware.models.ModelSpec.to_dict()`` (name, num_layers,
  hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size, vocab_size, dtype,
  tied_embeddings).
- ``dtype``: weight and KV dtype (``bf16``, ``fp16``, ``fp32``).
- ``block_size``: tokens per KV block of the measured engine.
- ``tensor_parallel``: GPUs per replica of the measured engine.
- ``date``: ISO 8601 date-time of the measurement.
- ``grid``: ``{component: {dimension: [grid values]}}`` for the 1-D and 2-D components; must
  equal the grid of table.csv.

Optional keys (null or absent when not applicable or unknown):

- ``torch_version``, ``driver_version``: strings.
- ``num_gpu_blocks``: usable KV blocks the device held (vLLM's pool minus its null block).
- ``gpu_memory_utilization``: the fraction that block count was computed at.
- ``bandwidth``: ``{"h2d_bytes_per_s": float, "d2h_bytes_per_s": float}``, measured host↔device
  copy bandwidth; ``swap_time`` uses it when present, else the GPU spec's PCIe figure.
- ``heldout_error``: ``{"mean_abs_rel", "p90_abs_rel", "n", "measured_on"}``: relative error of
  the composed step time on held-out steps (``measured_on`` says which, e.g. "20 % of the step
  log's busy steps, random, seed 0" or "mixed batches measured whole").
- ``fit``: free-form details of how the values were obtained (fit method, data coverage).
- ``provenance``: free-form mapping naming where the measurements come from (package and version,
  files, the engine and version the kernels were measured in, GPU, dtype, grids).
- ``engine``: mapping describing the engine the table stands for (``name``, ``version``, how
  the source measured it, e.g. ``enforce_eager``).
- ``decode_skew_alpha``: number in [0, 1], see "Decode skew" above.
- ``aic_agreement``: the same mapping as ``heldout_error``, for tables composed from a kernel
  database: how the composed table prices whole steps against the database's own step predictor
  (it is no held-out measurement; kernel-db tables written before it existed call it
  ``heldout_error``, and still load).
- ``prefill_attn_launch_s``: seconds of ``prefill_attn`` that are the attention launch's fixed
  cost, paid once per step however many prefill chunks share it (the engines run every chunk of a
  step in one varlen attention launch). 0 or absent: every chunk pays its full ``prefill_attn``.
- ``corpus_error``: free-form mapping: the table's measured error on a corpus of real serving runs
  (``bench/silicon_accuracy.py``), for the table's own GPU.
- ``parallel``: the layout beyond ``tensor_parallel`` the table was made for: ``{"data_parallel":
  D, "expert_parallel": E, "moe_tensor_parallel": M}`` (attention data-parallel ranks stepping
  together, expert-parallel GPUs, the experts' own tensor-parallel split). Absent: data_parallel
  1, expert_parallel 1 and the experts TP-sharded over ``tensor_parallel``; a scenario that runs
  an MoE model in another layout refuses the table (``sim.latency.table.check_compatible``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import CbsimError, nearest

FORMAT_VERSION = 1
TABLE_FILE = "table.csv"
METADATA_FILE = "metadata.json"
CSV_HEADER = ("component", "x", "y", "seconds")
SOURCES = ("calib", "steplog", "kernel_db", "llmservingsim")

# component -> its dimensions, in (x, y) order
COMPONENTS: dict[str, tuple[str, ...]] = {
    "overhead": (),
    "step_gap": (),
    "linear": ("tokens",),
    "prefill_attn": ("chunk_tokens", "context"),
    "decode_attn": ("batch", "mean_context"),
}
# optional components, same (x, y) convention (see the module docstring)
OPTIONAL_COMPONENTS: dict[str, tuple[str, ...]] = {
    "per_seq": ("sequences",),
    "decode_attn_mixed": ("batch", "mean_context"),
    "engine_cpu": ("sequences",),
    "moe_group": ("tokens",),
}
ALL_COMPONENTS: dict[str, tuple[str, ...]] = {**COMPONENTS, **OPTIONAL_COMPONENTS}

REQUIRED_METADATA = ("format_version", "source", "device", "model", "dtype", "block_size",
                     "tensor_parallel", "date", "grid")
OPTIONAL_METADATA = ("torch_version", "driver_version", "num_gpu_blocks", "gpu_memory_utilization",
                     "bandwidth", "heldout_error", "fit", "provenance", "engine", "decode_skew_alpha", "parallel",
                     "aic_agreement", "prefill_attn_launch_s", "corpus_error")
PARALLEL_KEYS = ("data_parallel", "expert_parallel", "moe_tensor_parallel")


@dataclass
class Component:
    """One component: its dimensions, the grid of each, and the values (seconds) on the grid."""

    name: str
    axes: tuple[tuple[float, ...], ...]  # one increasing tuple of grid values per dimension
    values: np.ndarray  # shape = tuple(len(a) for a in axes); a 0-d array for 0-D components

    @property
    def dims(self) -> tuple[str, ...]:
        return ALL_COMPONENTS[self.name]


@dataclass
class LatencyTable:
    components: dict[str, Component]
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # the folder it was read from

    def grid(self) -> dict[str, dict[str, list[float]]]:
        """The ``grid`` entry of metadata.json for these components."""
        return {name: {dim: [_num(v) for v in axis] for dim, axis in zip(c.dims, c.axes)}
                for name, c in self.components.items() if c.dims}

    def scalar(self, name: str) -> float:
        return float(self.components[name].values)


def _num(v: float) -> float | int:
    return int(v) if float(v).is_integer() else float(v)


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------
def table_folder(path: str | Path) -> Path:
    """The folder of a table given the folder itself or one of its two files."""
    p = Path(path)
    if p.name in (TABLE_FILE, METADATA_FILE) and not p.is_dir():
        p = p.parent
    if not p.exists():
        raise CbsimError(f"latency table {str(path)!r} does not exist; give a table folder (with {TABLE_FILE} "
                         f"and {METADATA_FILE}) made by `cbsim calibrate`")
    if not p.is_dir():
        raise CbsimError(f"latency table {str(path)!r} is a file; give its folder (holding {TABLE_FILE} "
                         f"and {METADATA_FILE})")
    for name in (TABLE_FILE, METADATA_FILE):
        if not (p / name).is_file():
            raise CbsimError(f"latency table folder {str(p)!r} has no {name}; a table folder holds {TABLE_FILE} "
                             f"and {METADATA_FILE} (see sim/latency/table_format.py); re-run `cbsim calibrate`")
    return p


def read_table(path: str | Path) -> LatencyTable:
    """Read and validate a table folder. Any problem is a CbsimError naming the file and the fix."""
    folder = table_folder(path)
    metadata = read_metadata(folder / METADATA_FILE)
    components = read_csv(folder / TABLE_FILE)
    table = LatencyTable(components, metadata, folder)
    declared = metadata["grid"]
    actual = table.grid()
    for name, dims in actual.items():
        got = declared.get(name)
        if got is None:
            raise CbsimError(f"{folder / METADATA_FILE}: grid has no entry for component {name!r}; it must list "
                             f"the grid of every 1-D and 2-D component of {TABLE_FILE}: {actual}")
        for dim, values in dims.items():
            listed = got.get(dim)
            if listed is None or [float(v) for v in listed] != [float(v) for v in values]:
                raise CbsimError(f"{folder / METADATA_FILE}: grid.{name}.{dim} is {listed} but {TABLE_FILE} "
                                 f"has the points {values}; make them agree (rewrite the table with "
                                 f"sim.latency.table_format.write_table)")
    return table


def read_metadata(path: Path) -> dict[str, Any]:
    from sim.user_files import read_json

    meta = read_json(path, "latency table's metadata", "re-run `cbsim calibrate` to write the table again")
    validate_metadata(meta, path)
    return meta


def validate_metadata(meta: Any, where: str | Path = METADATA_FILE) -> None:
    """Check metadata against format version 1 (see the module docstring)."""
    if not isinstance(meta, dict):
        raise CbsimError(f"{where}: must hold a JSON object with keys {', '.join(REQUIRED_METADATA)}")
    for key in REQUIRED_METADATA:
        if key not in meta:
            raise CbsimError(f"{where}: required key {key!r} is missing (required: {', '.join(REQUIRED_METADATA)})")
    for key in meta:
        if key not in REQUIRED_METADATA and key not in OPTIONAL_METADATA:
            allowed = REQUIRED_METADATA + OPTIONAL_METADATA
            raise CbsimError(f"{where}: unknown key {key!r}{nearest(key, allowed)}; allowed keys: {', '.join(allowed)}")
    if meta["format_version"] != FORMAT_VERSION:
        raise CbsimError(f"{where}: format_version is {meta['format_version']!r}; this cbsim reads version "
                         f"{FORMAT_VERSION}: re-run `cbsim calibrate` to rewrite the table")
    if meta["source"] not in SOURCES:
        raise CbsimError(f"{where}: source must be one of {', '.join(SOURCES)}, got {meta['source']!r}"
                         f"{nearest(str(meta['source']), SOURCES)}")
    for key in ("block_size", "tensor_parallel"):
        value = meta[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CbsimError(f"{where}: {key} must be a positive integer, got {value!r}")
    if not isinstance(meta["model"], dict):
        raise CbsimError(f"{where}: model must be the model spec as a mapping (sim.hardware.models.ModelSpec.to_dict())")
    from sim.hardware.models import get_model

    try:
        get_model(meta["model"])
    except CbsimError as exc:
        raise CbsimError(f"{where}: model: {exc}") from None
    if not isinstance(meta["grid"], dict) or not all(
            isinstance(dims, dict) and all(isinstance(v, list) and all(_is_number(x) for x in v)
                                           for v in dims.values()) for dims in meta["grid"].values()):
        raise CbsimError(f"{where}: grid must map each component to {{dimension: [numbers]}}")
    for key in ("device", "dtype", "date"):
        if not isinstance(meta[key], str):
            raise CbsimError(f"{where}: {key} must be a string, got {meta[key]!r:.60}")
    bw = meta.get("bandwidth")
    if bw is not None:
        if not isinstance(bw, dict):
            raise CbsimError(f"{where}: bandwidth must be {{\"h2d_bytes_per_s\": ..., \"d2h_bytes_per_s\": ...}} or null")
        for key, value in bw.items():
            if key not in ("h2d_bytes_per_s", "d2h_bytes_per_s"):
                raise CbsimError(f"{where}: bandwidth.{key} is unknown{nearest(key, ('h2d_bytes_per_s', 'd2h_bytes_per_s'))}")
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise CbsimError(f"{where}: bandwidth.{key} must be a positive number of bytes/s or null, got {value!r}")
    alpha = meta.get("decode_skew_alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float)
                              or not 0 <= alpha <= 1):
        raise CbsimError(f"{where}: decode_skew_alpha must be a number in [0, 1] or null, got {alpha!r}")
    for key in ("provenance", "engine"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise CbsimError(f"{where}: {key} must be a mapping or null, got {meta[key]!r:.60}")
    par = meta.get("parallel")
    if par is not None:
        if not isinstance(par, dict) or set(par) - set(PARALLEL_KEYS):
            raise CbsimError(f"{where}: parallel must be a mapping of {', '.join(PARALLEL_KEYS)}, got {par!r:.80}")
        for key, value in par.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CbsimError(f"{where}: parallel.{key} must be a positive integer, got {value!r}")
    for key in ("heldout_error", "aic_agreement"):
        err = meta.get(key)
        if err is not None and not isinstance(err, dict):
            raise CbsimError(f"{where}: {key} must be a mapping or null, got {err!r:.60}")
        if err is not None:
            missing = [k for k in ("mean_abs_rel", "p90_abs_rel", "n", "measured_on") if k not in err]
            if missing:
                raise CbsimError(f"{where}: {key} lacks {', '.join(missing)}")
    launch = meta.get("prefill_attn_launch_s")
    if launch is not None and (isinstance(launch, bool) or not isinstance(launch, int | float) or launch < 0
                               or not math.isfinite(launch)):
        raise CbsimError(f"{where}: prefill_attn_launch_s must be a number of seconds >= 0 or null, got {launch!r}")
    if meta.get("corpus_error") is not None and not isinstance(meta["corpus_error"], dict):
        raise CbsimError(f"{where}: corpus_error must be a mapping or null, got {meta['corpus_error']!r:.60}")


def read_csv(path: Path) -> dict[str, Component]:
    from sim.user_files import read_text

    text = read_text(path, "latency table", "re-run `cbsim calibrate` to write the table again")
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:  # a NUL byte, a field larger than the csv module's limit
        raise CbsimError(f"{path}: not a readable CSV file ({exc}); re-run `cbsim calibrate` to write "
                         f"the table again") from None
    if not rows or tuple(c.strip() for c in rows[0]) != CSV_HEADER:
        raise CbsimError(f"{path}: the first line must be the header {','.join(CSV_HEADER)}")
    points: dict[str, dict[tuple, float]] = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != 4:
            raise CbsimError(f"{path}:{lineno}: expected 4 fields ({','.join(CSV_HEADER)}), got {len(row)}")
        name, x, y, seconds = (c.strip() for c in row)
        if name not in ALL_COMPONENTS:
            raise CbsimError(f"{path}:{lineno}: unknown component {name!r}{nearest(name, ALL_COMPONENTS)}; "
                             f"components: {', '.join(ALL_COMPONENTS)}")
        ndim = len(ALL_COMPONENTS[name])
        coords = []
        for dim_i, (label, text) in enumerate((("x", x), ("y", y))):
            if dim_i < ndim:
                coords.append(_parse(text, path, lineno, f"{label} ({ALL_COMPONENTS[name][dim_i]} of {name})"))
            elif text:
                raise CbsimError(f"{path}:{lineno}: {name} has {ndim} dimension(s); leave {label} empty")
        value = _parse(seconds, path, lineno, "seconds")
        if value < 0:
            raise CbsimError(f"{path}:{lineno}: seconds must be >= 0, got {value}")
        key = tuple(coords)
        bucket = points.setdefault(name, {})
        if key in bucket:
            raise CbsimError(f"{path}:{lineno}: {name} at {key or '(scalar)'} appears twice; keep one row per grid point")
        bucket[key] = value
    missing = [c for c in COMPONENTS if c not in points]
    if missing:
        raise CbsimError(f"{path}: component(s) {', '.join(missing)} missing; every component must be present "
                         f"(write 0 for one you did not measure)")
    components = {}
    for name, bucket in points.items():
        ndim = len(ALL_COMPONENTS[name])
        axes = tuple(tuple(sorted({k[d] for k in bucket})) for d in range(ndim))
        shape = tuple(len(a) for a in axes)
        if len(bucket) != int(np.prod(shape)):
            have = set(bucket)
            absent = next(k for k in _product(axes) if k not in have)
            raise CbsimError(f"{path}: {name} is not a full grid: {dict(zip(ALL_COMPONENTS[name], absent))} has no row "
                             f"({len(bucket)} rows for a {' x '.join(map(str, shape))} grid)")
        values = np.zeros(shape)
        index = [{v: i for i, v in enumerate(a)} for a in axes]
        for key, value in bucket.items():
            values[tuple(index[d][key[d]] for d in range(ndim))] = value
        components[name] = Component(name, axes, values)
    return components


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _parse(text: str, path: Path, lineno: int, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CbsimError(f"{path}:{lineno}: {what} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise CbsimError(f"{path}:{lineno}: {what} must be finite, got {text!r}")
    return value


def _product(axes):
    if not axes:
        yield ()
        return
    for head in axes[0]:
        for rest in _product(axes[1:]):
            yield (head, *rest)


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------
def write_table(folder: str | Path, table: LatencyTable) -> Path:
    """Write ``table.csv`` and ``metadata.json`` into ``folder`` (created if needed). The grid
    entry of the metadata is (re)computed from the components."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CbsimError(f"--out {str(folder)!r} is a file; a latency table is a folder: give a folder path")
    missing = [c for c in COMPONENTS if c not in table.components]
    if missing:
        raise CbsimError(f"cannot write a table without component(s) {', '.join(missing)}")
    meta = dict(table.metadata)
    meta["grid"] = table.grid()
    meta.setdefault("format_version", FORMAT_VERSION)
    validate_metadata(meta, folder / METADATA_FILE)
    folder.mkdir(parents=True, exist_ok=True)
    rows = [CSV_HEADER]
    for name in [c for c in ALL_COMPONENTS if c in table.components]:
        comp = table.components[name]
        for key in _product(comp.axes):
            idx = tuple(comp.axes[d].index(key[d]) for d in range(len(key)))
            value = float(comp.values[idx]) if idx else float(comp.values)
            coords = [_fmt(v) for v in key] + [""] * (2 - len(key))
            rows.append((name, *coords, repr(value)))
    with (folder / TABLE_FILE).open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    (folder / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return folder


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def make_component(name: str, axes, values) -> Component:
    """A component from plain lists (for writers: the fit, calib, tests)."""
    if name not in ALL_COMPONENTS:
        raise ValueError(f"unknown component {name!r}; components: {', '.join(ALL_COMPONENTS)}")
    axes = tuple(tuple(float(v) for v in a) for a in axes)
    if len(axes) != len(ALL_COMPONENTS[name]):
        raise ValueError(f"{name} has dimensions {ALL_COMPONENTS[name]}, got {len(axes)} axes")
    for dim, a in zip(ALL_COMPONENTS[name], axes):
        if list(a) != sorted(set(a)):
            raise ValueError(f"{name}.{dim}: grid values must be strictly increasing, got {a}")
    arr = np.asarray(values, dtype=float).reshape(tuple(len(a) for a in axes))
    return Component(name, axes, arr)
