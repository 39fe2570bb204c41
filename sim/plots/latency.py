"""TTFT and TPOT distributions per policy, as empirical CDFs (the curve Vidur and papers show).

A CDF's denominator is every request of the policy that was not rejected, so a policy that left
requests unfinished (or never gave them a first token) tops out below 1: the plot does not hide
a backlog. SLO bounds from the scenario are drawn as dashed vertical lines (or noted at the edge
when far beyond every value, rather than squashing the curves).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from sim.plots.style import new_figure, policy_colors, styled, title_of


def ecdf(values, n_total: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sorted finite values and the fraction of ``n_total`` (default: their count) at or below each."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    n = n_total if n_total else len(v)
    return v, np.arange(1, len(v) + 1) / max(n, 1)


def fmt(v: float) -> str:
    """A latency for a legend: 3 significant digits, no exponent for everyday magnitudes."""
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _use_log(all_values: list[np.ndarray]) -> bool:
    v = np.concatenate(all_values) if all_values else np.array([])
    v = v[np.isfinite(v) & (v > 0)]
    return v.size > 1 and np.percentile(v, 99) / np.percentile(v, 1) > 30


def plot_latency_cdfs(result) -> Figure:
    """Empirical CDFs of TTFT (s) and TPOT (ms), one line per policy; SLO bounds dashed."""
    colors = policy_colors(result.labels)
    slo = getattr(result.scenario, "slo", None)
    panels = (("ttft_s", 1.0, "s", "TTFT (s)", "Time to first token", getattr(slo, "ttft_s", None)),
              ("tpot_s", 1e3, "ms", "TPOT (ms)", "Time per output token", getattr(slo, "tpot_s", None)))
    with styled():
        fig = new_figure()
        axes = fig.subplots(1, 2, sharey=True)
        for ax, (col, scale, unit, xlabel, title, bound) in zip(axes, panels):
            drawn = []
            for label in result.labels:
                req = result.requests[result.requests["policy"] == label]
                req = req[req["state"] != "rejected"]
                if col == "tpot_s":  # TPOT exists only for requests with two or more tokens
                    req = req[~((req["state"] == "finished") & (req["generated"] < 2))]
                x, y = ecdf(req[col] * scale, n_total=len(req))
                if not len(x):
                    continue
                drawn.append(x)
                missing = len(req) - len(x)
                extra = f", {missing} without" if missing else ""
                p50, p99 = np.percentile(x, 50), np.percentile(x, 99)
                ax.step(np.concatenate([[x[0]], x]), np.concatenate([[0.0], y]), where="post",
                        color=colors[label], lw=1.6, label=f"{label}: p50 {fmt(p50)}, p99 {fmt(p99)} {unit}{extra}")
            if _use_log(drawn):
                ax.set_xscale("log")
            if bound is not None:
                b = bound * scale
                hi = max((float(x.max()) for x in drawn), default=b)
                if b <= 3 * hi:
                    ax.axvline(b, color="#444444", ls="--", lw=1.1, label=f"SLO {fmt(b)} {unit}")
                else:
                    ax.text(0.99, 0.02, f"SLO {fmt(b)} {unit} →\n(beyond every value)", transform=ax.transAxes,
                            ha="right", va="bottom", fontsize=9, color="#444444")
            ax.set(xlabel=xlabel, title=title, ylim=(0, 1.02))
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncols=2 if len(result.labels) > 3 else 1,
                      fontsize=9)
        axes[0].set_ylabel("fraction of requests (rejected excluded)")
        fig.suptitle(title_of(result, "Latency distributions"))
    return fig
