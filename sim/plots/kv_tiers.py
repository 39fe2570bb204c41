"""Where returning prompts' KV came from, over time: computed, hit in the GPU prefix cache, or
loaded from the offload tiers (policies.kv.tiers). Drawn only when a policy ran with KV tiers.

One panel per policy, on shared axes: prompt tokens per second by source, each request counted
at its admission (``requests.parquet``: ``prompt_tokens``, ``prefix_hit_tokens`` found cached at
admission in any tier, ``tier_hit_tokens`` those of them loaded from below the GPU), in equal time
bins. A policy whose GPU cache keeps up shows little of the tiers; one whose GPU cache other
traffic overwrites between a session's turns shows the tiers taking over from recomputation.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from sim.plots.kv import grid_shape
from sim.plots.style import new_figure, styled, title_of

BINS = 60
SOURCES = (("computed", "#b2182b"), ("GPU prefix cache", "#2166ac"), ("offload tiers", "#1b7837"))


def plot_kv_tiers(result) -> Figure | None:
    labels = [lb for lb in result.labels if (result.summaries.get(lb) or {}).get("kv_tiers")]
    if not labels or "tier_hit_tokens" not in result.requests:
        return None
    labels = list(result.labels)  # every policy, so runs without the tiers compare on the same axes
    req = result.requests
    admitted = req["admitted_s"].to_numpy(dtype=float)
    ok = ~np.isnan(admitted)
    if not ok.any():
        return None
    edges = np.linspace(0.0, float(admitted[ok].max()) or 1.0, BINS + 1)
    width = edges[1] - edges[0]
    rows, cols = grid_shape(len(labels))
    with styled():
        fig = new_figure()
        axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
        for ax, label in zip(axes, labels):
            r = req[(req["policy"] == label) & ok]
            t = r["admitted_s"].to_numpy(dtype=float)
            prompt = r["prompt_tokens"].to_numpy(dtype=float)
            hit = r["prefix_hit_tokens"].to_numpy(dtype=float)
            tier = r["tier_hit_tokens"].to_numpy(dtype=float)
            parts = (prompt - hit, hit - tier, tier)
            base = np.zeros(BINS)
            mids = (edges[:-1] + edges[1:]) / 2
            for (name, color), w in zip(SOURCES, parts):
                per_s = np.histogram(t, bins=edges, weights=w)[0] / width
                ax.fill_between(
                    mids, base, base + per_s, step="mid", color=color, alpha=0.75, lw=0, label=name
                )
                base = base + per_s
            total = prompt.sum() or 1.0
            ax.set_title(
                f"{label}: {100 * parts[2].sum() / total:.0f}% of prompt tokens from the tiers, "
                f"{100 * parts[1].sum() / total:.0f}% GPU cache",
                loc="left",
                fontsize=10.5,
            )
        for r_ in range(rows):
            axes[r_ * cols].set_ylabel("prompt tokens / s")
        for ax in axes[max(0, len(labels) - cols) : len(labels)]:
            ax.set_xlabel("simulated time (s, at admission)")
            ax.xaxis.set_tick_params(labelbottom=True)
        for ax in axes[len(labels) :]:
            ax.set_visible(False)
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncols=len(names))
        fig.suptitle(title_of(result, "Prompt KV by source: computed, GPU prefix cache, offload tiers"))
    return fig
