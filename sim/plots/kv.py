"""KV memory over time: how much of the GPU pool each policy holds, and when it runs out.

One panel per policy (small multiples on shared axes: six overlaid memory curves are unreadable).
Preemptions (a request's KV dropped to make room) and swaps (blocks copied to and from the CPU
pool) are marked on the curve at the step that did them, so memory pressure reads as "the curve
hits the ceiling, then marks appear". A policy that swapped also shows its CPU swap pool, dashed.
Values are the blocks held once each step has finished (the engine records them then), drawn
over that step.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from sim.plots.series import step_series, value_at
from sim.plots.style import new_figure, policy_colors, styled, title_of

MARKS = (  # (steps column, marker, legend text)
    ("preempted", "x", "preemption"),
    ("swap_out_blocks", "v", "swap out to CPU"),
    ("swap_in_blocks", "^", "swap in from CPU"),
)
CPU_COLOR = "#444444"


def grid_shape(n: int) -> tuple[int, int]:
    """(rows, cols) of small multiples: one column up to three panels, then two."""
    cols = 1 if n <= 3 else 2
    return math.ceil(n / cols), cols


def plot_kv(result) -> Figure:
    """GPU KV blocks in use (% of usable blocks), one panel per policy, with preemption and swap
    marks; the CPU swap pool's use (dashed) for policies that swapped."""
    colors = policy_colors(result.labels)
    labels = result.labels
    rows, cols = grid_shape(len(labels))
    with styled():
        fig = new_figure()
        axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
        seen = set()
        peak = 0.0
        for ax, label in zip(axes, labels):
            steps = result.steps[result.steps["policy"] == label]
            meta = result.meta.get(label, {})
            total = meta.get("kv_blocks_total") or max(int(steps["kv_blocks_used"].max() if len(steps) else 1), 1)
            summary = result.summaries.get(label, {})
            mean = (summary.get("utilization") or {}).get("kv")
            n_pre = summary.get("preemptions", int(steps["preempted"].sum()) if len(steps) else 0)
            mean_txt = f"mean {100 * mean:.0f}% of " if mean is not None else ""
            ax.set_title(f"{label}: {mean_txt}{total} blocks, {n_pre} preemptions", loc="left", fontsize=10.5)
            if steps.empty:
                continue
            pct = 100.0 * steps["kv_blocks_used"] / total
            peak = max(peak, float(pct.max()))
            ax.plot(*step_series(steps, pct), color=colors[label], lw=1.3)
            if (steps["cpu_blocks_used"] > 0).any():
                cpu_total = meta.get("cpu_blocks_total") or max(int(steps["cpu_blocks_used"].max()), 1)
                ax.plot(*step_series(steps, 100.0 * steps["cpu_blocks_used"] / cpu_total),
                        color=CPU_COLOR, lw=1.1, ls="--")
                seen.add("cpu")
            for col, marker, _ in MARKS:
                hit = steps[col] > 0
                if hit.any():
                    seen.add(col)
                    edge = {} if marker == "x" else {"edgecolors": "white"}  # an 'x' has no face
                    ax.scatter(*value_at(steps, pct, hit), marker=marker, s=30, color=CPU_COLOR if marker != "x"
                               else "#b2182b", linewidths=1.2 if marker == "x" else 0.5, zorder=3, **edge)
        for ax in axes[len(labels):]:
            ax.set_visible(False)
        for ax in axes[:len(labels)]:
            # the whole pool when memory gets anywhere near full; else zoom in so a light load is legible
            ax.set_ylim(0, 105 if peak >= 40 else max(5.0, 5 * np.ceil(peak * 1.2 / 5)))
            ax.set_xlim(left=0)
        for r in range(rows):
            axes[r * cols].set_ylabel("KV in use (%)")
        for ax in axes[max(0, len(labels) - cols):len(labels)]:
            ax.set_xlabel("simulated time (s)")
            ax.xaxis.set_tick_params(labelbottom=True)
        handles = [Line2D([], [], color="#777777", lw=1.6, label="GPU KV blocks held (policy colour)")]
        if "cpu" in seen:
            handles.append(Line2D([], [], color=CPU_COLOR, lw=1.2, ls="--", label="CPU swap pool in use"))
        for col, marker, text in MARKS:
            if col in seen:
                handles.append(Line2D([], [], ls="none", marker=marker, label=text, markersize=7,
                                      color="#b2182b" if marker == "x" else CPU_COLOR, markeredgewidth=1.3))
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))
        fig.suptitle(title_of(result, "KV cache use (% of usable blocks, after each step)"))
    return fig
