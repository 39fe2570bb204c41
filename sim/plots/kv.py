"""KV memory over time: how much of the GPU pool the policy holds, and when it runs out.

Preemptions (a request's KV dropped to make room) and swaps (blocks copied to and from the CPU
pool) are marked on the curve at the step that did them, so memory pressure reads as "the curve
hits the ceiling, then marks appear". When a policy swapped, a second panel shows the CPU swap
pool.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from sim.plots.series import step_series, value_at
from sim.plots.style import new_figure, policy_colors, styled, title_of

MARKS = (  # (steps column, marker, legend text)
    ("preempted", "x", "preemption"),
    ("swap_out_blocks", "v", "swap out to CPU"),
    ("swap_in_blocks", "^", "swap in from CPU"),
)


def plot_kv(result) -> Figure:
    """GPU KV blocks in use (% of usable blocks) per policy, with preemption and swap marks; the
    CPU swap pool's use below when any policy swapped."""
    colors = policy_colors(result.labels)
    steps_all = result.steps
    cpu_used = len(steps_all) > 0 and bool((steps_all["cpu_blocks_used"] > 0).any())
    with styled():
        fig = new_figure()
        if cpu_used:
            ax, ax_cpu = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
        else:
            ax, ax_cpu = fig.subplots(1, 1), None
        seen_marks = set()
        for label in result.labels:
            steps = steps_all[steps_all["policy"] == label]
            if steps.empty:
                continue
            meta = result.meta.get(label, {})
            total = meta.get("kv_blocks_total") or max(int(steps["kv_blocks_used"].max()), 1)
            pct = 100.0 * steps["kv_blocks_used"] / total
            mean = result.summaries[label].get("utilization", {}).get("kv")
            note = f"mean {100 * mean:.0f}% of {total} blocks" if mean is not None else f"{total} blocks"
            ax.plot(*step_series(steps, pct), color=colors[label], lw=1.4, label=f"{label} ({note})")
            for col, marker, _ in MARKS:
                hit = steps[col] > 0
                if hit.any():
                    seen_marks.add(col)
                    ax.scatter(*value_at(steps, pct, hit), marker=marker, s=36, color=colors[label],
                               linewidths=1.4, zorder=3, edgecolors=colors[label] if marker == "x" else "white")
            if ax_cpu is not None and (steps["cpu_blocks_used"] > 0).any():
                cpu_total = meta.get("cpu_blocks_total") or max(int(steps["cpu_blocks_used"].max()), 1)
                ax_cpu.plot(*step_series(steps, 100.0 * steps["cpu_blocks_used"] / cpu_total),
                            color=colors[label], lw=1.4, label=f"{label} ({cpu_total} CPU blocks)")
        handles, _ = ax.get_legend_handles_labels()
        for col, marker, text in MARKS:
            if col in seen_marks:
                handles.append(Line2D([], [], ls="none", marker=marker, color="#333333", label=text,
                                      markersize=7, markeredgewidth=1.4))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.set(ylabel="GPU KV blocks in use (%)", ylim=(0, 105),
               title="KV cache use (reserved or allocated blocks of the usable pool)")
        ax.set_xlim(left=0)
        last = ax
        if ax_cpu is not None:
            ax_cpu.set(ylabel="CPU swap pool in use (%)", title="CPU swap pool")
            ax_cpu.set_ylim(bottom=0)
            ax_cpu.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
            last = ax_cpu
        last.set_xlabel("simulated time (s)")
        fig.suptitle(title_of(result, "KV memory"))
    return fig
