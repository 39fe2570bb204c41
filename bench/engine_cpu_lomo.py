"""How much per-step CPU time do the corpus' SGLang rows show, and does one global figure carry
from one model to another? Leave-one-model-out, as issue 26 requires of any term fitted on the
corpus (``silicon_sample.csv``; bench/silicon_accuracy.py replays it).

Why a CPU term: SGLang's scheduler overlaps its CPU work with the GPU (the overlap scheduler, on by
default since v0.4: lmsys.org/blog/2024-12-04-sglang-v0-4, "zero-overhead batch scheduler"), so a
step takes ``max(gpu, cpu)``, and the CPU shows only where it is the longer of the two: small models,
large batches, high TP. The CPU work is per request (``process_batch_result_decode`` appends each
request's token, checks its stop conditions and streams it to the detokenizer; the detokenizer and
the tokenizer manager then handle every request's token in their own processes: sgl-project/sglang
issue #23393 measures the client-side ITL 4.6x the scheduler's at 1,024 running requests and
equal at 128; #29367 names the tokenizer manager the bottleneck at high concurrency). cbsim's
``sglang`` tables carried no CPU time at all (``sim/latency/engine_cpu.py`` had vLLM's only).

What it does: every priced SGLang row is simulated once as bench/silicon_accuracy.py's default
``random`` phase does (no CPU term), keeping its steps. For a candidate ``fixed_s + per_seq_s × n``
each step of ``n`` sequences is stretched to ``max(d, fixed_s + per_seq_s × n)`` and each measured
request's decode time is re-added on the stretched clock (its first token to its last; the closed
loop's own feedback, a slower cycle sending a little later, is left out: the stretched runs are then
checked by re-running the bench with the chosen figure). For each model held out, the figure is
chosen on the other models' rows (the grid point with the least median |TPOT error|) and scored on
the held-out model's rows; a figure chosen on all rows is worth using only if every held-out score
is no worse than with no term. ``--fixed-ms`` restricts the per-step fixed part (``--fixed-ms 0``:
per sequence only, the form ``sim/latency/engine_cpu.py`` uses for SGLang, and why:
docs/accuracy-corpus.md).

    .venv/bin/python bench/sglang_cpu_lomo.py [--workers 2] [--cache runs.pkl]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
import warnings
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import silicon_accuracy as sa  # noqa: E402

FIXED_S = (0.0, 1e-3, 2e-3, 4e-3, 6e-3, 8e-3, 12e-3, 16e-3)
PER_SEQ_S = tuple(k * 5e-6 for k in range(0, 17))  # 0 to 80 us per sequence


def without_cpu(table: str) -> str:
    """A copy of a kernel-db table without its ``engine_cpu`` component (the runs here are the
    no-term baseline every candidate stretches), next to it in the bench's cache."""
    from sim.latency.table_format import read_table, write_table

    out = Path(table + "-no-engine-cpu")
    if not (out / "metadata.json").is_file():
        t = read_table(table)
        t.components.pop("engine_cpu", None)
        t.metadata.get("grid", {}).pop("engine_cpu", None)
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        write_table(tmp, t)
        tmp.rename(out)
    return str(out)


def simulate_row(args):
    """One row at the default phase, with no CPU term: the measured requests' first-token and finish
    times, and the steps."""
    row, table = args
    import sim

    table = without_cpu(table)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pilot = sim.run(sa.scenario_of(row, table, sa.ROUNDS, sa.SEND_GAP_MS * 1e-3)).requests
        e2e = float(pilot.sort_values("arrival_s").iloc[row.concurrency :]["e2e_s"].mean())
        sc = sa.scenario_of(row, table, sa.ROUNDS + 1, 0.0)
        sc["workload"]["arrival"].update(ramp_s=round(e2e, 9), start="random")
        res = sim.run(sc)
    req = res.requests
    req = req[req["arrival_s"] >= e2e]
    steps = res.steps
    return {
        "id": row.id,
        "model": row.model,
        "group": row.group,
        "osl": row.osl,
        "tpot_ms": row.tpot_ms,
        "first": (req["arrival_s"] + req["ttft_s"]).to_numpy(),
        "finish": req["finish_s"].to_numpy(),
        "sim_tpot_ms": float(req["tpot_s"].mean()) * 1e3,
        "end": (steps["start_s"] + steps["duration_s"]).to_numpy(),
        "d": steps["duration_s"].to_numpy(),
        "n": steps["num_seqs"].to_numpy(),
    }


