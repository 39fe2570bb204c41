"""One look for every cbsim figure: rcParams, figure size, policy and phase colours.

Every plot function builds its figure inside :func:`styled` and with :func:`new_figure`, so all
figures share fonts, grids and size, and a policy keeps its colour in every figure of a result
(colours follow the order of ``result.labels``, i.e. the scenario's policy list).

Figures are plain :class:`matplotlib.figure.Figure` objects, not pyplot figures: nothing is
registered in pyplot's global figure list, so a sweep that draws thousands of figures leaks none,
the CLI never touches a GUI backend, and PNGs are rendered with Agg (matplotlib picks the Agg
canvas for ``savefig(..., format="png")``). In Jupyter, with ``%matplotlib inline``, a returned
Figure is shown as a PNG.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import matplotlib as mpl
from matplotlib.figure import Figure

DPI = 100
SIZE_IN = (12.0, 7.0)  # 1200 x 700 px at DPI: every PNG but the timeline, which grows per policy

STYLE = {
    "font.family": "DejaVu Sans",
    "font.size": 10.5,
    "axes.titlesize": 11.5,
    "axes.titleweight": "bold",
    "axes.labelsize": 10.5,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "legend.fontsize": 9.5,
    "figure.titlesize": 14,
    "figure.titleweight": "bold",
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "lines.linewidth": 1.6,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
}

# Okabe & Ito's colour-blind-safe palette (black moved last), then matplotlib's tab10 as spare.
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000",
    "#8c564b", "#7f7f7f", "#bcbd22", "#17becf",
)

# What a request is doing, in the timeline (and its slots strip).
PHASE_COLORS = {
    "queued": "#d4d4d4",
    "prefill": "#E69F00",
    "decode": "#0072B2",
    "stalled": "#F0E442",
    "preempted": "#D55E00",
}
SLOT_COLORS = {
    "continuing": "#0072B2",
    "joined": "#009E73",
    "idle while requests wait": "#f4a582",
    "idle": "#f2f2f2",
}


def policy_colors(labels) -> dict[str, str]:
    """label -> colour, by position: the same label gets the same colour in every figure."""
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}


@contextlib.contextmanager
def styled():
    with mpl.rc_context(STYLE):
        yield


def new_figure(size_in: tuple[float, float] = SIZE_IN) -> Figure:
    return Figure(figsize=size_in, dpi=DPI, layout="constrained")


def title_of(result, what: str) -> str:
    name = getattr(result.scenario, "name", "") or ""
    return f"{what}: {name}" if name else what


def save_png(fig: Figure, path: Path) -> Path:
    """Write at the figure's own size and DPI (no tight bbox: the pixel size is fixed), then
    drop the figure's artists so nothing lingers if a caller keeps a reference."""
    fig.savefig(path, format="png", dpi=DPI)
    fig.clear()
    return path
