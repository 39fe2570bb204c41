"""Sweeps: many runs of one scenario, one per *point* (an arrival rate, or a value of any field),
run in parallel on local processes or as Ray tasks, into one table with a row per point and policy.

Why it is built this way:

* A point is the scenario plus ``--set`` overrides (``workload.arrival.rate=12``), so a sweep
  runs exactly what ``cbsim run --set ...`` would. Changing only the rate rescales the *same*
  seeded arrival pattern (``sim.workload.synthetic``), so points differ by load alone, not by luck.
* Every point is deterministic, and the table is assembled from the point files on disk in
  point order then scenario policy order, so it is the same whichever backend ran it, in
  whatever order the points finished, and whether it was resumed or not.
* Each finished point is written at once, atomically (a temporary file renamed into place), to
  ``DIR/points/<key>.parquet``, where the key is a hash of the point's resolved scenario and
  policy selection. A rerun (or a run after Ctrl-C) skips every point whose file exists, so an
  interruption loses at most the points that were running. Change the scenario and the keys
  change: stale points are never reused.
* Workers: ``min(points, CPUs)`` local processes by default (forked on Linux, see
  :func:`_pool_context`); ``--workers 1`` runs in this process. Ray
  (``--backend ray``) runs the same function as Ray tasks on a local instance, or on an existing
  cluster given ``--ray-address`` (whose nodes need cbsim installed, at the same version).

Columns of ``sweep.parquet``: ``point`` (index in this sweep), ``rate`` (the point's
``workload.arrival.rate``), the varied field under its own name (``engine.max_num_batched_tokens``)
when ``--vary`` is used, ``policy`` (the label), ``key``, then every summary figure flattened with
dots (``ttft_s.p99``, ``utilization.kv``, ``goodput_rps``, ``slo_met``).
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import CbsimError

MAX_POINTS = 10_000
KEY_VERSION = "cbsim-sweep-2"  # 2: summaries carry the steady-state block


# --- points --------------------------------------------------------------------------------
def _decimal(text: str, what: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise CbsimError(f"--rates: {what} {text.strip()!r} is not a number") from None
    if not value.is_finite():
        raise CbsimError(f"--rates: {what} {text.strip()!r} is not a finite number")
    return value


def parse_rates(text: str) -> list[float]:
    """Rates from ``start:stop:step`` (stop included when the steps land on it) or ``r1,r2,...``.

    Arithmetic is done in decimal, so ``0.1:1:0.1`` gives exactly ten rates ending at 1.0 (a
    float loop would stop at 0.9 or overshoot)."""
    text = (text or "").strip()
    if not text:
        raise CbsimError("--rates is empty: give start:stop:step (e.g. 2:40:2) or a list (e.g. 2,4,8)")
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise CbsimError(f"--rates {text!r}: expected start:stop:step with three numbers, e.g. 2:40:2")
        start, stop, step = (_decimal(p, w) for p, w in zip(parts, ("start", "stop", "step")))
        if step <= 0:
            raise CbsimError(f"--rates {text!r}: the step must be positive")
        if stop < start:
            raise CbsimError(f"--rates {text!r}: stop ({stop}) is below start ({start})")
        count = int(((stop - start) / step).to_integral_value(rounding=ROUND_FLOOR)) + 1
        if count > MAX_POINTS:
            shown = f"{count:,}" if count < 10**12 else f"about 10^{len(str(count)) - 1}"  # never 300 digits
            raise CbsimError(f"--rates {text!r} gives {shown} points (at most {MAX_POINTS:,}); raise the step")
        values = [start + i * step for i in range(count)]
    else:
        values = [_decimal(p, "rate") for p in text.split(",")]
    bad = [v for v in values if v <= 0]
    if bad:
        raise CbsimError(f"--rates {text!r}: rates must be positive requests per second, got {bad[0]}")
    return [float(v) for v in values]


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and braces, so ``[0, 600],[0, 60]`` is two values."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [v.strip() for v in out]


def parse_vary(text: str) -> tuple[str, list[str]]:
    """``field=v1,v2,...`` -> (field, [value texts]); each value is later parsed as YAML by --set."""
    fld, sep, values = (text or "").partition("=")
    fld = fld.strip()
    if not sep or not fld or not values.strip():
        raise CbsimError(f"--vary {text!r}: expected FIELD=V1,V2,..., e.g. "
                         "engine.max_num_batched_tokens=2048,4096,8192")
    items = split_top_level(values)
    if any(not v for v in items):
        raise CbsimError(f"--vary {text!r}: a value is empty (two commas in a row, or a trailing comma?)")
    if len(set(items)) != len(items):
        raise CbsimError(f"--vary {text!r}: a value is repeated")
    return fld, items


@dataclass(frozen=True)
class Point:
    """One run of a sweep: the point's own overrides and the coordinates it is plotted at."""

    index: int
    overrides: tuple[str, ...]
    rate: float | None = None  # set when the sweep varies the rate
    field: str | None = None  # the --vary field
    value: str | None = None  # its value, as written

    @property
    def label(self) -> str:
        bits = []
        if self.rate is not None:
            bits.append(f"rate={self.rate:g}")
        if self.field is not None:
            bits.append(f"{self.field}={self.value}")
        return " ".join(bits) or f"point {self.index}"


