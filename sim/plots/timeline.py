"""The per-request Gantt chart of a small run, with a slots strip under it (the seeds' chart).

Each request is a row of bars, derived from what ``requests`` records (arrival, first admission,
first token, finish and the time of every token) and the steps' intervals:

* **queued**: arrival -> first admission (never admitted: arrival -> end of the run).
* **prefill**: first admission -> first token. The step that computes a prompt's last chunk
  emits its first token, so this spans every prefill chunk (and any pause between chunks).
* **decode**: first token -> last token, split wherever the request skipped steps. Token ``j``
  is emitted at the end of some step of the request's replica; if that step started after token
  ``j - 1``, the request sat out the steps in between: that gap is not decode.
* **preempted** / **stalled**: such gaps. The requests table counts preemptions but does not say
  when they happened, so the request's ``preemptions`` longest gaps are drawn as preempted (the
  KV was dropped or swapped out: the span covers the wait and any recompute) and the other gaps
  as stalled (the request kept its KV but a step ran without it, e.g. vLLM V0's prefill-only
  steps pausing every decode). A preemption during the first prefill falls inside the prefill
  bar, and then one decode gap is mislabelled preempted: a best effort from recorded times.
* **rejected** requests get a cross at their arrival.

The strip below shows, for every step, the policy's slots: continuing sequences, sequences that
joined in this step (admitted or re-admitted), and idle slots, red when requests were waiting
at the end of the step (a slot free while work queues: static batching's head-of-line
blocking, or memory that blocks admission) and grey otherwise. Static batching shows idle
slots while the batch's longest member finishes and joins only when a whole batch starts;
continuous batching (orca and later) refills a freed slot in the next step, so joined and
continuing sequences share a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.plots.series import segments
from sim.plots.style import DPI, PHASE_COLORS, SIZE_IN, SLOT_COLORS, new_figure, styled, title_of

MAX_REQUESTS = 60
PHASES = tuple(PHASE_COLORS)


@dataclass
class Timeline:
    """What one policy's timeline panel draws."""

    label: str
    bars: pd.DataFrame  # id, row, phase, start_s, end_s
    slots: pd.DataFrame  # one row per step: replica, step, start_s, duration_s, busy, joined, ...
    rejected: pd.DataFrame  # id, row, arrival_s
    ids: list[str]  # the rows, top to bottom
    total_requests: int
    max_slots: int
    end_s: float

    @property
    def truncated(self) -> bool:
        return len(self.ids) < self.total_requests

    def phase_time(self, request_id: str, phase: str) -> float:
        b = self.bars[(self.bars["id"] == request_id) & (self.bars["phase"] == phase)]
        return float((b["end_s"] - b["start_s"]).sum())


def slot_occupancy(steps: pd.DataFrame, max_slots: int) -> pd.DataFrame:
    """Per step: busy slots split into continuing and joined, idle slots split by whether
    requests were waiting at the end of the step, and whether the step *refilled* a slot: it
    admitted a request while requests admitted earlier were still running (continuous batching;
    a static batch only ever admits into an empty batch)."""
    busy = steps["num_seqs"].to_numpy(dtype=int)
    admitted = steps["admitted"].to_numpy(dtype=int)
    joined = np.minimum(admitted, busy)
    idle = np.maximum(max_slots - busy, 0)
    waiting = steps["waiting"].to_numpy(dtype=int) > 0
    # requests held before the step = held after it - admitted in it + finished in it
    held_before = (steps["running"].to_numpy(dtype=int) - admitted + steps["finished"].to_numpy(dtype=int))
    return pd.DataFrame({
        "replica": steps["replica"].to_numpy(),
        "step": steps["step"].to_numpy(),
        "start_s": steps["start_s"].to_numpy(dtype=float),
        "duration_s": steps["duration_s"].to_numpy(dtype=float),
        "busy": busy,
        "joined": joined,
        "continuing": busy - joined,
        "idle": idle,
        "idle_waiting": np.where(waiting, idle, 0),
        "idle_free": np.where(waiting, 0, idle),
        "refill": (admitted > 0) & (held_before > 0),
    })


def _step_index(steps: pd.DataFrame) -> dict:
    """replica -> (sorted step ends, their starts): to find the step that emitted a token."""
    out = {}
    for rep, s in steps.groupby("replica"):
        start = s["start_s"].to_numpy(dtype=float)
        end = start + s["duration_s"].to_numpy(dtype=float)
        order = np.argsort(end, kind="stable")
        out[rep] = (end[order], start[order])
    return out


