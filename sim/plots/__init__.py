"""Pictures of a run: every figure is a function of a :class:`sim.results.RunResult`.

``result.plot_utilization()`` and friends (forwarded by ``RunResult.__getattr__``) return a
matplotlib Figure for notebooks; :func:`write_all` writes every applicable figure as a PNG of
fixed size, which is what ``cbsim run`` and ``cbsim plot`` do. One module per figure family;
:mod:`sim.plots.style` holds the shared look.
"""

from __future__ import annotations

from sim.plots.capacity import plot_capacity
from sim.plots.kv import plot_kv
from sim.plots.latency import plot_latency_cdfs
from sim.plots.paged import plot_paged_vs_contiguous
from sim.plots.timeline import plot_timeline, timeline_data
from sim.plots.utilization import plot_utilization
from sim.plots.write import FILES, png_size, skipped, write_all

__all__ = [
    "FILES",
    "plot_capacity",
    "plot_kv",
    "plot_latency_cdfs",
    "plot_paged_vs_contiguous",
    "plot_timeline",
    "plot_utilization",
    "png_size",
    "skipped",
    "timeline_data",
    "write_all",
]