def make_points(rates: Sequence[float] | None = None, vary: tuple[str, Sequence[str]] | None = None) -> list[Point]:
    """Points for a rate list, a field's values, or both (every value at every rate)."""
    if not rates and not vary:
        raise CbsimError("a sweep needs --rates START:STOP:STEP or --vary FIELD=V1,V2,... (or both)")
    rate_list: list[float | None] = list(rates) if rates else [None]
    fld, values = vary if vary else (None, [None])
    points = []
    for i, (value, rate) in enumerate(itertools.product(values, rate_list)):
        ov = []
        if fld is not None:
            ov.append(f"{fld}={value}")
        if rate is not None:
            ov.append(f"workload.arrival.rate={rate!r}")
        points.append(Point(i, tuple(ov), rate, fld, value))
    return points


def arrival_rate(scn) -> float | None:
    """The scenario's synthetic arrival rate; None when arrivals are a trace's or written out."""
    w = scn.workload
    if w.requests is not None or w.arrival.process == "trace":
        return None
    return w.arrival.rate


# --- running one point ---------------------------------------------------------------------
def flatten(summary: dict, prefix: str = "") -> dict[str, Any]:
    """``{"ttft_s": {"p99": x}}`` -> ``{"ttft_s.p99": x}``."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{name}."))
        else:
            out[name] = v
    return out


def run_point(scenario, policies: list[str] | None) -> list[dict]:
    """Simulate one resolved scenario; one flattened summary row per policy (module level, so
    process pools and Ray can ship it)."""
    from sim.runner import run

    result = run(scenario, policies=policies)
    return [{"policy": label, **flatten(result.summaries[label])} for label in result.labels]


def point_key(scn, policies: list[str] | None) -> str:
    """What identifies a point's result on disk: its resolved scenario and policy selection."""
    text = "\n".join([KEY_VERSION, scn.to_yaml(), repr(sorted(policies) if policies else None)])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# --- executing many tasks ------------------------------------------------------------------
def default_workers(n_tasks: int) -> int:
    return max(1, min(n_tasks, os.cpu_count() or 1))


def execute(fn: Callable, tasks: Sequence[tuple], on_result: Callable[[int, Any], None], *,
            backend: str = "local", workers: int | None = None, ray_address: str | None = None,
            on_start: Callable[[], None] = lambda: None) -> None:
    """Call ``fn(*task)`` for every task and hand each result to ``on_result(index, result)`` in
    the calling process as it finishes (completion order). ``fn`` must be importable (module
    level) for process pools and Ray. ``on_start`` runs once the workers exist (start progress
    displays there, so no thread of theirs is forked)."""
    check_backend(backend, workers)
    if not tasks:
        return
    workers = workers or default_workers(len(tasks))
    if backend == "local":
        _execute_local(fn, tasks, on_result, min(workers, len(tasks)), on_start)
    elif backend == "ray":
        _execute_ray(fn, tasks, on_result, min(workers, len(tasks)), ray_address, on_start)


BACKENDS = ("local", "ray")


def check_backend(backend: str, workers: int | None) -> None:
    """Refuse an unknown ``--backend`` or a ``--workers`` below 1 before anything runs or is created."""
    if backend not in BACKENDS:
        from sim.errors import nearest

        raise CbsimError(f"unknown --backend {backend!r}{nearest(backend, BACKENDS)}: use local or ray")
    if workers is not None and workers < 1:
        raise CbsimError(f"--workers must be at least 1, got {workers}")
    if backend == "ray":
        require_ray()


