"""How many requests did the corpus' benchmark count? Fixed rounds, fixed duration or a one-off cost, leave-one-model-out.

What it answers: ``bench/silicon_accuracy.py --phase opening`` prices a corpus row as a benchmark that
counts every request of a run whose clients start together: the opening wave (all N clients' first
requests) is one round of R, the other R - 1 rounds sit at the clients' diffused steady state. What
R is, and whether the run was a fixed count at all, is not in the CSV. Four descriptions of the
collection are tested here, each with one global parameter chosen on the other models' rows
(leave-one-model-out, as ``bench/opening_lomo.py`` does for R alone):

* ``rounds R``: a fixed count of R requests per client (aiperf / genai-perf ``--request-count R*N``;
  AIConfigurator's own eval runs genai-perf at ``--request-count 10N --warmup-request-count 2N``,
  ``src/aiconfigurator/eval/benchmarks/genai_perf_runner.py``, and SGLang's ``bench_serving`` at
  ``--num-prompts 10N``; aiperf waits for every warm-up response before profiling starts, so the
  counted run opens with all N clients together either way);
* ``duration D``: a run of fixed duration D seconds: a client fits ``1 + (D - E2E_1) / E2E`` requests
  (:func:`rounds_in`), so long outputs weigh the opening wave more;
* ``one-off W``: a cost W seconds paid once per counted run by one request (warm-up, autotuning,
  graph capture), on top of ``rounds 10``: ``+ W / (10 N)`` on the mean TTFT;
* ``one-off/duration k``: the same cost averaged over a run of fixed duration (k = W / D), on the
  diffused steady state: ``+ k * E2E / N`` (grows with the output length, falls with the clients:
  the TensorRT-LLM pattern docs/trtllm.md asked about).

It also prints what separates them without any choice: each row's *implied rounds*, the R at which
the ``rounds`` description meets the measured TTFT exactly (:func:`implied_rounds`), by clients and by
output length. A fixed count makes it flat in both; a fixed duration makes it fall as the output
grows; a per-request cost the tables lack (not a phase effect at all) makes it grow with the clients,
because the opening wave's excess grows with N while such a cost does not.

    .venv/bin/python bench/phase_lomo.py REPORT.json ... [--corpus silicon_sample.csv]

The reports are ``silicon_accuracy.py --phase opening --json`` (every row carries its opening round
and its steady state, so every description is priced without another simulation); the rows' prompt
and output lengths and clients come from the corpus CSV.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from silicon_accuracy import OPENING_ROUNDS, opening_means, quantile, read_rows  # noqa: E402


@dataclass(frozen=True)
class Piece:
    """One priced row: the measurement and the two simulated parts every description is made of."""
    id: str
    group: str
    model: str
    layout: str
    clients: int
    osl: int
    real_ttft: float  # ms
    real_tpot: float
    first: tuple[float, float]  # the opening wave's round: mean TTFT, TPOT (ms)
    steady: tuple[float, float]  # the diffused steady state (``random``)

    def e2e_s(self, part: tuple[float, float]) -> float:
        """A request's mean end-to-end seconds in ``part``: TTFT + (output - 1) x TPOT, exactly the
        mean of the simulated requests' E2E (cbsim's TPOT is (E2E - TTFT) / (output - 1))."""
        return (part[0] + max(self.osl - 1, 0) * part[1]) * 1e-3


def rounds_in(duration_s: float, e2e_first_s: float, e2e_steady_s: float) -> float:
    """Requests per client a run of ``duration_s`` holds: the opening round, then one every
    ``e2e_steady_s`` (never fewer than the one: a run shorter than the opening round still ends it)."""
    return 1.0 + max(0.0, (duration_s - e2e_first_s) / e2e_steady_s)


def implied_rounds(real: float, first: float, steady: float) -> float:
    """The R of ``rounds R`` whose mean (first + (R - 1) steady) / R equals ``real``; NaN where no
    R >= 1 does (``real`` above the opening round or at or below the steady state)."""
    if not steady < real <= first:
        return math.nan
    return (first - steady) / (real - steady)


def price_rounds(p: Piece, rounds: float) -> tuple[float, float]:
    return opening_means(p.first, p.steady, rounds)


def price_duration(p: Piece, duration_s: float) -> tuple[float, float]:
    return opening_means(p.first, p.steady, rounds_in(duration_s, p.e2e_s(p.first), p.e2e_s(p.steady)))


def price_oneoff(p: Piece, cost_s: float, rounds: int = OPENING_ROUNDS) -> tuple[float, float]:
    """``rounds`` requests per client, one of the N x rounds paying ``cost_s`` more TTFT."""
    ttft, tpot = opening_means(p.first, p.steady, rounds)
    return ttft + cost_s * 1e3 / (p.clients * rounds), tpot


def price_oneoff_duration(p: Piece, cost_per_duration: float) -> tuple[float, float]:
    """The diffused steady state, one request of a run of fixed duration D paying a cost W:
    ``+ (W / D) x E2E / N`` on the mean TTFT (the run holds N x D / E2E requests)."""
    return p.steady[0] + cost_per_duration * p.e2e_s(p.steady) * 1e3 / p.clients, p.steady[1]


@dataclass(frozen=True)
class Form:
    name: str
    unit: str
    grid: tuple[float, ...]
    price: Callable[[Piece, float], tuple[float, float]]


FORMS = (
    Form("rounds", "requests/client", (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 30), price_rounds),
    Form("duration", "s", (10, 20, 30, 45, 60, 90, 120, 180, 240, 300, 450, 600, 900), price_duration),
    Form("one-off", "s", (0, 1, 2, 5, 10, 20, 30, 50, 100), price_oneoff),
    Form("one-off/duration", "W/D", (0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0), price_oneoff_duration),
)


def errors(p: Piece, form: Form, value: float) -> tuple[float, float]:
    """Signed TTFT and TPOT error of one row under ``form`` at ``value``."""
    ttft, tpot = form.price(p, value)
    return ttft / p.real_ttft - 1, tpot / p.real_tpot - 1


def median_abs(ps: list[Piece], form: Form, value: float, metric: int = 0) -> float:
    return quantile([abs(errors(p, form, value)[metric]) for p in ps], 0.5)


def choose(ps: list[Piece], form: Form) -> float:
    """The grid value with the least median |TTFT error| over ``ps`` (the smaller on a tie)."""
    return min(form.grid, key=lambda v: (median_abs(ps, form, v), v))


def pieces(reports: list[Path], corpus: Path | None = None) -> list[Piece]:
    """The priced rows of the reports that carry the ``opening`` pieces, with their lengths."""
    meta = {r.id: r for r in read_rows(corpus)}
    out = []
    for path in reports:
        for r in json.loads(path.read_text())["rows"]:
            ex = r.get("extra") or {}
            if r.get("error") or "first_round" not in ex or "random_steady" not in ex or r["id"] not in meta:
                continue
            m = meta[r["id"]]
            f, s = ex["first_round"], ex["random_steady"]
            out.append(Piece(r["id"], r["group"], r["group"].split(" ", 2)[2], r.get("layout", ""),
                             m.concurrency, m.osl, r["ttft_ms"], r["tpot_ms"],
                             (f["ttft_ms"], f["tpot_ms"]), (s["ttft_ms"], s["tpot_ms"])))
    return out


CLIENT_BINS = ((1, 6), (7, 12), (13, 24), (25, 48), (49, 96), (97, 10**9))


def _bin(c: int) -> str:
    lo, hi = next(b for b in CLIENT_BINS if b[0] <= c <= b[1])
    return f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}"


def _by_group(ps: list[Piece]) -> list[tuple[str, list[Piece]]]:
    by_group: dict[str, list[Piece]] = defaultdict(list)
    for p in ps:
        by_group[p.group].append(p)
    return sorted(by_group.items())


def print_implied(ps: list[Piece]) -> None:
    print("implied rounds (the R at which `rounds R` meets the measured TTFT; median, rows with one): by clients")
    bins = [_bin(b[0]) for b in CLIENT_BINS]
    print(f"{'group (GPU engine model)':54s} " + " ".join(f"{b:>7s}" for b in bins) + "   by output length")
    for g, rs in _by_group(ps):
        cells = []
        for b in bins:
            v = [implied_rounds(p.real_ttft, p.first[0], p.steady[0]) for p in rs if _bin(p.clients) == b]
            v = [x for x in v if not math.isnan(x)]
            cells.append(f"{quantile(v, 0.5):7.1f}" if v else f"{'-':>7s}")
        outs = []
        for osl in sorted({p.osl for p in rs}):
            v = [implied_rounds(p.real_ttft, p.first[0], p.steady[0]) for p in rs if p.osl == osl]
            v = [x for x in v if not math.isnan(x)]
            if v:
                outs.append(f"{osl}:{quantile(v, 0.5):.1f}")
        print(f"{g:54s} " + " ".join(cells) + "   " + " ".join(outs))


def print_excess(ps: list[Piece]) -> None:
    """The measured TTFT above the diffused steady state, by clients: an opening wave counted over a
    fixed count grows with the clients (its wave does); a per-request cost the simulation lacks does not."""
    print("\nmeasured TTFT - the steady state (`random`), ms (median): by clients")
    bins = [_bin(b[0]) for b in CLIENT_BINS]
    print(f"{'group (GPU engine model)':54s} " + " ".join(f"{b:>7s}" for b in bins))
    for g, rs in _by_group(ps):
        cells = []
        for b in bins:
            v = [p.real_ttft - p.steady[0] for p in rs if _bin(p.clients) == b]
            cells.append(f"{quantile(v, 0.5):7.0f}" if v else f"{'-':>7s}")
        print(f"{g:54s} " + " ".join(cells))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", type=Path, nargs="+", help="silicon_accuracy.py --phase opening --json reports")
    ap.add_argument("--corpus", type=Path, default=None, help="the corpus CSV (default: the installed one)")
    args = ap.parse_args(argv)
    for p in args.reports:
        if not p.is_file():
            raise SystemExit(f"{p}: no such report (silicon_accuracy.py --phase opening --json {p})")
    ps = pieces(args.reports, args.corpus)
    if not ps:
        raise SystemExit("no row with the opening pieces: run silicon_accuracy.py --phase opening --json")
    print_implied(ps)
    print_excess(ps)
    models = sorted({p.model for p in ps})
    print(f"\nleave one model out ({len(ps)} rows, {len(models)} models): each form's parameter chosen on the "
          "other models' rows, median |TTFT err| (|TPOT err|) of the held-out model")
    print(f"{'held-out model':40s} {'rows':>4s}  " + "  ".join(f"{f.name:>26s}" for f in FORMS))
    wins: dict[str, int] = defaultdict(int)
    for m in models:
        held = [p for p in ps if p.model == m]
        others = [p for p in ps if p.model != m]
        cells, scores = [], {}
        for f in FORMS:
            v = choose(others, f) if others else f.grid[0]
            scores[f.name] = median_abs(held, f, v)
            cells.append(f"{v:>7g} {scores[f.name]:7.1%} ({median_abs(held, f, v, 1):5.1%})")
        wins[min(scores, key=scores.get)] += 1
        print(f"{m:40s} {len(held):4d}  " + "  ".join(f"{c:>26s}" for c in cells))
    print("least held-out error: " + ", ".join(f"{k} on {v} of {len(models)}" for k, v in sorted(wins.items())))
    chosen = {f.name: choose(ps, f) for f in FORMS}
    print("\nchosen on all rows: " + ", ".join(f"{f.name} {chosen[f.name]:g} {f.unit}" for f in FORMS))
    print(f"{'group (GPU engine model)':54s} {'rows':>4s}  " + "  ".join(f"{f.name:>16s}" for f in FORMS)
          + "   (median |TTFT err| at the all-rows choice)")
    for g, rs in _by_group(ps):
        print(f"{g:54s} {len(rs):4d}  " + "  ".join(f"{median_abs(rs, f, chosen[f.name]):16.1%}" for f in FORMS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