def _request_bars(r, index: dict, run_end: float, tol: float) -> list[tuple[str, float, float]]:
    a, ad, ft = float(r.arrival_s), float(r.admitted_s), float(r.first_token_s)
    bars: list[tuple[str, float, float]] = []
    if np.isnan(ad):
        return [("queued", a, max(run_end, a))]
    if ad > a + tol:
        bars.append(("queued", a, ad))
    if np.isnan(ft):
        return [*bars, ("prefill", ad, max(run_end, ad))]
    bars.append(("prefill", ad, ft))
    times = np.asarray(r.token_times_s, dtype=float)
    gaps: list[tuple[float, float]] = []
    seg = ft
    if len(times) > 1 and r.replica in index:
        ends, starts = index[r.replica]
        k = np.clip(np.searchsorted(ends, times[1:] - tol), 0, len(ends) - 1)
        step_start = starts[k]
        for prev, s in zip(times[:-1], step_start):
            if s > prev + tol:  # the step that emitted this token began after the previous token
                if prev > seg:
                    bars.append(("decode", seg, prev))
                gaps.append((prev, s))
                seg = s
    last = times[-1] if len(times) else ft
    if last > seg:
        bars.append(("decode", seg, last))
    if r.state == "unfinished" and run_end > last + tol:
        gaps.append((last, run_end))
    n_pre = int(getattr(r, "preemptions", 0) or 0)
    longest = set(sorted(range(len(gaps)), key=lambda i: gaps[i][1] - gaps[i][0], reverse=True)[:n_pre])
    for i, (s, e) in enumerate(gaps):
        bars.append(("preempted" if i in longest else "stalled", s, e))
    return bars


def timeline_data(result, policy: str | None = None, max_requests: int = MAX_REQUESTS) -> Timeline:
    """The bars and slot strip of one policy's timeline (default: the first policy), for the
    first ``max_requests`` requests by arrival."""
    label = policy if policy is not None else result.labels[0]
    if label not in result.labels:
        from sim.errors import CbsimError, nearest

        raise CbsimError(f"no policy labelled {label!r} in this result{nearest(label, result.labels)}; "
                         f"its policies are: {', '.join(result.labels)}")
    req = result.requests[result.requests["policy"] == label]
    steps = result.steps[result.steps["policy"] == label]
    max_slots = int(result.meta.get(label, {}).get("max_slots") or (steps["num_seqs"].max() if len(steps) else 1))
    run_end = float((steps["start_s"] + steps["duration_s"]).max()) if len(steps) else float(req["arrival_s"].max())
    tol = 1e-9 * max(1.0, abs(run_end))
    shown = req.sort_values(["arrival_s"], kind="stable").head(max_requests)
    ids = [str(i) for i in shown["id"]]
    index = _step_index(steps)
    rows, rejected = [], []
    for row, r in enumerate(shown.itertuples(index=False)):
        if r.state == "rejected":
            rejected.append((str(r.id), row, float(r.arrival_s)))
            continue
        for phase, s, e in _request_bars(r, index, run_end, tol):
            if e > s + tol:
                rows.append((str(r.id), row, phase, s, e))
    bars = pd.DataFrame(rows, columns=["id", "row", "phase", "start_s", "end_s"])
    return Timeline(
        label=label,
        bars=bars,
        slots=slot_occupancy(steps, max_slots),
        rejected=pd.DataFrame(rejected, columns=["id", "row", "arrival_s"]),
        ids=ids,
        total_requests=len(req),
        max_slots=max_slots,
        end_s=run_end,
    )


def timeline_size_in(n_policies: int) -> tuple[float, float]:
    """1200 px wide; 700 px tall for up to two policies, 350 px more per further policy."""
    return SIZE_IN[0], max(SIZE_IN[1], 3.5 * n_policies)


def timeline_size_px(n_policies: int) -> tuple[int, int]:
    w, h = timeline_size_in(n_policies)
    return round(w * DPI), round(h * DPI)


def _draw_gantt(ax, tl: Timeline, panel_px: float) -> None:
    n = len(tl.ids)
    height = 0.72
    for phase in PHASES:
        b = tl.bars[tl.bars["phase"] == phase]
        if b.empty:
            continue
        hatch = "////" if phase == "preempted" else None
        ax.barh(b["row"], b["end_s"] - b["start_s"], left=b["start_s"], height=height,
                color=PHASE_COLORS[phase], edgecolor="white" if hatch is None else "#7a2a00",
                linewidth=0.4 if hatch is None else 0.0, hatch=hatch)
    if len(tl.rejected):
        ax.scatter(tl.rejected["arrival_s"], tl.rejected["row"], marker="x", color="#b2182b", s=40, zorder=3)
    ax.set_ylim(n - 0.5, -0.5)
    every = max(1, int(np.ceil(n * 13 / max(panel_px, 1))))  # a label needs ~13 px
    ax.set_yticks(range(0, n, every), [tl.ids[i] for i in range(0, n, every)], fontsize=8.5)
    ax.grid(axis="y", visible=False)
    ax.set_ylabel("request")