def _pool_context():
    """``fork`` on Linux: workers start in milliseconds and a script needs no ``if __name__ ==
    "__main__"`` guard; they are forked before any thread of ours (the progress bar) starts, and
    only simulate. Elsewhere ``spawn`` (macOS's frameworks are not fork-safe): there, scripts that
    start a sweep need the main guard, as any multiprocessing program does."""
    import multiprocessing
    import sys

    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _execute_local(fn, tasks, on_result, workers: int, on_start) -> None:
    if workers == 1:
        on_start()
        for i, task in enumerate(tasks):
            on_result(i, fn(*task))
        return
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context())
    try:
        futures = {pool.submit(fn, *task): i for i, task in enumerate(tasks)}
        on_start()  # every worker exists now (a fork pool starts them all at the first submit)
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=futures.__getitem__):
                on_result(futures[fut], fut.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def require_ray():
    try:
        import ray
    except ImportError:
        raise CbsimError("--backend ray needs Ray: pip install 'cbsim[ray]' (or pip install ray)") from None
    return ray


def _execute_ray(fn, tasks, on_result, workers: int, address: str | None, on_start) -> None:
    ray = require_ray()
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False)
        started = True
    refs: dict = {}
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = {remote.remote(*task): i for i, task in enumerate(tasks)}
        on_start()
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                on_result(refs[ref], ray.get(ref))
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


# --- the sweep -----------------------------------------------------------------------------
@dataclass
class SweepResult:
    table: pd.DataFrame
    out_dir: Path
    ran: int  # points simulated by this call
    skipped: int  # points found on disk
    points: list[Point] = field(default_factory=list)
    plot: Path | None = None


def _write_atomic(df: pd.DataFrame, path: Path) -> None:
    """Write beside the target, then rename over it: readers see the old file or the new one."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sweep(scenario, points: Sequence[Point], out_dir, overrides: Iterable[str] = (),
          policies: list[str] | None = None, backend: str = "local", workers: int | None = None,
          ray_address: str | None = None, progress: bool = False, plot: bool = True) -> SweepResult:
    """Run every point (skipping those already in ``out_dir``) and write ``sweep.parquet``."""
    from sim.scenario.schema import load_scenario

    check_backend(backend, workers)
    base = load_scenario(scenario, list(overrides))
    labels = [e.label or e.name for e in base.policies]
    if policies:
        from sim.errors import nearest

        for label in policies:
            if label not in labels:
                raise CbsimError(f"--policy {label!r} is not in the scenario{nearest(label, labels)}; "
                                 f"its policies are: {', '.join(labels)}")
    if any(p.rate is not None for p in points) and arrival_rate(base) is None:
        raise CbsimError("--rates sets workload.arrival.rate, but this scenario's workload has no arrival "
                         "rate (a replayed trace, written-out workload.requests or closed-loop clients); use a "
                         "synthetic arrival process, or --vary another field (e.g. workload.trace.rate_scale=1,2,4 "
                         "or workload.arrival.concurrency=8,16,32)")
    # resolve every point first: a bad --vary value fails before anything runs
    resolved = [load_scenario(base, list(p.overrides)) for p in points]
    keys = [point_key(s, policies) for s in resolved]
    from sim.outputs import check_folder

    check_folder(out_dir, "the sweep")  # a file, an unwritable folder: refused before points/ is made
    out = Path(out_dir)
    pdir = out / "points"
    pdir.mkdir(parents=True, exist_ok=True)
    for stale in pdir.glob(".*.tmp"):  # left by a process killed mid-write
        stale.unlink(missing_ok=True)
    todo = [i for i, k in enumerate(keys) if not (pdir / f"{k}.parquet").exists()]
    unique_todo = list(dict.fromkeys(keys[i] for i in todo))
    first_of = {k: next(i for i in todo if keys[i] == k) for k in unique_todo}

    def save(task_index: int, rows: list[dict]) -> None:
        key = unique_todo[task_index]
        _write_atomic(pd.DataFrame(rows), pdir / f"{key}.parquet")
        tracker(1)

    tasks = [(resolved[first_of[k]], policies) for k in unique_todo]
    with _Tracker(len(points), len(points) - len(todo), progress) as tracker:
        execute(run_point, tasks, save, backend=backend, workers=workers, ray_address=ray_address,
                on_start=tracker.start)
    table = assemble(points, keys, resolved, pdir, labels if not policies else
                     [lbl for lbl in labels if lbl in policies])
    _write_atomic(table, out / "sweep.parquet")
    result = SweepResult(table, out, ran=len(unique_todo), skipped=len(points) - len(todo), points=list(points))
    if plot and len(table):
        result.plot = write_plot(table, base.slo, out, estimate_capacity(table),
                                 f"Latency versus load: {base.name} (capacity marked: highest swept rate meeting the SLO)")
    return result


def assemble(points: Sequence[Point], keys: Sequence[str], resolved, pdir: Path,
             labels: Sequence[str]) -> pd.DataFrame:
    """The sweep table from the point files, in point order then the scenario's policy order."""
    frames = []
    order = {lbl: i for i, lbl in enumerate(labels)}
    for p, key, scn in zip(points, keys, resolved):
        df = pd.read_parquet(pdir / f"{key}.parquet")
        df = df[df["policy"].isin(order)].copy()
        df = df.iloc[sorted(range(len(df)), key=lambda i: order[df["policy"].iloc[i]])]
        df.insert(0, "key", key)
        if p.field is not None:
            df.insert(0, p.field, p.value)
        df.insert(0, "rate", arrival_rate(scn))
        df.insert(0, "point", p.index)
        frames.append(df)
    table = pd.concat(frames, ignore_index=True)
    fld = next((p.field for p in points if p.field is not None), None)
    if fld is not None:
        table[fld] = _typed(table[fld])
    return table


