"""Every applicable figure of a result as PNG files with stable names.

The timeline is written only for small runs (at most ``max_requests`` requests per policy: past
that its rows are unreadable), and the paged-vs-contiguous figure only when both kinds of policy
ran, and the capacity figure only when the summaries hold the saturated measurements ``cbsim run``
makes for a static-vs-continuous scenario, and the KV-tiers figure only when a policy offloaded KV. Each figure is cleared once saved, so sweeps that write thousands of folders hold no figures.
"""

from __future__ import annotations

from pathlib import Path

from sim.plots.capacity import plot_capacity
from sim.plots.kv import plot_kv
from sim.plots.kv_tiers import plot_kv_tiers
from sim.plots.latency import plot_latency_cdfs
from sim.plots.paged import plot_paged_vs_contiguous
from sim.plots.style import DPI, SIZE_IN, save_png
from sim.plots.timeline import MAX_REQUESTS, plot_timeline, timeline_size_px
from sim.plots.utilization import plot_utilization

FILES = {
    "utilization": "utilization.png",
    "kv": "kv.png",
    "latency_cdf": "latency_cdf.png",
    "timeline": "timeline.png",
    "paged_vs_contiguous": "paged_vs_contiguous.png",
    "capacity": "capacity.png",
    "kv_tiers": "kv_tiers.png",
}


def png_size(figure: str, result) -> tuple[int, int]:
    """(width, height) in pixels of the PNG :func:`write_all` writes for ``figure``."""
    if figure == "timeline":
        return timeline_size_px(len(result.labels))
    return round(SIZE_IN[0] * DPI), round(SIZE_IN[1] * DPI)


def skipped(result, max_requests: int = MAX_REQUESTS) -> list[str]:
    """One line per figure :func:`write_all` leaves out for a reason the user can change."""
    per_policy = result.requests.groupby("policy").size()
    most = int(per_policy.max()) if len(per_policy) else 0
    if most > max_requests:
        return [f"timeline.png not written: the run has {most} requests per policy, over --max-requests "
                f"{max_requests} (its rows would be unreadable); raise --max-requests to {most} to draw it"]
    return []


def write_all(result, folder, max_requests: int = MAX_REQUESTS) -> list[Path]:
    """Write every applicable figure into ``folder``; returns the paths written."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    figures = [("utilization", plot_utilization), ("kv", plot_kv), ("latency_cdf", plot_latency_cdfs)]
    per_policy = result.requests.groupby("policy").size()
    if len(per_policy) and int(per_policy.max()) <= max_requests:
        figures.append(("timeline", lambda r: plot_timeline(r, max_requests=max_requests)))
    figures.append(("paged_vs_contiguous", plot_paged_vs_contiguous))
    figures.append(("capacity", plot_capacity))
    figures.append(("kv_tiers", plot_kv_tiers))  # only when a policy ran with KV tiers
    for key, draw in figures:
        fig = draw(result)
        if fig is None:
            continue
        written.append(save_png(fig, out / FILES[key]))
    return written
