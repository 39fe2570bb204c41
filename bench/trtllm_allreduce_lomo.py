"""Which all-reduce kernel did the corpus' TensorRT-LLM 1.0 runs use? Leave-one-model-out, as issue 26
requires of any choice made on the corpus (``silicon_sample.csv``; bench/silicon_accuracy.py replays it).

Why: with the database's custom all-reduce (AIConfigurator's pricing) the TensorRT-LLM 1.0.0rc3 rows
are predicted too fast by an amount that grows with the TP degree (Qwen3-32B fp8 H100: median
signed TPOT error -5 % at TP 1 to -17 % at TP 8, at every concurrency), while the GEMMs the TP degree
shrinks are the same at TP 1, where nothing is all-reduced. TensorRT-LLM's ``AllreduceOp`` falls back
to NCCL when its topology check finds no peer access or no NVLink, or the message exceeds the custom
kernel's workspace (cpp/tensorrt_llm/thop/allreduceOp.cpp, ``ifFallbackToNCCL``), and NCCL's small
all-reduces on 8 H100s take ~19 us against the custom kernel's ~5 us (the database's own rows):
2 x 64 of them per Qwen3-32B step. The corpus does not say which ran; the choice is one of two
measured kernels, no constant is fitted.

What it does: every TensorRT-LLM 1.0 row at TP 2, 4 and 8 of the two models the collection measured
(H100: Qwen3-32B fp8, Llama-3.1-8B) is simulated as bench/silicon_accuracy.py's default phase does,
once with each kernel (``--allreduce custom`` / ``nccl``). For each model held out, the kernel with
the smaller median |TPOT error| on the *other* model's rows is chosen and scored on the held-out
rows. NCCL is worth using for these rows only if every held-out score is no worse than the custom
kernel's.

    .venv/bin/python bench/trtllm_allreduce_lomo.py [--workers 2] [--only _tp8_]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import silicon_accuracy as sa  # noqa: E402

KINDS = ("custom", "nccl")
MODELS = ("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct")


def rows_for(kind: str, only: list[str]) -> list[sa.Row]:
    rows = [
        r
        for r in sa.select(sa.read_rows(), ["trtllm", "h100_sxm", *only])
        if r.model in MODELS and r.version.startswith("1.0.") and r.tp > 1
    ]
    sa.classify(rows, kind)
    return [r for r in rows if not r.skip]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--only", action="append", default=[], help="keep rows whose id contains this (e.g. _tp8_)"
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    digest = sa.code_hash()
    err: dict[tuple[str, str, int], list[float]] = defaultdict(list)  # (kind, model, tp) -> TPOT errors
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for kind in KINDS:
            rows = rows_for(kind, args.only)
            tables = {
                k: f
                for k, f, e in pool.map(
                    sa.build_one, [(k, digest) for k in sorted({r.table_key for r in rows})]
                )
                if not e
            }
            rows = [r for r in rows if r.table_key in tables]
            work = [(r, tables[r.table_key], sa.ROUNDS, sa.SEND_GAP_MS * 1e-3, [sa.PHASE]) for r in rows]
            for r, res in zip(rows, pool.map(sa.simulate, work, chunksize=1)):
                if not res.error:
                    err[(kind, r.model, r.tp)].append(res.tpot_err)

    def med_abs(xs: list[float]) -> float:
        return sa.quantile([abs(x) for x in xs], 0.5)

    print(f"TensorRT-LLM 1.0.0rc3 rows on H100, phase {sa.PHASE!r}: median |TPOT error| (median signed)")
    print(f"{'model':36s} {'TP':>3s} {'rows':>5s}  " + "  ".join(f"{k:>17s}" for k in KINDS))
    for model in MODELS:
        for tp in sorted({k[2] for k in err if k[1] == model}):
            cells = [
                f"{med_abs(err[(k, model, tp)]):7.1%} ({sa.quantile(err[(k, model, tp)], 0.5):+6.1%})"
                for k in KINDS
            ]
            print(
                f"{model:36s} {tp:3d} {len(err[(KINDS[0], model, tp)]):5d}  "
                + "  ".join(f"{c:>17s}" for c in cells)
            )

    def pooled(kind: str, model: str) -> list[float]:
        return [e for (k, m, _tp), xs in err.items() if k == kind and m == model for e in xs]

    print("\nleave one model out: the kernel chosen on the other model's rows, scored on the held-out rows")
    verdict = True
    for held in MODELS:
        others = [m for m in MODELS if m != held]
        chosen = min(KINDS, key=lambda k: med_abs([e for m in others for e in pooled(k, m)]))
        score = {k: med_abs(pooled(k, held)) for k in KINDS}
        verdict &= score[chosen] <= score["custom"]
        print(
            f"  held out {held:34s} chosen {chosen:6s}  held-out median |TPOT error| {score[chosen]:.1%} "
            f"(custom {score['custom']:.1%}, nccl {score['nccl']:.1%})"
        )
    print(
        f"\nNCCL for these rows: {'every held-out score no worse than the custom kernel' if verdict else 'REJECTED'}"
        f"  ({time.perf_counter() - t0:.0f} s wall on {args.workers} workers)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