def _typed(col: pd.Series) -> pd.Series:
    """Varied values as numbers when they all are, else as text."""
    from sim.scenario.overrides import parse_value

    parsed = [parse_value(v) for v in col]
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in parsed):
        return pd.Series(parsed, index=col.index)
    return col.astype(str)


def verdicts(table: pd.DataFrame) -> pd.Series:
    """Each row's SLO verdict in steady state (``steady.slo_met``, :mod:`sim.metrics.steady`),
    or the whole run's where the point's steady window was too short to judge."""
    whole = table["slo_met"] if "slo_met" in table else pd.Series(None, index=table.index, dtype=object)
    if "steady.slo_met" not in table:
        return whole
    steady = table["steady.slo_met"]
    return steady.where(steady.notna(), whole)


def steady_column(table: pd.DataFrame, name: str) -> pd.Series:
    """A summary figure (``ttft_s.p99``) from the steady window (``steady.ttft_s.p99``), or from
    the whole run where the point's window was too short."""
    whole = table[name] if name in table else pd.Series(float("nan"), index=table.index)
    steady = f"steady.{name}"
    if steady not in table:
        return whole
    return table[steady].where(table[steady].notna(), whole)


def estimate_capacity(table: pd.DataFrame) -> dict[str, float]:
    """Per policy (and varied value), the highest swept rate below which every swept rate met the
    SLO in steady state (:func:`verdicts`): the capacity to the resolution of the rate grid. Empty
    without rates or an SLO."""
    met = verdicts(table) if "slo_met" in table else None
    if "rate" not in table or table["rate"].isna().all() or met is None or met.isna().all():
        return {}
    out = {}
    keys = _series_key(table)
    for name in dict.fromkeys(keys):
        grp = table[keys == name].sort_values("rate")
        best = None
        for i in grp.index:
            if met[i] is True or met[i] == True:  # noqa: E712 (numpy bools)
                best = float(grp.at[i, "rate"])
            else:
                break
        if best is not None:
            out[name] = best
    return out


def _series_key(table: pd.DataFrame) -> pd.Series:
    """One line per policy, or per policy and varied value in a grid sweep."""
    extra = [c for c in table.columns[: list(table.columns).index("policy")] if c not in ("point", "rate", "key")]
    if not extra:
        return table["policy"]
    return table["policy"] + " " + table[extra[0]].astype(str)


