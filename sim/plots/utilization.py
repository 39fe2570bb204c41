"""How full the batch is over time, against what memory allows, and the queue behind it.

One panel per policy (small multiples on shared axes: six overlaid batch curves are an unreadable
band). Each panel draws the running batch size (sequences the step computes, policy colour) and
the requests waiting for admission (grey), both counts on one axis, with two limits: the policy's
own slot count (dotted: static's batch size, ``max_num_seqs`` for the others) and the most
sequences the KV memory holds at this workload's mean size (dashed, ``memory_sequences``: the
same for every policy, :mod:`sim.metrics.summary`). A static batch whose members finished shows as
a drop lasting until its longest member is done (idle slots); a queue that grows while the batch
stays far below the memory line is a policy that cannot use its memory (reservations, a small
batch), one that grows at the line is a GPU that is full. At a light load the panels zoom in on
the data and a limit far above is left off the scale (its value is in each panel's title).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from sim.plots.kv import grid_shape
from sim.plots.series import step_series
from sim.plots.style import new_figure, policy_colors, styled, title_of

QUEUE_COLOR = "#8a8a8a"
LIMIT_COLOR = "#333333"
ZOOM = 2.5  # a limit more than this many times the highest batch or queue is left off the scale


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _panel_title(label: str, summary: dict, slots) -> str:
    util = summary.get("utilization") or {}
    mem, batch = summary.get("memory_sequences"), summary.get("mean_batch")
    head = f"{label}: mean batch {batch:.3g}" if batch is not None else label
    if util.get("batch_vs_memory") is not None and mem:
        head += f" = {_pct(util['batch_vs_memory'])} of the {mem:,.0f} KV holds"
    return head + f"; {_pct(util.get('slots'))} of its {slots} slots"


def plot_utilization(result) -> Figure:
    """Running batch size and waiting requests over time, one panel per policy, with the policy's
    slot limit and the memory bound drawn as lines."""
    colors = policy_colors(result.labels)
    labels = result.labels
    rows, cols = grid_shape(len(labels))
    with styled():
        fig = new_figure()
        axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
        peak, limits = 1.0, []
        for ax, label in zip(axes, labels):
            steps = result.steps[result.steps["policy"] == label]
            summary = result.summaries.get(label, {})
            slots = result.meta.get(label, {}).get("max_slots") or (int(steps["num_seqs"].max()) if len(steps) else 1)
            ax.set_title(_panel_title(label, summary, slots), loc="left", fontsize=10)
            if steps.empty:
                continue
            ax.plot(*step_series(steps, steps["num_seqs"]), color=colors[label], lw=1.4)
            ax.plot(*step_series(steps, steps["waiting"]), color=QUEUE_COLOR, lw=1.0)
            peak = max(peak, float(steps["num_seqs"].max()), float(steps["waiting"].max()))
            mem = summary.get("memory_sequences")
            ax.axhline(slots, color=LIMIT_COLOR, ls=":", lw=1.0)
            limits.append(float(slots))
            if mem:
                ax.axhline(mem, color=LIMIT_COLOR, ls="--", lw=1.0)
                limits.append(float(mem))
        # the limits set the scale when the data come near one; a light load is zoomed in on instead
        # (a limit far above lies off the panel: its value is in the panel's title)
        top = max([peak, *(v for v in limits if v <= ZOOM * peak)])
        for ax in axes[len(labels):]:
            ax.set_visible(False)
        for ax in axes[:len(labels)]:
            ax.set_ylim(0, top * 1.08)
            ax.set_xlim(left=0)
        for r in range(rows):
            axes[r * cols].set_ylabel("sequences / requests")
        for ax in axes[max(0, len(labels) - cols):len(labels)]:
            ax.set_xlabel("simulated time (s)")
            ax.xaxis.set_tick_params(labelbottom=True)
        handles = [Line2D([], [], color="#777777", lw=1.6, label="running batch (policy colour)"),
                   Line2D([], [], color=QUEUE_COLOR, lw=1.0, label="waiting for admission"),
                   Line2D([], [], color=LIMIT_COLOR, ls="--", lw=1.0, label="sequences KV memory holds"),
                   Line2D([], [], color=LIMIT_COLOR, ls=":", lw=1.0, label="the policy's slot limit")]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))
        if len(result.steps) and result.steps.groupby("policy")["replica"].nunique().max() > 1:
            fig.supylabel("per replica, mean over time bins", fontsize=9, color="#555555")
        fig.suptitle(title_of(result, "Batch size against what memory allows"))
    return fig
