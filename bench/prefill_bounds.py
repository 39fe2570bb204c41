"""Each operator of a lone prompt's prefill step, as the kernel-db table prices it, beside the
hardware's floor for it (issues #26, #29): is any term of the prefill clock impossibly fast?

Why: the corpus' measured TTFT is above cbsim's almost everywhere, and after the opening wave is
counted (``bench/silicon_accuracy.py --phase opening``) what is left is per request. If the
table's prefill were too fast, some operator would be priced below what the GPU can do at all. This
script prices every operator of one prompt of the row's ISL (the database's own rows,
``calib.sources.kernel_db.KernelDb``: GEMMs at M = ISL, causal context attention with its launch,
the two tensor-parallel all-reduces, the norms, the LM head of one sequence) and divides each by its
floor (:func:`op_floors`):

- a GEMM: ``max(2 M N K / peak, N K × weight bytes / HBM)``, the dense FP8 Tensor Core peak for
  FP8 rows, BF16 otherwise (H100/H200 SXM: 1,979 / 989 TFLOP/s);
- causal context attention of ``s`` tokens: ``4 d (s (s + 1) / 2)`` FLOPs per query head (QKᵀ and
  PV over the lower triangle) at the same peak (FP8's for FP8 rows: the lower floor, whichever
  precision the kernel ran);
- an all-reduce of ``M × hidden`` BF16 values: those bytes once over the GPU's NVLink, one way
  (450 GB/s): the least any all-reduce moves per GPU (NVLink SHARP's in-switch reduction sends and
  receives each byte once; a ring sends ``2 (tp − 1) / tp`` times as much);
- a norm or the gated activation: the bytes it must read and write once at the HBM bandwidth;
- the LM head of one sequence: its weight read or its FLOPs, the larger.

``x floor`` = table / floor; below 1.0 the term is faster than the hardware allows. The row's
``implied`` prefill (measured TTFT less one measured TPOT, as ``bench/ttft_parts.py``) is printed
against the whole step and against its floor. Dense decoders only (MoE and MLA rows are skipped:
their experts are priced by ``kernel_db_moe``).

    .venv/bin/python bench/prefill_bounds.py --only h100_sxm --only _c8_ --only 1024x128
    .venv/bin/python bench/prefill_bounds.py --only h100_sxm_vllm --only llama_3_1_70b --lowest --ops
    .venv/bin/python bench/prefill_bounds.py --left /tmp/corpus/*.json [--clients 8]
    .venv/bin/python bench/prefill_bounds.py --waves /tmp/qwen_aic.json

``--left REPORT.json ...`` reads ``bench/silicon_accuracy.py --phase opening --json`` reports instead
and prints what the opening-wave model leaves of each row's TTFT (measured − simulated), by group,
layout and prompt length at one client count (default: each group's lowest), one column per output
length: a term of the prefill clock is the same at every output length and scales with the
prompt's work; a closed loop in which fewer requests run than clients send (``M`` slots for ``N``
clients, each request waiting ``(N / M − 1) × E2E``) grows with the output, at ``d left / d OSL =
(N / M − 1) × TPOT``, so each line also prints the slope and the ``M`` it implies.

``--waves REPORT.json ...`` reads reports of any ``--phase`` and prints, by group, layout and
prompt length, the measured mean TTFT over three of the simulated ones at each client count
(median over the output lengths): ``wave``, every client's first request sent at once and
prefilled as the engine takes them (the report's ``first_round``); ``warm``, the waves cbsim's loop
keeps after that round (``warm_steady``); the report's own phase (``sim_ttft_ms``). Where the
excess is waiting behind other prompts' prefills, these say how bunched the real clients were:
1.0 against ``wave`` is every round an opening wave (issue #29, docs/trtllm.md).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BF16_BYTES = 2
# the operators as AIConfigurator's dense decoders name them, and the columns they are printed in
GEMMS = ("qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm")
ALLREDUCES = ("ar_1", "ar_2")
MEMORY_OPS = ("add_norm_1", "add_norm_2", "act_gate")
COLUMNS = (("qkv", ("qkv_gemm",)), ("proj", ("proj_gemm",)), ("ffn1", ("gate_ffn1_gemm",)),
           ("ffn2", ("ffn2_gemm",)), ("attn", ("attention",)), ("ar", ALLREDUCES), ("norm+act", MEMORY_OPS),
           ("lmhead", ("logits_gemm",)))


def gemm_shapes(spec, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer on one GPU of ``tp``: QKV and gate+up split by columns, the output
    and down projections by rows; KV heads replicated when there are fewer than GPUs (as vLLM and
    TensorRT-LLM shard them)."""
    h, d = spec.hidden_size, spec.head_dim
    q = spec.num_heads // tp
    kv = max(1, spec.num_kv_heads // tp)
    inter = spec.intermediate_size // tp
    return {"qkv_gemm": ((q + 2 * kv) * d, h), "proj_gemm": (h, q * d),
            "gate_ffn1_gemm": (2 * inter, h), "ffn2_gemm": (h, inter)}


def op_floors(spec, gpu, tp: int, tokens: int, fp8: bool) -> dict[str, float]:
    """The least time (seconds, summed over the layers) each operator of one causal prefill of
    ``tokens`` tokens can take on one GPU of ``gpu`` at tensor parallelism ``tp`` (module docstring)."""
    from sim.errors import CbsimError

    if getattr(spec, "num_experts", 0) or getattr(spec, "kv_lora_rank", 0):
        raise CbsimError(f"model {spec.name!r}: prefill floors are for dense decoders; MoE and MLA layers "
                         f"are priced by calib.sources.kernel_db_moe")
    if tokens < 1 or tp < 1:
        raise CbsimError(f"tokens and tp must be positive, got tokens={tokens}, tp={tp}")
    peak = gpu.fp8_flops if fp8 and gpu.fp8_flops else gpu.peak_flops
    wbytes = 1 if fp8 else BF16_BYTES
    layers, m = spec.num_layers, tokens
    out = {}
    for name, (n, k) in gemm_shapes(spec, tp).items():
        out[name] = layers * max(2.0 * m * n * k / peak, n * k * wbytes / gpu.hbm_bandwidth)
    heads = spec.num_heads // tp
    out["attention"] = layers * heads * 4.0 * spec.head_dim * (m * (m + 1) / 2) / peak
    act = m * spec.hidden_size * BF16_BYTES  # one activation tensor, bf16
    link = gpu.gpu_link_bandwidth
    for name in ALLREDUCES:
        out[name] = layers * act / link if tp > 1 else 0.0
    # a fused residual add + RMSNorm reads x and the residual and writes both back
    for name in ("add_norm_1", "add_norm_2"):
        out[name] = layers * 4 * act / gpu.hbm_bandwidth
    inter = spec.intermediate_size // tp
    out["act_gate"] = layers * 3 * m * inter * BF16_BYTES / gpu.hbm_bandwidth  # reads gate and up, writes one
    vocab = -(-spec.vocab_size // tp)
    out["logits_gemm"] = max(2.0 * vocab * spec.hidden_size / gpu.peak_flops,
                             vocab * spec.hidden_size * BF16_BYTES / gpu.hbm_bandwidth)
    return out


def row_db(row):
    """The kernel database of ``row``'s table (bench/silicon_accuracy.py's dense key)."""
    from calib.sources.kernel_db import KernelDb, resolve_model

    gpu, config, tp, precision, engine, scaling, allreduce = row.table_key[:7]
    return KernelDb(resolve_model(config), gpu, tp=tp, dtype=precision, engine=engine, fp8_scaling=scaling,
                    allreduce=allreduce)


def step_ops(db, tokens: int) -> dict[str, float]:
    """The table's operators of one prompt of ``tokens`` alone (seconds over the layers): the linear
    operators at M = tokens, its causal context attention, the LM head of one sequence."""
    ops = {k: v.seconds for k, v in db.linear_ops(tokens).items()}
    ops.update({k: v.seconds for k, v in db.prefill_attn_ops(tokens, 0).items()})
    ops.update({k: v.seconds for k, v in db.per_seq_ops(1).items()})
    return ops


def compare(db, tokens: int) -> dict[str, tuple[float, float]]:
    """Operator -> (table seconds, floor seconds) for one prompt of ``tokens`` on ``db``."""
    from sim.hardware.gpus import get_gpu

    floors = op_floors(db.spec, get_gpu(db_gpu(db)), db.tp, tokens, db.dtype == "fp8")
    return {name: (secs, floors.get(name, 0.0)) for name, secs in step_ops(db, tokens).items()}


def db_gpu(db) -> str:
    """cbsim's GPU id of a KernelDb (AIConfigurator's system name back to cbsim's)."""
    from calib.sources.kernel_db import aic_system
    from sim.hardware.gpus import GPUS

    for name in GPUS:
        try:
            if aic_system(name) == db.system:
                return name
        except Exception:  # noqa: BLE001 - GPUs the database has no system for
            continue
    raise SystemExit(f"no cbsim GPU maps to {db.system}")


def lowest(rows):
    """Each group's rows at its lowest concurrency (where TTFT is closest to one prompt's prefill)."""
    least = defaultdict(lambda: 1 << 30)
    for r in rows:
        least[r.group] = min(least[r.group], r.concurrency)
    return [r for r in rows if r.concurrency == least[r.group]]


def left_over(reports: list[Path]) -> list[dict]:
    """Each ``--phase opening`` report row's measured and simulated TTFT with its lengths and clients
    (from the corpus CSV, by id)."""
    import json

    import bench.silicon_accuracy as sa
    from sim.errors import CbsimError

    meta = {r.id: r for r in sa.read_rows()}
    out = []
    for path in reports:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        if report.get("phase") != "opening":
            raise CbsimError(f"{path}: --left needs a `--phase opening` report of bench/silicon_accuracy.py, "
                             f"this one is --phase {report.get('phase')!r}")
        for r in report["rows"]:
            if r.get("error") or r["id"] not in meta:
                continue
            m, ex = meta[r["id"]], r.get("extra") or {}
            steady = (ex.get("random_steady") or {}).get("ttft_ms")
            # the most a phase model gives: every round a wave (the opening round, or the later ones kept)
            waves = [(ex.get(k) or {}).get("ttft_ms") for k in ("first_round", "warm_steady")]
            waves = [w for w in waves if w is not None]
            where = None
            if steady is not None and waves:
                real = r["ttft_ms"]
                where = "below" if real < steady else "inside" if real <= max(waves) else "above"
            out.append({"group": r["group"], "layout": r.get("layout", f"tp{m.tp}"), "isl": m.isl, "osl": m.osl,
                        "clients": m.concurrency, "left_ms": r["ttft_ms"] - r["sim_ttft_ms"],
                        "tpot_ms": r["tpot_ms"], "where": where})
    return out


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs; None for fewer than two distinct xs."""
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def left_lines(rows: list[dict], clients: int | None) -> list[dict]:
    """:func:`left_over`'s rows at ``clients`` (None: each group's lowest), one line per group, layout,
    prompt length and clients: the median left per output length, its slope over the output length
    (ms per token), the median measured TPOT, the running slots ``M`` that slope implies (None under
    1 % of a TPOT per token: noise, not a queue), and how many rows lie below / inside / above the
    phase models' range."""
    if clients is None:
        least = defaultdict(lambda: 1 << 30)
        for r in rows:
            least[r["group"]] = min(least[r["group"]], r["clients"])
        rows = [r for r in rows if r["clients"] == least[r["group"]]]
    else:
        rows = [r for r in rows if r["clients"] == clients]
    lines = defaultdict(list)
    for r in rows:
        lines[(r["group"], r["layout"], r["isl"], r["clients"])].append(r)
    out = []
    for (group, layout, isl, n), rs in sorted(lines.items()):
        by = defaultdict(list)
        for r in rs:
            by[r["osl"]].append(r["left_ms"])
        osls = sorted(by)
        left = [sorted(by[o])[len(by[o]) // 2] for o in osls]
        tpot = sorted(x["tpot_ms"] for x in rs)[len(rs) // 2]
        k = slope([float(o) for o in osls], left)
        slots = n / (1 + k / tpot) if k is not None and k > 0.01 * tpot else None
        where = tuple(sum(r["where"] == w for r in rs) for w in ("below", "inside", "above"))
        out.append({"group": group, "layout": layout, "isl": isl, "clients": n, "left": dict(zip(osls, left)),
                    "slope": k, "tpot": tpot, "slots": slots, "where": where})
    return out


def print_left(reports: list[Path], clients: int | None) -> int:
    lines = left_lines(left_over(reports), clients)
    if not lines:
        print("no rows at that client count")
        return 1
    print(f"{'group (GPU engine model)':48s} {'layout':8s} {'ISL':>5s} {'N':>4s}   left ms by OSL"
          f"{'':26s} {'us/tok':>7s} {'dOSL us':>7s} {'TPOT':>5s} {'M':>6s}  below/inside/above")
    for ln in lines:
        cells = " ".join(f"{o}:{v:.0f}" for o, v in ln["left"].items())
        grow = "" if ln["slope"] is None else f"{ln['slope'] * 1e3:7.0f}"
        slots = f"{'-':>6s}" if ln["slots"] is None else f"{ln['slots']:6.1f}"
        per_tok = min(ln["left"].values()) / ln["isl"] * 1e3
        print(f"{ln['group'][:48]:48s} {ln['layout']:8s} {ln['isl']:5d} {ln['clients']:4d}   {cells:40s} "
              f"{per_tok:7.0f} {grow:>7s} {ln['tpot']:5.1f} {slots}  {'/'.join(map(str, ln['where']))}")
    print("\nleft: measured - simulated (`--phase opening`) mean TTFT, ms, median per output length; us/tok: the "
          "least of them per prompt token;\ndOSL us: its growth per output token (us); M: the running slots "
          "a closed loop of N clients would need for that growth, N / (1 + dOSL / TPOT);\n"
          "below/inside/above: rows whose measured TTFT is below the diffused steady state (`random`), inside "
          "[steady, every round a wave], or above any phase model")
    return 0


WAVE_COLUMNS = (("wave", "first_round"), ("warm", "warm_steady"), ("phase", None))


def wave_ratios(reports: list[Path]) -> list[dict]:
    """Each report row's measured mean TTFT over the simulated ``first_round``, ``warm_steady`` and
    the report's own phase (None where the report lacks one), with its lengths and clients (from the
    corpus CSV, by id)."""
    import json

    import bench.silicon_accuracy as sa

    meta = {r.id: r for r in sa.read_rows()}
    out = []
    for path in reports:
        for r in json.loads(Path(path).read_text(encoding="utf-8"))["rows"]:
            if r.get("error") or r["id"] not in meta:
                continue
            m, ex = meta[r["id"]], r.get("extra") or {}
            sims = {label: r["sim_ttft_ms"] if key is None else (ex.get(key) or {}).get("ttft_ms")
                    for label, key in WAVE_COLUMNS}
            out.append({"group": r["group"], "layout": r.get("layout", f"tp{m.tp}"), "isl": m.isl, "osl": m.osl,
                        "clients": m.concurrency,
                        "ratio": {k: r["ttft_ms"] / v if v else None for k, v in sims.items()}})
    return out


def wave_lines(rows: list[dict]) -> list[dict]:
    """:func:`wave_ratios`' rows, one line per group, layout and prompt length: for each column the
    median ratio over the output lengths at each client count."""
    lines = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        for label, v in r["ratio"].items():
            if v is not None:
                lines[(r["group"], r["layout"], r["isl"])][label][r["clients"]].append(v)
    out = []
    for (group, layout, isl), cols in sorted(lines.items()):
        out.append({"group": group, "layout": layout, "isl": isl,
                    "ratio": {label: {n: sorted(vs)[len(vs) // 2] for n, vs in sorted(cols[label].items())}
                              for label, _ in WAVE_COLUMNS if label in cols}})
    return out


def print_waves(reports: list[Path]) -> int:
    lines = wave_lines(wave_ratios(reports))
    if not lines:
        print("no rows")
        return 1
    print(f"{'group (GPU engine model)':48s} {'layout':8s} {'ISL':>5s}   measured / simulated mean TTFT by clients")
    for ln in lines:
        cells = "   ".join(f"{label} " + " ".join(f"{n}:{v:.2f}" for n, v in by.items())
                           for label, by in ln["ratio"].items())
        print(f"{ln['group'][:48]:48s} {ln['layout']:8s} {ln['isl']:5d}   {cells}")
    print("\nwave: every client's first request sent at once (the report's first_round); warm: the waves cbsim's "
          "loop keeps after it;\nphase: the report's own --phase; median over the output lengths")
    return 0


def main(argv=None) -> int:
    import bench.silicon_accuracy as sa

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--left", nargs="+", type=Path, default=None, metavar="REPORT.json",
                    help="print what `--phase opening` reports leave of each row's TTFT, by output length")
    ap.add_argument("--clients", type=int, default=None, help="with --left: this client count (default: lowest)")
    ap.add_argument("--waves", nargs="+", type=Path, default=None, metavar="REPORT.json",
                    help="print each report row's measured TTFT over its simulated opening wave, kept waves and phase")
    ap.add_argument("--only", action="append", default=[], help="keep rows whose id/GPU/engine/model contain this")
    ap.add_argument("--lowest", action="store_true", help="only each group's rows at its lowest concurrency")
    ap.add_argument("--ops", action="store_true", help="also print every operator's table and floor times")
    args = ap.parse_args(argv)
    if args.left:
        return print_left(args.left, args.clients)
    if args.waves:
        return print_waves(args.waves)
    rows = sa.select(sa.read_rows(), args.only)
    sa.classify(rows)
    priced = [r for r in rows if not r.skip and not r.moe_path]
    if args.lowest:
        priced = lowest(priced)
    priced.sort(key=lambda r: (r.system, r.engine, r.model, r.tp, r.isl, r.concurrency, r.osl))
    if not priced:
        print("no dense priced rows match")
        return 1
    dbs = {}
    head = "  ".join(f"{c:>8s}" for c, _ in COLUMNS)
    print(f"{'row':50s} {head}   {'table':>6s} {'floor':>6s} {'implied':>7s} {'x table':>7s} {'x floor':>7s}")
    for r in priced:
        key = r.table_key[:7]
        if key not in dbs:
            try:
                dbs[key] = row_db(r)
            except Exception as exc:  # noqa: BLE001 - the database's own gaps: the row is skipped, with why
                dbs[key] = f"{type(exc).__name__}: {str(exc).split(' at /')[0][:160]}"
        db = dbs[key]
        if isinstance(db, str):
            print(f"{r.id[:50]:50s} skipped: {db}")
            continue
        got = compare(db, r.isl)
        cells = []
        for _label, names in COLUMNS:
            t = sum(got[n][0] for n in names if n in got)
            f = sum(got[n][1] for n in names if n in got)
            cells.append(f"{t / f:8.2f}" if f > 0 else f"{'-':>8s}")
        table = sum(t for t, _ in got.values())
        floor = sum(f for _, f in got.values())
        implied = (r.ttft_ms - r.tpot_ms) * 1e-3
        name = f"{r.system[:4]} {r.engine} {r.model.split('/')[-1][:12]} {r.precision or 'bf16'} {r.isl}x{r.osl} c{r.concurrency} tp{r.tp}"
        print(f"{name[:50]:50s} {'  '.join(cells)}   {table * 1e3:6.1f} {floor * 1e3:6.1f} {implied * 1e3:7.1f} "
              f"{implied / table:7.2f} {implied / floor:7.2f}")
        if args.ops:
            for op, (t, f) in got.items():
                print(f"    {op:16s} table {t * 1e3:8.3f} ms   floor {f * 1e3:8.3f} ms" + (f"   x {t / f:5.2f}" if f else ""))
    print("\nx floor per column: the table's time / the hardware's floor (module docstring); < 1.00 is impossibly fast\n"
          "table, floor: one prompt of ISL tokens alone, ms; implied = real TTFT - real TPOT (ms); "
          "x table, x floor: implied over each")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