# --- the latency-versus-load plot ----------------------------------------------------------
def plot_latency_vs_load(table: pd.DataFrame, slo=None, capacity: dict[str, float] | None = None,
                         title: str | None = None):
    """p50 (dashed) and p99 (solid) TTFT and TPOT per policy against the arrival rate (log
    scale), the SLO bounds as horizontal lines, and each policy's capacity point marked (a star
    on its p99 curves and a dotted vertical line) when ``capacity`` (label -> rate, e.g. from
    :func:`sim.planning.capacity.capacity` or :func:`estimate_capacity`) gives it. Returns a Figure in
    the style of :mod:`sim.plots`."""
    from sim.plots.style import new_figure, policy_colors, styled

    capacity = capacity or {}
    table = table[table["rate"].notna()]
    keys = _series_key(table)
    series = list(dict.fromkeys(keys))
    colors = policy_colors(series)
    with styled():
        fig = new_figure()
        axes = fig.subplots(1, 2)
        for a, metric, name in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
            for label in series:
                grp = table[keys == label].sort_values("rate")
                p99 = steady_column(grp, f"{metric}.p99") * 1e3
                color = colors[label]
                a.plot(grp["rate"], p99, "-o", color=color, ms=3.5, label=f"{label} p99")
                a.plot(grp["rate"], steady_column(grp, f"{metric}.p50") * 1e3, "--", color=color, alpha=0.75,
                       label=f"{label} p50")
                refused = grp["requests_refused"].fillna(0) > 0 if "requests_refused" in grp else None
                if refused is not None and refused.any():  # the p99 of what was served hides the 429s
                    a.plot(grp["rate"][refused], p99[refused], "X", color="crimson", ms=9, mec="black", mew=0.5,
                           ls="none", label=f"{label}: refused requests (late in the verdict)")
                if label in capacity:
                    cap = capacity[label]
                    a.axvline(cap, color=color, ls=":", lw=1.1)
                    a.plot([cap], [_interp(grp["rate"], p99, cap)], marker="*", ms=14,
                           color=color, mec="black", mew=0.6, ls="none",
                           label=f"{label} capacity {cap:.3g} req/s")
            bound = getattr(slo, metric, None) if slo is not None else None
            if bound is not None:
                pct = getattr(slo, "percentile", 99)
                line = a.axhline(bound * 1e3, color="crimson", lw=1.3, label=f"SLO: p{pct:g} {name} ≤ {bound * 1e3:g} ms")
                if a is axes[0]:  # the policies' legend is on the right; name this panel's bound here
                    a.legend(handles=[line], loc="upper left")
            a.set_yscale("log")
            _plain_log_ticks(a.yaxis)
            a.set_xlabel("arrival rate (requests/s)")
            a.set_ylabel(f"{name} (ms, log scale)")
            a.set_title(f"{name} in steady state: p50 dashed, p99 solid")
        axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.suptitle(title or "Latency versus load")
    return fig


def _plain_log_ticks(axis) -> None:
    """Log-axis tick labels as plain numbers ("60", "200"), not "6×10^1": decades labelled, and
    the 2 and 5 between them when the axis spans few decades."""
    import math

    from matplotlib.ticker import FuncFormatter

    def major(v, _pos):
        return f"{v:g}" if v > 0 else ""

    def minor(v, _pos):
        if v <= 0:
            return ""
        lo, hi = axis.get_view_interval()
        if lo > 0 and hi / lo > 1e3:  # many decades: the decades alone
            return ""
        lead = round(v / 10 ** math.floor(math.log10(v)), 6)
        return f"{v:g}" if lead in (2.0, 5.0) else ""

    axis.set_major_formatter(FuncFormatter(major))
    axis.set_minor_formatter(FuncFormatter(minor))


def _interp(xs, ys, x: float) -> float:
    import numpy as np

    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    ok = ~np.isnan(ys)
    return float(np.interp(x, xs[ok], ys[ok])) if ok.any() else float("nan")


def write_plot(table: pd.DataFrame, slo, out: Path, capacity: dict[str, float] | None = None,
               title: str | None = None) -> Path | None:
    """``latency_vs_load.png`` for a sweep over rates (nothing for a sweep without rates)."""
    if "rate" not in table or table["rate"].isna().all() or table["rate"].nunique() < 2:
        return None
    from sim.plots.style import save_png

    return save_png(plot_latency_vs_load(table, slo, capacity, title), out / "latency_vs_load.png")


# --- progress ------------------------------------------------------------------------------
class _Tracker:
    """A rich progress bar over points, shown from :meth:`start` (after the workers exist)."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.enabled = enabled
        self.total, self.done = total, done
        self.progress = None

    def __enter__(self):
        return self

    def start(self) -> None:
        if self.enabled and self.progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("points"), TimeElapsedColumn())
            self.progress.__enter__()
            self.task = self.progress.add_task("sweep", total=self.total, completed=self.done)

    def __exit__(self, *exc):
        if self.progress is not None:
            return self.progress.__exit__(*exc)
        return False

    def __call__(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress.advance(self.task, n)
