"""Where speculative decoding stops paying on a sweep: the arrival rate at which a speculative
entry's TPOT p50 meets its non-speculative baseline's.

Why: speculation trades compute for latency. At low load a decode step is memory-bound and
verifying ``k`` drafts costs little more than one token, so TPOT falls by about the mean
acceptance length; as load grows, the verification tokens take token budget, KV and compute from
other requests, steps get slower and the gain shrinks until it becomes a loss. A planner wants
the load where that happens. :func:`speculation_crossings` finds it on a swept table
(``cbsim sweep --rates``): for each speculative entry and the first entry of the same policy
without a ``speculative`` section, the steady-state TPOT p50 difference at each swept rate, and
the rate where it changes sign, linearly interpolated between the two rates around the sign change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from sim.planning.sweep import steady_column


@dataclass(frozen=True)
class Crossing:
    label: str  # the speculative entry
    baseline: str  # the entry it is compared with
    group: str  # the varied value of a grid sweep ("" without --vary)
    rates: tuple[float, ...]  # swept rates with both figures
    ratio: tuple[float, ...]  # TPOT p50 speculative / baseline, per rate
    crossing_rps: float | None  # where the ratio reaches 1 (interpolated); None: not in the swept range
    pays_at_lowest: bool  # speculation lowers TPOT p50 at the lowest swept rate

    def sentence(self) -> str:
        where = f" ({self.group})" if self.group else ""
        lo, hi = self.rates[0], self.rates[-1]
        gain = f"TPOT p50 x{self.ratio[0]:.2f} at {lo:g} req/s"
        if not self.pays_at_lowest:
            return (
                f"{self.label} vs {self.baseline}{where}: {gain}: speculation does not pay even at the "
                f"lowest swept rate"
            )
        if self.crossing_rps is None:
            return (
                f"{self.label} vs {self.baseline}{where}: {gain}, x{self.ratio[-1]:.2f} at {hi:g} req/s: "
                f"still pays at the highest swept rate (sweep higher to find where it stops)"
            )
        return (
            f"{self.label} vs {self.baseline}{where}: {gain}; stops paying at about "
            f"{self.crossing_rps:.3g} req/s (TPOT p50 crossing)"
        )


def speculation_pairs(scn) -> list[tuple[str, str]]:
    """``(speculative label, baseline label)`` for every speculative entry that has a baseline: the
    first entry of the same policy name without speculation."""
    pairs = []
    for e in scn.policies:
        if e.speculative is None:
            continue
        base = next((b for b in scn.policies if b.name == e.name and b.speculative is None), None)
        if base is not None:
            pairs.append((e.label, base.label))
    return pairs


def speculation_crossings(table: pd.DataFrame, scn) -> list[Crossing]:
    """The crossing of every speculative entry with its baseline, per varied value."""
    if "rate" not in table or table["rate"].isna().all():
        return []
    tpot = steady_column(table, "tpot_s.p50")
    extra = [
        c for c in table.columns[: list(table.columns).index("policy")] if c not in ("point", "rate", "key")
    ]
    groups = table[extra[0]].astype(str) if extra else pd.Series("", index=table.index)
    out = []
    for label, base in speculation_pairs(scn):
        for group in dict.fromkeys(groups):
            rows = {}
            for lbl in (label, base):
                sel = table[(table["policy"] == lbl) & (groups == group)]
                rows[lbl] = {float(r): float(tpot[i]) for i, r in sel["rate"].items()}
            rates = sorted(
                r
                for r in rows[label]
                if r in rows[base]
                and _finite(rows[label][r])
                and _finite(rows[base][r])
                and rows[base][r] > 0
            )
            if not rates:
                continue
            diff = [rows[label][r] - rows[base][r] for r in rates]
            ratio = tuple(rows[label][r] / rows[base][r] for r in rates)
            crossing = None
            for j in range(1, len(rates)):
                if diff[j - 1] < 0 <= diff[j]:
                    r0, r1, d0, d1 = rates[j - 1], rates[j], diff[j - 1], diff[j]
                    crossing = r0 + (r1 - r0) * (-d0) / (d1 - d0)
                    break
            out.append(Crossing(label, base, group, tuple(rates), ratio, crossing, diff[0] < 0))
    return out


def _finite(x: float) -> bool:
    return x is not None and not math.isnan(x)