def _draw_strip(ax, tl: Timeline, until: float | None = None) -> None:
    s = tl.slots if until is None else tl.slots[tl.slots["start_s"] < until]
    reps = sorted(s["replica"].unique()) if len(s) else [0]
    layers = (("continuing", "continuing"), ("joined", "joined"),
              ("idle_waiting", "idle while requests wait"), ("idle_free", "idle"))
    for i, rep in enumerate(reps):
        r = s[s["replica"] == rep]
        bottom = np.full(len(r), float(i * tl.max_slots))
        start = r["start_s"].to_numpy(dtype=float)
        end = start + r["duration_s"].to_numpy(dtype=float)
        for col, key in layers:
            h = r[col].to_numpy(dtype=float)
            if len(r) <= 150:  # few steps: one outlined cell per step, like the seeds' chart
                ax.bar(start, h, width=end - start, bottom=bottom, align="edge", color=SLOT_COLORS[key],
                       edgecolor="white", linewidth=0.6)
            else:  # many steps: one filled band per layer (thousands of bars render slowly)
                t, lo = segments(start, end, bottom)
                _, hi = segments(start, end, bottom + h)
                ax.fill_between(t, lo, hi, color=SLOT_COLORS[key], lw=0)
            bottom = bottom + h
    total = tl.max_slots * len(reps)
    ax.set_ylim(0, total)
    ax.set_yticks(range(0, total + 1) if total <= 4 else [0, total])
    ax.grid(axis="x", visible=False)
    ax.set_ylabel("slots", rotation=0, ha="right", va="center")
    ax.set_title(strip_caption(tl), fontsize=9, fontweight="normal", loc="left")


def strip_caption(tl: Timeline) -> str:
    """Slot utilization (duration-weighted, as in the summary), idle slots while requests wait,
    and refills; in slot-steps too when every step took the same time (the seeds' toy)."""
    s = tl.slots
    if s.empty:
        return "no steps"
    dur = s["duration_s"]
    cap = float(tl.max_slots * dur.sum())
    util = float((s["busy"] * dur).sum()) / cap
    wait_idle = float((s["idle_waiting"] * dur).sum()) / cap
    text = f"slot utilization {100 * util:.0f}%"
    if np.allclose(dur, dur.iloc[0]):
        text += f" ({int(s['busy'].sum())} of {tl.max_slots * len(s)} slot-steps)"
    text += f"; idle while requests wait: {100 * wait_idle:.0f}% of slot time"
    if np.allclose(dur, dur.iloc[0]):
        text += f" ({int(s['idle_waiting'].sum())} slot-steps)"
    text += f"; steps that refill a freed slot: {int(s['refill'].sum())}"
    reps = s["replica"].nunique()
    return text + (f"; {reps} replicas stacked" if reps > 1 else "")


def plot_timeline(result, policy: str | list[str] | None = None, max_requests: int = MAX_REQUESTS) -> Figure:
    """Per-request Gantt (queued / prefill / decode / stalled / preempted) over a slots strip, one
    pair of panels per policy (``policy``: a label, a list of labels, or every policy)."""
    labels = result.labels if policy is None else ([policy] if isinstance(policy, str) else list(policy))
    timelines = [timeline_data(result, label, max_requests) for label in labels]
    with styled():
        fig = new_figure(timeline_size_in(len(timelines)))
        ratios = []
        for tl in timelines:
            ratios += [max(len(tl.ids), 4), max(1.6, 0.22 * max(len(tl.ids), 4))]
        axes = fig.subplots(2 * len(timelines), 1, sharex=True, height_ratios=ratios)
        usable_px = fig.get_figheight() * DPI * 0.8  # less titles, legend and axis labels
        ends = [float(tl.bars["end_s"].max()) if tl.truncated and len(tl.bars) else tl.end_s for tl in timelines]
        end = max(ends, default=0.0)
        for i, tl in enumerate(timelines):
            gantt, strip = axes[2 * i], axes[2 * i + 1]
            _draw_gantt(gantt, tl, usable_px * ratios[2 * i] / sum(ratios))
            _draw_strip(strip, tl, until=end * 1.01 if tl.truncated else None)
            n_steps = len(tl.slots)
            shown = f"first {len(tl.ids)} of {tl.total_requests}" if tl.truncated else f"{tl.total_requests}"
            gantt.set_title(f"{tl.label}: {shown} requests, {n_steps} steps, last step ends at {tl.end_s:.4g} s",
                            loc="left")
            if n_steps <= 60:
                for x in tl.slots["start_s"]:
                    gantt.axvline(x, color="#bbbbbb", lw=0.5, zorder=0)
        axes[-1].set_xlabel("simulated time (s)")
        axes[-1].set_xlim(0, end * 1.01 if end > 0 else 1)
        handles = [Patch(color=PHASE_COLORS[p], label=p) for p in PHASES]
        handles[PHASES.index("preempted")] = Patch(facecolor=PHASE_COLORS["preempted"], edgecolor="#7a2a00",
                                                   hatch="////", label="preempted")
        handles.append(Patch(color="none", label="  slots:"))
        handles += [Patch(color=c, label=k) for k, c in SLOT_COLORS.items() if k != "idle"]
        handles.append(Patch(facecolor=SLOT_COLORS["idle"], edgecolor="#999999", label="idle"))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9,
                   handlelength=1.4, columnspacing=1.0)
        fig.suptitle(title_of(result, "Request timeline"))
    return fig
