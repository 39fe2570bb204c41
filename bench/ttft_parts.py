"""What a lone prompt's simulated TTFT is made of, next to the measured one (issue 26).

What it answers: on the corpus rows where no two prefills meet (a few clients, independent phases),
``bench/silicon_accuracy.py`` finds the simulated TTFT ~30 % below the measured one while TPOT agrees
within ~5 %. This script writes the simulated TTFT of such a row as its parts, in closed form from the
row's kernel-db table, and prints beside them what the measurement implies for the prefill step:

- ``wait``: the step the request waits for. A closed-loop client sends its next request when its
  previous one ends, at the end of a step; the engine has started the next step by then (cbsim's
  loop, and vLLM V1's ``EngineCore.step``, which schedules the requests it holds), so the new request
  waits one whole pure-decode step of the other ``N - 1`` clients' requests; two where the server
  schedules asynchronously and the bench replays its batch queue (``vllm-v1``'s ``async_admission``:
  the step after the one in flight was scheduled without it);
- ``prefill``: the step that holds its prompt beside those ``N - 1`` decodes, by component (GEMMs at
  M = tokens with the TP all-reduces, ``linear``; context attention ``prefill_attn``; the decodes'
  attention; ``per_seq``: the LM head; ``engine_cpu``), and the steps that hold the rest of the prompt
  when it does not fit the token budget beside the decodes (vLLM's chunked prefill: ``budget - (N - 1)``
  tokens in the first);
- ``bound``: the prefill's FLOPs at the GPU's dense FP8 (or BF16) Tensor Core peak;
- ``implied``: the measured TTFT less the measured decode steps waited (the row's TPOT, once or
  twice as above), what the real prefill step(s) took if the wait is as above, and its ratio to the
  simulated prefill.

The other clients' decodes are priced at the mean context of uniform phases (``ISL + OSL / 2``), so
``total`` is the mean of the simulated TTFTs up to the curvature of the decode attention in the
context (tests/test_ttft_parts.py checks it against the simulation).

    .venv/bin/python bench/ttft_parts.py --only h200_sxm_vllm --only llama_3_1_70b --only _c4_
    .venv/bin/python bench/ttft_parts.py --gemm-ratio h100_sxm h200_sxm

``--gemm-ratio SLOW FAST`` prints the database's own FP8 GEMM latencies of two GPUs against each
other instead (:func:`gemm_ratio`): the corpus' H100 and H200 prefills are equally fast, the
database's H200 GEMMs are not; and, by how long a kernel ran (:func:`by_duration`), the ratio and
each GPU's TFLOPS for FP8 and BF16: a collection whose throughput falls as its kernels run longer
ran into its GPU's power limit, one whose throughput does not was timed at a clock a GPU serving
for minutes does not hold.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COMPONENTS = ("linear", "prefill_attn", "decode_attn", "per_seq", "engine_cpu")


@dataclass
class Parts:
    """A lone prompt's simulated TTFT in seconds, and its prefill step's components."""

    wait_s: float  # the pure-decode step of the other clients' requests it waits for
    prefill_s: float  # the step holding the first chunk of its prompt
    rest_s: float  # the steps holding the rest of the prompt (0 when it fits the budget)
    components: dict[str, float]  # the first prefill step by component (their sum is its GPU time)
    bound_s: float  # the whole prompt's FLOPs at the GPU's dense Tensor Core peak
    chunks: list[int]  # prompt tokens per step
    wait_steps: int = 1  # the decode steps in wait_s (two where the server admits a step late)

    @property
    def total_s(self) -> float:
        return self.wait_s + self.prefill_s + self.rest_s


def _plan(news: list[int], contexts: list[int]):
    from policies.base import StepPlan

    # the pricing reads the token counts and contexts, and the number of sequences scheduled
    return StepPlan(scheduled=[None] * len(news), num_new_tokens=list(news), context=list(contexts))


def latency_of(scenario: dict):
    """The table backend and the engine limits the simulation of ``scenario`` runs with."""
    from sim.scenario.resolved import resolve
    from sim.scenario.schema import load_scenario

    scn = load_scenario(scenario)
    dep = resolve(scn)
    limits = dep.limits_for(scn.policies[0].name)
    return dep.latency(), limits, dep


def parts(latency, isl: int, others: int, other_context: float, budget: int, peak_flops: float,
          wait_steps: int = 1) -> Parts:
    """The closed form of the module docstring for one prompt of ``isl`` tokens beside ``others``
    decoding requests of mean context ``other_context``, under a token budget of ``budget``, after
    ``wait_steps`` pure-decode steps of theirs."""
    from sim.latency.base import step_shape

    ctx = int(round(other_context))

    def price(news, contexts):
        plan = _plan(news, contexts)
        return latency.price(step_shape(plan), plan)[0]

    wait = wait_steps * price([1] * others, [ctx] * others) if others else 0.0
    chunks, left = [], isl
    while left > 0:
        n = min(left, budget - others)
        chunks.append(n)
        left -= n
    steps, done = [], 0
    for j, n in enumerate(chunks):
        # the decodes run in every step; their contexts grow by one token a step
        steps.append(price([1] * others + [n], [ctx + 1 + j] * others + [done]))
        done += n
    comps = components(latency, chunks[0], others, ctx + 1)
    # the prompt's own FLOPs on one GPU (a TP shard): linear layers, attention, its LM head once
    flops = latency.step_flops_bytes(step_shape(_plan([isl], [0])))[0]
    return Parts(wait, steps[0], sum(steps[1:]), comps, flops / peak_flops, chunks, wait_steps)


def components(latency, n: int, others: int, ctx: int) -> dict[str, float]:
    """The first prefill step's GPU time by table component (TableLatency.price's terms)."""
    out = {"linear": latency._lin(n + others), "prefill_attn": latency._pre(n, 0)}
    out["decode_attn"] = latency._mix(others, ctx) if others else 0.0
    out["per_seq"] = latency._seq(others + 1) if latency._seq is not None else 0.0
    out["engine_cpu"] = latency._cpu(others + 1) if latency._cpu is not None else 0.0
    out["fixed"] = latency._fixed
    return out


def row_parts(row, table: str) -> Parts:
    """:func:`parts` for one corpus row (bench/silicon_accuracy.py's scenario of it)."""
    from bench.silicon_accuracy import scenario_of

    scenario = scenario_of(row, table, 1)
    latency, limits, dep = latency_of(scenario)
    peak = dep.gpu.fp8_flops if row.precision == "fp8" and dep.gpu.fp8_flops else dep.gpu.peak_flops
    late = scenario["policies"][0].get("async_admission", False)  # the batch queue: one step more
    return parts(
        latency, row.isl, row.concurrency - 1, row.isl + row.osl / 2, limits.max_num_batched_tokens, peak,
        wait_steps=2 if late else 1,
    )


# the FP8 GEMMs of a Llama-3.1-70B layer at TP 1 (N, K): QKV, attention output, gate+up, down
LLAMA70B_GEMMS = ((10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672))


# kernel-time bins (ms, on the slow GPU) of :func:`by_duration`
DURATION_BINS_MS = (0.05, 0.2, 1.0, 5.0, 20.0, float("inf"))


def by_duration(j, bins_ms=DURATION_BINS_MS) -> list[dict]:
    """Per bin of the slow GPU's kernel time (``latency_a``, ms) above the first edge: rows, the median
    latency ratio a / b, and each GPU's median TFLOPS (2 M N K / latency)."""
    out = []
    flops = 2.0 * j["m"] * j["n"] * j["k"]
    for lo, hi in zip(bins_ms, bins_ms[1:]):
        s = (j["latency_a"] > lo) & (j["latency_a"] <= hi)
        if not s.any():
            continue
        out.append({"lo_ms": lo, "hi_ms": hi, "rows": int(s.sum()),
                    "ratio": float((j["latency_a"][s] / j["latency_b"][s]).median()),
                    "tflops_a": float((flops[s] / j["latency_a"][s] * 1e-9).median()),
                    "tflops_b": float((flops[s] / j["latency_b"][s] * 1e-9).median())})
    return out


def gemm_ratio(slow: str, fast: str, engine: str = "vllm") -> dict:
    """The database's per-tensor FP8 GEMM latencies of GPU ``slow`` over GPU ``fast`` (AIConfigurator
    system names, e.g. h100_sxm and h200_sxm), on the shapes both measured: per Llama-3.1-70B shape
    at M = 1,024-8,192 and over every shape at M >= 1,024 (median, p10, p90). Why: prefill is
    compute-bound, and the H100 and H200 SXM have the same GH100 compute, yet the corpus' H200
    prefills are no faster than its H100 ones (docs/accuracy-corpus.md)."""
    from importlib.resources import files

    import pandas as pd

    data = files("aiconfigurator_core") / "systems" / "data"

    def frame(system: str, dtype: str = "fp8"):
        folder = Path(str(data / system / "gemm" / engine))
        versions = sorted(p for p in folder.iterdir() if (p / "gemm_perf.parquet").is_file())
        d = pd.read_parquet(versions[-1] / "gemm_perf.parquet")
        return d[d["gemm_dtype"] == dtype], versions[-1].name

    def joined(dtype: str):
        return frame(slow, dtype)[0].merge(frame(fast, dtype)[0], on=["m", "n", "k"], suffixes=("_a", "_b"))

    va, vb = frame(slow)[1], frame(fast)[1]
    j = joined("fp8")
    j = j.assign(ratio=j["latency_a"] / j["latency_b"])
    shapes = {}
    for n, k in LLAMA70B_GEMMS:
        s = j[(j.n == n) & (j.k == k) & j.m.isin([1024, 2048, 4096, 8192])].sort_values("m")
        if len(s):
            shapes[f"N {n} K {k}"] = {int(m): round(float(r), 3) for m, r in zip(s.m, s.ratio)}
    big = j[j.m >= 1024]["ratio"]
    return {
        "versions": (va, vb),
        "shapes": shapes,
        "rows": int(len(big)),
        "median": float(big.median()),
        "p10": float(big.quantile(0.1)),
        "p90": float(big.quantile(0.9)),
        "by_duration": {dtype: by_duration(jj[jj.m >= 1024]) for dtype, jj in (("fp8", j), ("bf16", joined("bfloat16")))},
    }


def main(argv=None) -> int:
    import bench.silicon_accuracy as sa

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", action="append", default=[], help="keep rows whose id/GPU/engine/model contain this"
    )
    ap.add_argument(
        "--gemm-ratio",
        nargs=2,
        metavar=("SLOW", "FAST"),
        default=None,
        help="print the database's FP8 GEMM latency ratio of two systems (h100_sxm h200_sxm) and stop",
    )
    args = ap.parse_args(argv)
    if args.gemm_ratio:
        r = gemm_ratio(*args.gemm_ratio)
        slow, fast = args.gemm_ratio
        print(f"FP8 GEMM latency {slow} / {fast} (vllm {r['versions'][0]} / {r['versions'][1]})")
        for shape, by_m in r["shapes"].items():
            print(f"  Llama-3.1-70B {shape:16s} " + "  ".join(f"M {m}: {v:.3f}" for m, v in by_m.items()))
        print(
            f"  every shape at M >= 1024 ({r['rows']} rows): median {r['median']:.3f}, p10 {r['p10']:.3f}, "
            f"p90 {r['p90']:.3f}"
        )
        print(f"  by kernel time on {slow}, M >= 1024: rows, median ratio, median TFLOPS {slow} / {fast}")
        for dtype, bins in r["by_duration"].items():
            for b in bins:
                span = f"{b['lo_ms']:g}-{b['hi_ms']:g} ms" if b["hi_ms"] != float("inf") else f"> {b['lo_ms']:g} ms"
                print(f"    {dtype:4s} {span:12s} {b['rows']:5d}  {b['ratio']:.3f}  {b['tflops_a']:6.0f} / "
                      f"{b['tflops_b']:.0f}")
        return 0
    rows = sa.select(sa.read_rows(), args.only)
    sa.classify(rows)
    priced = sorted((r for r in rows if not r.skip), key=lambda r: (r.system, r.isl, r.tp, r.concurrency))
    digest = sa.code_hash()
    tables = {}
    for key in sorted({r.table_key for r in priced}):
        _, folder, err = sa.build_one((key, digest))
        tables[key] = folder
    print(
        f"{'row':44s} {'wait':>6s} {'prefill':>8s} {'rest':>6s} {'= sim':>7s}   {'linear':>7s} {'ctxattn':>7s} "
        f"{'dec':>5s} {'lmhead':>6s} {'cpu':>5s}   {'bound':>6s} {'MFU':>4s}   {'real':>7s} {'implied':>7s} {'x sim':>6s}"
    )
    for r in priced:
        if not tables.get(r.table_key):
            continue
        p = row_parts(r, tables[r.table_key])
        c = p.components
        implied = r.ttft_ms - p.wait_steps * r.tpot_ms  # measured TTFT less the decode steps it waits
        sim_pre = (p.prefill_s + p.rest_s) * 1e3
        name = f"{r.system} {r.model.split('/')[-1][:18]} {r.isl}x{r.osl} c{r.concurrency} tp{r.tp}"[:44]
        print(
            f"{name:44s} {p.wait_s * 1e3:6.1f} {p.prefill_s * 1e3:8.1f} {p.rest_s * 1e3:6.1f} {p.total_s * 1e3:7.1f}   "
            f"{c['linear'] * 1e3:7.1f} {c['prefill_attn'] * 1e3:7.2f} {c['decode_attn'] * 1e3:5.2f} "
            f"{c['per_seq'] * 1e3:6.2f} {c['engine_cpu'] * 1e3:5.2f}   {p.bound_s * 1e3:6.1f} "
            f"{p.bound_s * 1e3 / sim_pre:4.0%}   {r.ttft_ms:7.1f} {implied:7.1f} {implied / sim_pre:6.2f}"
        )
    print(
        "\nms; wait + prefill + rest = the closed form of a lone prompt's simulated TTFT\n"
        "bound: the prompt's FLOPs per GPU at the dense FP8/BF16 peak; MFU = bound / simulated prefill\n"
        "implied = real TTFT - real TPOT x the decode steps waited (the real prefill if the wait is as simulated); "
        "x sim = implied / simulated"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