def tpot_err(run: dict, fixed_s: float, per_seq_s: float) -> float:
    """The row's mean-TPOT error with every step stretched to max(d, fixed + per_seq × n)."""
    extra = np.maximum(fixed_s + per_seq_s * run["n"] - run["d"], 0.0)
    order = np.argsort(run["end"], kind="stable")
    ends, cum = run["end"][order], np.concatenate(([0.0], np.cumsum(extra[order])))
    added = (
        cum[np.searchsorted(ends, run["finish"], side="right")]
        - cum[np.searchsorted(ends, run["first"], side="right")]
    )
    tpot = (run["finish"] - run["first"] + added) / max(run["osl"] - 1, 1)
    return float(tpot.mean()) * 1e3 / run["tpot_ms"] - 1


def median_abs(runs: list[dict], fixed_s: float, per_seq_s: float) -> float:
    return float(np.median([abs(tpot_err(r, fixed_s, per_seq_s)) for r in runs]))


def choose(runs: list[dict], fixed: tuple[float, ...] = FIXED_S) -> tuple[float, float]:
    grid = [(f, p) for f in fixed for p in PER_SEQ_S]
    return min(grid, key=lambda fp: (median_abs(runs, *fp), fp[1], fp[0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache", type=Path, default=None, help="keep (or reuse) the simulated rows here")
    ap.add_argument("--only", action="append", default=[], help="as bench/silicon_accuracy.py --only")
    ap.add_argument(
        "--fixed-ms",
        type=float,
        action="append",
        default=None,
        help="the per-step fixed parts to try (repeatable; default: 0 to 16 ms)",
    )
    args = ap.parse_args(argv)
    fixed = tuple(f * 1e-3 for f in args.fixed_ms) if args.fixed_ms else FIXED_S
    t0 = time.perf_counter()
    if args.cache is not None and args.cache.is_file():
        runs = pickle.loads(args.cache.read_bytes())
    else:
        rows = sa.select(sa.read_rows(), ["sglang", *args.only])
        sa.classify(rows)
        priced = [r for r in rows if not r.skip]
        digest = sa.code_hash()
        with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
            tables = {}
            for key, folder, err in pool.map(
                sa.build_one, [(k, digest) for k in sorted({r.table_key for r in priced})]
            ):
                if not err:
                    tables[key] = folder
            priced = [r for r in priced if r.table_key in tables]
            priced.sort(key=lambda r: -(r.concurrency * (r.osl + 1)))
            runs = list(pool.map(simulate_row, [(r, tables[r.table_key]) for r in priced], chunksize=1))
        if args.cache is not None:
            args.cache.write_bytes(pickle.dumps(runs))
    by = defaultdict(list)
    for r in runs:
        by[r["model"]].append(r)
    print(
        f"{len(runs)} SGLang rows, {len(by)} models; grid: fixed {[f * 1e3 for f in fixed]} ms x per sequence "
        f"0-{PER_SEQ_S[-1] * 1e6:.0f} us\n"
    )
    print(
        f"{'held-out model':42s} {'rows':>4s}  {'chosen on the others':>22s}  {'|TPOT err| med: none':>20s} "
        f"{'chosen':>7s}  {'signed: none':>12s} {'chosen':>7s}"
    )
    ok = True
    for model, held in sorted(by.items()):
        train = [r for m, rs in by.items() if m != model for r in rs]
        if not train:
            print(f"{model:42s} {len(held):4d}  no other model to choose on")
            continue
        f, p = choose(train, fixed)
        none, chosen = median_abs(held, 0.0, 0.0), median_abs(held, f, p)
        s0 = float(np.median([tpot_err(r, 0.0, 0.0) for r in held]))
        s1 = float(np.median([tpot_err(r, f, p) for r in held]))
        ok &= chosen <= none
        print(
            f"{model:42s} {len(held):4d}  {f * 1e3:6.1f} ms + {p * 1e6:5.1f} us/seq  {none:20.1%} {chosen:7.1%}  "
            f"{s0:+12.1%} {s1:+7.1%}"
        )
    f, p = choose(runs, fixed)
    print(
        f"\nchosen on all rows: {f * 1e3:.1f} ms + {p * 1e6:.1f} us per sequence; every held-out model "
        f"{'no worse' if ok else 'WORSE on at least one'} than without the term"
    )
    for model, rs in sorted(by.items()):
        print(
            f"  {model:40s} median |TPOT err| {median_abs(rs, 0.0, 0.0):6.1%} -> {median_abs(rs, f, p):6.1%}"
        )
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
