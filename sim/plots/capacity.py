"""The quickstart's story in one picture: how many requests each policy serves on the same GPU and
workload, and why, on yardsticks that mean the same for every policy.

Left: each policy's *saturated throughput* (requests per second finished when every request
arrives at once: the ceiling no SLO can lift), with its ratio to static batching written on the
bar. Right, from the same saturated bursts: the mean batch relative to the most sequences the KV
memory holds at this workload's mean size (``batch_vs_memory``), the share of that memory holding
written tokens (``kv_written``), MFU and MBU. Slot utilization is left out on purpose: it divides
by each policy's own slot count, so it cannot be compared across policies.

Drawn from the summaries' ``saturated`` blocks, which ``cbsim run`` measures and stores in
summary.json when a scenario compares static with continuous batching
(:func:`sim.planning.story.measure`); without them there is no figure (None).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from sim.plots.style import new_figure, policy_colors, styled, title_of

MEASURES = (  # (key of the saturated block, axis label)
    ("batch_vs_memory", "batch vs what\nKV memory holds"),
    ("kv_written", "KV holding\nwritten tokens"),
    ("mfu", "MFU\n(useful compute)"),
    ("mbu", "MBU\n(memory bandwidth)"),
)


def saturated_blocks(result) -> dict[str, dict]:
    """Label -> ``saturated`` block, for the policies that have one with a throughput."""
    return {label: s["saturated"] for label, s in result.summaries.items()
            if isinstance(s.get("saturated"), dict) and s["saturated"].get("rps")}


def plot_capacity(result) -> Figure | None:
    """Saturated throughput per policy (ratio to static annotated) next to the comparable
    utilizations at saturation; None when the summaries hold no ``saturated`` blocks."""
    blocks = saturated_blocks(result)
    if not blocks:
        return None
    labels = [lbl for lbl in result.labels if lbl in blocks]
    colors = policy_colors(result.labels)
    static = next((lbl for lbl in labels if result.meta.get(lbl, {}).get("policy") == "static"), None)
    with styled():
        fig = new_figure()
        ax_rate, ax_util = fig.subplots(1, 2, width_ratios=(1, 1.6))
        rates = [blocks[lbl]["rps"] for lbl in labels]
        bars = ax_rate.bar(labels, rates, color=[colors[lbl] for lbl in labels], width=0.65)
        for bar, lbl in zip(bars, labels):
            ratio = blocks[lbl].get("vs_static")
            text = f"{blocks[lbl]['rps']:.3g} req/s"
            if ratio and lbl != static:
                text += f"\n{ratio:.1f}x static"
            ax_rate.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                             va="bottom", xytext=(0, 3), textcoords="offset points", fontsize=10,
                             fontweight="bold" if lbl != static else "normal")
        ax_rate.set_ylim(0, max(rates) * 1.25)
        ax_rate.set(ylabel="saturated throughput (req/s, one replica)",
                    title="Saturated throughput (every request at once)")
        width = 0.8 / len(labels)
        x = np.arange(len(MEASURES))
        for i, lbl in enumerate(labels):
            vals = [blocks[lbl].get(key) for key, _ in MEASURES]
            pct = [100 * v if v is not None else 0.0 for v in vals]
            pos = x - 0.4 + width * (i + 0.5)
            ax_util.bar(pos, pct, width=width * 0.92, color=colors[lbl], label=lbl)
            for p, v, val in zip(pos, pct, vals):
                ax_util.annotate("-" if val is None else f"{v:.0f}%", (p, v), ha="center", va="bottom",
                                 xytext=(0, 2), textcoords="offset points", fontsize=8)
        ax_util.set_xticks(x, [name for _, name in MEASURES])
        ax_util.grid(axis="x", visible=False)
        ax_util.set_ylim(0, 115)
        mem = {result.summaries[lbl].get("memory_sequences") for lbl in labels} - {None}
        held = f" (KV holds about {min(mem):,.0f} sequences)" if mem else ""
        ax_util.set(ylabel="% at saturation (same yardstick for every policy)",
                    title=f"How full the GPU is while saturated{held}")
        ax_util.legend(loc="upper left", ncols=len(labels))
        head = "Saturated throughput and utilization"
        best = max((lbl for lbl in labels if lbl != static), key=lambda k: blocks[k]["rps"], default=None)
        if static is not None and best is not None and blocks[best].get("vs_static"):
            head = f"Continuous batching serves {blocks[best]['vs_static']:.1f}x the requests of static batching"
        fig.suptitle(title_of(result, head))
    return fig
