"""How much per-step CPU time do the corpus' rows of one engine show, how does it add to the GPU's
time, and does one global figure carry from one model to another? Leave-one-model-out, as issue 26
requires of any term fitted on the corpus (``silicon_sample.csv``; bench/silicon_accuracy.py replays it).

Why a CPU term: a serving engine spends CPU time on every step that no kernel measurement sees
(scheduling, input preparation, launching, output processing; ``sim/latency/engine_cpu.py``). How it
adds to the GPU's time is the engine's scheduling:

- ``async``: the CPU work of step n+1 overlaps the GPU work of step n, so a step takes
  ``max(gpu, cpu)`` and the CPU shows only where it is the longer (small models, large batches, high
  TP). SGLang's overlap scheduler (on by default since v0.4: lmsys.org/blog/2024-12-04-sglang-v0-4,
  "zero-overhead batch scheduler"); vLLM V1's ``--async-scheduling`` (vllm-project/vllm #19970,
  default-on only since vLLM's async scheduling plan, #27679, closed with #27614).
- ``sync``: the CPU work and the GPU work of a step run one after the other, ``gpu + cpu``: vLLM V1
  without async scheduling (``EngineCore.step``: ``schedule()``, ``execute_model()``, then
  ``update_from_output()``, each waiting for the one before).

SGLang's CPU work is per request (``process_batch_result_decode`` appends each request's token,
checks its stop conditions and streams it to the detokenizer; the detokenizer and the tokenizer
manager then handle every request's token in their own processes: sgl-project/sglang issue #23393
measures the client-side ITL 4.6x the scheduler's at 1,024 running requests and equal at 128; #29367
names the tokenizer manager the bottleneck at high concurrency). vLLM's has a per-step part (the
scheduler pass, the input batch's host-to-device copy, the launch) and a per-request part.

What it does: every priced row of ``--engine`` is simulated once as bench/silicon_accuracy.py's
default ``random`` phase does, with the table's ``engine_cpu`` component removed (the no-term
baseline), keeping its steps. For a candidate ``(form, fixed_s, per_seq_s)`` each step of ``n``
sequences and GPU time ``d`` is stretched to ``max(d, fixed_s + per_seq_s × n)`` (``async``) or
``d + fixed_s + per_seq_s × n`` (``sync``), and each measured request's TTFT (its send to its first
token) and decode time (its first token to its last) are re-added on the stretched clock (the
closed loop's own feedback, a slower cycle sending a little later, is left out: a chosen figure is
then checked by re-running the bench with it). For each model held out, the figure is chosen on the
other models' rows (the grid point with the least median |TPOT error|) and scored on the held-out
model's rows; a figure chosen on all rows is worth using only if every held-out score is no worse
than with no term. ``--fixed-ms`` restricts the per-step fixed part (``--fixed-ms 0``: per sequence
only, the form ``sim/latency/engine_cpu.py`` uses for SGLang, and why: docs/accuracy-corpus.md);
``--form`` the forms tried (default: ``async`` for SGLang, both for vLLM); ``--max-concurrency``
keeps the rows of at most that many clients, where the GPU step is short and the CPU shows most.
Beside each held-out score the bench prints the score of cbsim's current default for the engine
(``sim.latency.engine_cpu.DEFAULTS``, combined as the scenario's default ``engine.async_scheduling``
does) and of the same figure synchronous.

    .venv/bin/python bench/engine_cpu_lomo.py --engine vllm [--workers 2] [--cache runs.pkl]
"""

from __future__ import annotations

import argparse
import json
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

