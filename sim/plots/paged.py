"""Paged vs contiguous KV memory: what a max-length reservation costs.

A contiguous (reservation) policy holds prompt + ``max_tokens`` token slots per request from
admission; a paged policy holds blocks as tokens are written, wasting at most the tail of one
block per request. Each panel stacks the tokens actually stored under the token slots held
(``kv_used_tokens`` under ``kv_reserved_tokens``); the shaded band between them is memory held
but unused. The bar chart gives every policy's time-averaged waste (``summary.kv_waste``).
Drawn only when the run has at least one policy of each kind.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from sim.plots.series import step_series
from sim.plots.style import new_figure, policy_colors, styled, title_of

WASTE_COLOR = "#f4a582"  # the colour of waste in every figure (idle slots in the timeline)
PREFERRED = {"contiguous": ("orca", "static"), "paged": ("vllm-v1", "sarathi", "vllm-v0")}


def kv_layout(policy_name: str) -> str | None:
    """'contiguous' for max-length reservation policies, 'paged' for the others, None if the
    policy is not in this build's registry (results saved by another version)."""
    from policies.registry import POLICIES
    from policies.reservation import ReservationPolicy

    cls = POLICIES.get(policy_name)
    if cls is None:
        return None
    return "contiguous" if issubclass(cls, ReservationPolicy) else "paged"


def layouts(result) -> dict[str, str]:
    """label -> 'contiguous' | 'paged' for the labels whose policy is known."""
    out = {}
    for label in result.labels:
        kind = kv_layout(result.meta.get(label, {}).get("policy", label))
        if kind is not None:
            out[label] = kind
    return out


def _pick(result, kinds: dict[str, str], kind: str) -> str | None:
    labels = [lb for lb, k in kinds.items() if k == kind]
    for name in PREFERRED[kind]:
        for lb in labels:
            if result.meta.get(lb, {}).get("policy", lb) == name:
                return lb
    return labels[0] if labels else None


def _tokens(x, _pos) -> str:
    return f"{x / 1000:g}k" if abs(x) >= 1000 else f"{x:g}"


def plot_paged_vs_contiguous(result) -> Figure | None:
    """Reserved vs stored KV tokens over time for one contiguous and one paged policy (waste
    shaded), and every policy's mean waste; ``None`` unless both kinds ran."""
    kinds = layouts(result)
    contiguous, paged = _pick(result, kinds, "contiguous"), _pick(result, kinds, "paged")
    if contiguous is None or paged is None:
        return None
    colors = policy_colors(result.labels)
    with styled():
        fig = new_figure()
        ax_c, ax_p, ax_bar = fig.subplots(1, 3, width_ratios=(2.2, 2.2, 1.4))
        ax_p.sharey(ax_c)
        ax_p.sharex(ax_c)
        for ax, label in ((ax_c, contiguous), (ax_p, paged)):
            steps = result.steps[result.steps["policy"] == label]
            t, reserved = step_series(steps, steps["kv_reserved_tokens"])
            _, used = step_series(steps, steps["kv_used_tokens"])
            ax.fill_between(t, 0, used, color=colors[label], alpha=0.85, lw=0, label="tokens stored")
            ax.fill_between(t, used, reserved, color=WASTE_COLOR, lw=0, label="held but unused (waste)")
            ax.plot(t, reserved, color="#333333", lw=0.9, label="token slots held")
            waste = result.summaries[label].get("kv_waste")
            note = f", {100 * waste:.0f}% wasted" if waste is not None else ""
            ax.set_title(f"{label} ({kinds[label]}{note})")
            ax.set_xlabel("simulated time (s)")
            ax.yaxis.set_major_formatter(FuncFormatter(_tokens))
            ax.set_xlim(left=0)
            ax.set_ylim(bottom=0)
        ax_c.set_ylabel("KV tokens")
        handles = [Patch(color="#8a8a8a", label="tokens stored (policy colour)"),
                   Patch(color=WASTE_COLOR, label="held but unused (waste)"),
                   Line2D([], [], color="#333333", lw=0.9, label="token slots held")]
        fig.legend(handles=handles, loc="outside lower center", ncols=3)
        shown = [lb for lb in result.labels if lb in kinds]
        waste = [100 * (result.summaries[lb].get("kv_waste") or 0.0) for lb in shown]
        y = range(len(shown))
        ax_bar.barh(list(y), waste, color=[colors[lb] for lb in shown], height=0.6)
        ax_bar.set_yticks(list(y), [f"{lb}\n({kinds[lb]})" for lb in shown], fontsize=9)
        ax_bar.invert_yaxis()
        for yi, w in zip(y, waste):
            ax_bar.text(w, yi, f" {w:.0f}%", va="center", fontsize=9)
        ax_bar.set_xlim(0, max(max(waste, default=0) * 1.25, 10))
        ax_bar.set(xlabel="held but unused (%)", title="KV waste, time-averaged")
        ax_bar.grid(axis="y", visible=False)
        fig.suptitle(title_of(result, "Paged vs contiguous KV memory"))
    return fig
