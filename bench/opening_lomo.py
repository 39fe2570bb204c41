"""Leave-one-model-out check of the ``opening`` phase's one global parameter: requests per client.

What it answers: ``bench/silicon_accuracy.py --phase opening`` prices a corpus row as the benchmark
tools measure when they count every request: the opening wave (all N clients started together) is one
round of R, the other R - 1 rounds sit at the clients' diffused steady state (``random``). R, the
requests each client sent, is not in the corpus; the tools' written convention is 10 (NVIDIA's Dynamo
``perf.sh``: ``--request-count 10N``; InferenceMAX: ``--num-prompts`` 10 x concurrency). This script
takes R as one global term and checks it model by model: for each held-out model, R is chosen on the
other models' rows (the least median |TTFT error| over their rows), then the held-out model's median
|TTFT| and |TPOT| error are printed at that R, beside R = 10 and beside the ``random`` steady state.

It reads the reports ``silicon_accuracy.py --phase opening --json`` writes (each row carries its
opening-wave round and its steady state, so any R is priced without another simulation):

    .venv/bin/python bench/opening_lomo.py h200_70b.json h100_qwen.json ... [--grid 2,4,6,8,10,12,16,20]

Groups are (GPU, engine, model); a model held out is held out on every GPU and engine it has rows on.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from silicon_accuracy import opening_means, quantile  # noqa: E402

GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 30)


def rows_of(paths: list[Path]) -> list[dict]:
    """The priced rows of the reports that carry the ``opening`` pieces."""
    out = []
    for p in paths:
        for r in json.loads(p.read_text())["rows"]:
            ex = r.get("extra") or {}
            if not r.get("error") and "first_round" in ex and "random_steady" in ex:
                out.append(r)
    return out


def errors(r: dict, rounds: int) -> tuple[float, float]:
    """Signed TTFT and TPOT error of one row under ``opening`` with ``rounds`` requests per client."""
    ex = r["extra"]
    first = (ex["first_round"]["ttft_ms"], ex["first_round"]["tpot_ms"])
    steady = (ex["random_steady"]["ttft_ms"], ex["random_steady"]["tpot_ms"])
    ttft, tpot = opening_means(first, steady, rounds)
    return ttft / r["ttft_ms"] - 1, tpot / r["tpot_ms"] - 1


def model_of(r: dict) -> str:
    return r["group"].split(" ", 2)[2]


def median_abs(rs: list[dict], rounds: int, metric: int) -> float:
    return quantile([abs(errors(r, rounds)[metric]) for r in rs], 0.5)


def choose(rs: list[dict], grid) -> int:
    """The R of ``grid`` with the least median |TTFT error| over ``rs`` (the smaller on a tie)."""
    return min(grid, key=lambda k: (median_abs(rs, k, 0), k))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", type=Path, nargs="+", help="silicon_accuracy.py --phase opening --json reports")
    ap.add_argument("--grid", default=",".join(map(str, GRID)), help="the R values tried (comma-separated)")
    args = ap.parse_args(argv)
    grid = tuple(int(x) for x in args.grid.split(","))
    rows = rows_of(args.reports)
    if not rows:
        raise SystemExit("no row with the opening pieces: run silicon_accuracy.py --phase opening --json")
    by_model: dict[str, list[dict]] = defaultdict(list)
    by_group: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_model[model_of(r)].append(r)
        by_group[r["group"]].append(r)

    def steady_abs(rs, metric):
        key = ("ttft_ms", "tpot_ms")[metric]
        return quantile([abs(r["extra"]["random_steady"][key] / r[key] - 1) for r in rs], 0.5)

    print(f"{'held-out model':40s} {'rows':>4s}  {'R chosen on the others':>22s}  "
          f"{'TTFT |err| med: random':>22s} {'R=10':>6s} {'chosen':>6s}  {'TPOT: random':>12s} {'R=10':>6s} "
          f"{'chosen':>6s}")
    for m, rs in sorted(by_model.items()):
        others = [r for r in rows if model_of(r) != m]
        k = choose(others, grid) if others else 10
        print(f"{m:40s} {len(rs):4d}  {k:22d}  {steady_abs(rs, 0):22.1%} {median_abs(rs, 10, 0):6.1%} "
              f"{median_abs(rs, k, 0):6.1%}  {steady_abs(rs, 1):12.1%} {median_abs(rs, 10, 1):6.1%} "
              f"{median_abs(rs, k, 1):6.1%}")
    k_all = choose(rows, grid)
    print(f"\nchosen on all {len(rows)} rows: R = {k_all}")
    print(f"\n{'group (GPU engine model)':58s} {'rows':>4s}  " + " ".join(f"{'R=' + str(k):>7s}" for k in grid)
          + "   (median |TTFT err|; random steady state last)")
    for g, rs in sorted(by_group.items()):
        print(f"{g:58s} {len(rs):4d}  " + " ".join(f"{median_abs(rs, k, 0):7.1%}" for k in grid)
              + f"   {steady_abs(rs, 0):7.1%}")
    # the alternative the SGLang rows ask about: the later rounds as cbsim's own loop leaves them after
    # the opening wave (``warm``: clusters and waves kept), not diffused
    kept = {g: [r for r in rs if "warm_steady" in r["extra"]] for g, rs in sorted(by_group.items())}
    if any(kept.values()):
        print("\nR = 10 with the later rounds as cbsim's loop keeps them (warm) instead of diffused: "
              "median |TTFT err| / |TPOT err|")
        for g, rs in kept.items():
            if rs:
                e = [opening_means((r["extra"]["first_round"]["ttft_ms"], r["extra"]["first_round"]["tpot_ms"]),
                                   (r["extra"]["warm_steady"]["ttft_ms"], r["extra"]["warm_steady"]["tpot_ms"]), 10)
                     for r in rs]
                t = quantile([abs(x[0] / r["ttft_ms"] - 1) for x, r in zip(e, rs)], 0.5)
                o = quantile([abs(x[1] / r["tpot_ms"] - 1) for x, r in zip(e, rs)], 0.5)
                print(f"{g:58s} {len(rs):4d}  {t:7.1%} / {o:5.1%}   (diffused: {median_abs(rs, 10, 0):7.1%} / "
                      f"{median_abs(rs, 10, 1):5.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