ENGINES = ("sglang", "vllm")
FORMS = ("async", "sync")
DEFAULT_FORMS = {"sglang": ("async",), "vllm": FORMS}
FIXED_S = (0.0, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 6e-3, 8e-3, 12e-3, 16e-3)
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
    """One row at the default phase, with no CPU term: the measured requests' send, first-token and
    finish times, and the steps (None where cbsim refuses the row)."""
    from sim.errors import CbsimError

    row, table = args
    meta = json.loads((Path(table) / "metadata.json").read_text(encoding="utf-8"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res, after_s = sa.random_phase_run(row, without_cpu(table), sa.ROUNDS, sa.SEND_GAP_MS * 1e-3)
    except CbsimError:  # refused as bench/silicon_accuracy.py refuses it (a model that does not fit): left out
        return None
    req = res.requests
    req = req[req["arrival_s"] >= after_s]
    steps = res.steps
    return {
        "id": row.id,
        "engine_version": meta["provenance"]["engine_version"],
        "model": row.model,
        "group": row.group,
        "concurrency": row.concurrency,
        "osl": row.osl,
        "ttft_ms": row.ttft_ms,
        "tpot_ms": row.tpot_ms,
        "sent": req["arrival_s"].to_numpy(),
        "first": (req["arrival_s"] + req["ttft_s"]).to_numpy(),
        "finish": req["finish_s"].to_numpy(),
        "end": (steps["start_s"] + steps["duration_s"]).to_numpy(),
        "d": steps["duration_s"].to_numpy(),
        "n": steps["num_seqs"].to_numpy(),
    }


def errors(run: dict, form: str, fixed_s: float, per_seq_s: float) -> tuple[float, float]:
    """The row's (mean-TTFT, mean-TPOT) errors with every step stretched by the candidate term."""
    cpu = fixed_s + per_seq_s * run["n"]
    extra = np.maximum(cpu - run["d"], 0.0) if form == "async" else cpu * (run["n"] > 0)
    order = np.argsort(run["end"], kind="stable")
    ends, cum = run["end"][order], np.concatenate(([0.0], np.cumsum(extra[order])))

    def added(a, b):  # the stretch of the steps ending in (a, b]
        return cum[np.searchsorted(ends, b, side="right")] - cum[np.searchsorted(ends, a, side="right")]

    ttft = run["first"] - run["sent"] + added(run["sent"], run["first"])
    tpot = (run["finish"] - run["first"] + added(run["first"], run["finish"])) / max(run["osl"] - 1, 1)
    return float(ttft.mean()) * 1e3 / run["ttft_ms"] - 1, float(tpot.mean()) * 1e3 / run["tpot_ms"] - 1


def tpot_err(run: dict, form: str, fixed_s: float, per_seq_s: float) -> float:
    return errors(run, form, fixed_s, per_seq_s)[1]


def median_abs(runs: list[dict], term: tuple, metric: int = 1) -> float:
    return float(np.median([abs(errors(r, *term)[metric]) for r in runs]))


def median_signed(runs: list[dict], term: tuple, metric: int = 1) -> float:
    return float(np.median([errors(r, *term)[metric] for r in runs]))


NONE = ("async", 0.0, 0.0)


def choose(runs: list[dict], forms=("async",), fixed: tuple[float, ...] = FIXED_S) -> tuple[str, float, float]:
    """The grid point with the least median |TPOT error|; ties to the smaller term, async first."""
    grid = [(form, f, p) for form in forms for f in fixed for p in PER_SEQ_S]
    return min(grid, key=lambda t: (median_abs(runs, t), t[2], t[1], forms.index(t[0])))


def default_term(engine: str, version: str) -> tuple[str, float, float]:
    """cbsim's default CPU term for the tables' engine version (what the kernel-db tables carry),
    combined as the scenario's default ``engine.async_scheduling`` combines it."""
    from sim.latency.engine_cpu import engine_cpu_default
    from sim.scenario.schema import Engine

    cpu = engine_cpu_default(engine, version)
    form = "async" if Engine.model_fields["async_scheduling"].default else "sync"
    return form, cpu.fixed_s, cpu.per_seq_s


def describe(term: tuple) -> str:
    form, f, p = term
    return f"{form:5s} {f * 1e3:4.1f} ms + {p * 1e6:4.1f} us/seq"


def simulate_rows(engine: str, only: list[str], workers: int) -> list[dict]:
    rows = sa.select(sa.read_rows(), [engine, *only])
    sa.classify(rows)
    priced = [r for r in rows if not r.skip and r.engine == engine]
    digest = sa.code_hash()
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        tables = {}
        for key, folder, err in pool.map(sa.build_one, [(k, digest) for k in sorted({r.table_key for r in priced})]):
            if not err:
                tables[key] = folder
        priced = [r for r in priced if r.table_key in tables]
        priced = sa.longest_first(priced)
        runs = pool.map(simulate_row, [(r, tables[r.table_key]) for r in priced], chunksize=1)
        return [r for r in runs if r is not None]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=ENGINES, default="sglang", help="the corpus engine whose rows are fitted")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache", type=Path, default=None, help="keep (or reuse) the simulated rows here")
    ap.add_argument("--only", action="append", default=[], help="as bench/silicon_accuracy.py --only")
    ap.add_argument("--fixed-ms", type=float, action="append", default=None,
                    help="the per-step fixed parts to try (repeatable; default: 0 to 16 ms)")
    ap.add_argument("--form", choices=FORMS, action="append", default=None,
                    help="how the CPU time adds to the GPU's: async max(gpu, cpu), sync gpu + cpu (repeatable; "
                         "default: async for sglang, both for vllm)")
    ap.add_argument("--max-concurrency", type=int, default=None,
                    help="fit and score only the rows of at most this many clients")
    args = ap.parse_args(argv)
    fixed = tuple(f * 1e-3 for f in args.fixed_ms) if args.fixed_ms else FIXED_S
    forms = tuple(args.form) if args.form else DEFAULT_FORMS[args.engine]
    t0 = time.perf_counter()
    if args.cache is not None and args.cache.is_file():
        runs = pickle.loads(args.cache.read_bytes())
    else:
        runs = simulate_rows(args.engine, args.only, args.workers)
        if args.cache is not None:
            args.cache.write_bytes(pickle.dumps(runs))
    if args.max_concurrency is not None:
        runs = [r for r in runs if r["concurrency"] <= args.max_concurrency]
    if not runs:
        raise SystemExit(f"no priced {args.engine} rows left (--only, --max-concurrency)")
    by = defaultdict(list)
    for r in runs:
        by[r["model"]].append(r)
    current = default_term(args.engine, runs[0]["engine_version"])
    same_sync = ("sync", *current[1:])
    print(f"{len(runs)} {args.engine} rows, {len(by)} models; forms {', '.join(forms)}; grid: fixed "
          f"{[round(f * 1e3, 1) for f in fixed]} ms x per sequence 0-{PER_SEQ_S[-1] * 1e6:.0f} us; "
          f"cbsim's default: {describe(current)}\n")
    print(f"{'held-out model':42s} {'rows':>4s}  {'chosen on the others':>27s}  {'|TPOT err| med: none':>20s} "
          f"{'chosen':>7s} {'default':>7s} {'dflt-sync':>9s}  {'signed: none':>12s} {'chosen':>7s}  "
          f"{'|TTFT| none':>11s} {'chosen':>7s}")
    ok, held_out = True, 0
    for model, held in sorted(by.items()):
        train = [r for m, rs in by.items() if m != model for r in rs]
        if not train:
            print(f"{model:42s} {len(held):4d}  no other model to choose on")
            continue
        term = choose(train, forms, fixed)
        none, chosen = median_abs(held, NONE), median_abs(held, term)
        ok &= chosen <= none
        held_out += 1
        print(f"{model:42s} {len(held):4d}  {describe(term):>27s}  {none:20.1%} {chosen:7.1%} "
              f"{median_abs(held, current):7.1%} {median_abs(held, same_sync):9.1%}  "
              f"{median_signed(held, NONE):+12.1%} {median_signed(held, term):+7.1%}  "
              f"{median_abs(held, NONE, 0):11.1%} {median_abs(held, term, 0):7.1%}")
    term = choose(runs, forms, fixed)
    verdict = ("no model held out (one model only)" if not held_out else
               f"every held-out model {'no worse' if ok else 'WORSE on at least one'} than without the term")
    print(f"\nchosen on all rows: {describe(term)}; {verdict}")
    for model, rs in sorted(by.items()):
        print(f"  {model:40s} median |TPOT err| {median_abs(rs, NONE):6.1%} -> {median_abs(rs, term):6.1%} "
              f"(default {median_abs(rs, current):6.1%}, default sync {median_abs(rs, same_sync):6.1%})")
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
