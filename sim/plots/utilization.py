"""How full the batch is over time: slot utilization, batch size, and the queue behind it.

Slot utilization is the share of the policy's slots (static: its batch size; the others:
``max_num_seqs``) holding a sequence the step computes. A static batch whose members finished
shows here as a drop that lasts until its longest member is done (idle slots); a queue that grows
while utilization is below 100 % is head-of-line blocking or memory pressure.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from sim.plots.series import step_series
from sim.plots.style import new_figure, policy_colors, styled, title_of


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def plot_utilization(result) -> Figure:
    """Slot utilization (%), running batch size (sequences per step) and waiting requests over time,
    one line per policy."""
    colors = policy_colors(result.labels)
    with styled():
        fig = new_figure()
        ax_util, ax_batch, ax_queue = fig.subplots(3, 1, sharex=True)
        for label in result.labels:
            steps = result.steps[result.steps["policy"] == label]
            if steps.empty:
                continue
            slots = result.meta.get(label, {}).get("max_slots") or steps["num_seqs"].max() or 1
            mean = result.summaries[label].get("utilization", {}).get("slots")
            kw = {"color": colors[label], "lw": 1.4}
            ax_util.plot(*step_series(steps, 100.0 * steps["num_seqs"] / slots),
                         label=f"{label}\n(mean {_pct(mean)} of {slots} slots)", **kw)
            ax_batch.plot(*step_series(steps, steps["num_seqs"]), **kw)
            ax_queue.plot(*step_series(steps, steps["waiting"]), **kw)
        ax_util.set(ylabel="slot utilization (%)", ylim=(0, 105),
                    title="Slots holding a sequence the step computes")
        fig.legend(*ax_util.get_legend_handles_labels(), loc="outside right upper")
        ax_batch.set(ylabel="batch size (sequences)", title="Running batch size")
        ax_batch.set_ylim(bottom=0)
        ax_queue.set(ylabel="waiting (requests)", xlabel="simulated time (s)",
                     title="Requests waiting for admission (queued, preempted or swapped out)")
        ax_queue.set_ylim(bottom=0)
        ax_queue.set_xlim(left=0)
        if len(result.steps) and result.steps.groupby("policy")["replica"].nunique().max() > 1:
            fig.supylabel("per replica, mean over time bins", fontsize=9, color="#555555")
        fig.suptitle(title_of(result, "Slot utilization and batch size"))
    return fig
