"""DeepSeek-V3/R1 and gpt-oss-120b corpus rows on H200, predicted by cbsim (issue #30, "must show").

Replays the aggregated H200 rows of NVIDIA AIConfigurator's real serving measurements
(``aiconfigurator_core/systems/silicon_sample.csv``; a judge, never a fitting set) for these models:
one kernel-database table per (model, engine, parallel layout), composed by
``calib.sources.kernel_db_moe`` from the database's own rows, then a closed-loop run of
``silicon_concurrency`` clients with the row's fixed input/output lengths. Prints each row and the
median |error| of TTFT and TPOT per group (engine, model family, layout).

Mapping, as the rows run them: ``tp_size`` attention GPUs per data-parallel rank, ``attention_dp_size``
ranks (stepping in lockstep), experts expert-parallel when ``moe_ep_size`` > 1 (then ``moe_ep_size``
must be tp × dp) else tensor-parallel over tp × dp. Rows whose layout maps to neither (``tp_size``
64 with 8 GPUs of experts) are skipped with the reason. Policies: each engine's own (``sglang``,
``vllm-v1``, ``trtllm``; TensorRT-LLM's token budget raised to hold one prompt beside the decodes,
:func:`engine_section`). KV cache in the
model's dtype (bf16), FlashMLA's 64-token blocks. gpt-oss rows say ``nvfp4`` in the corpus; the
checkpoint is served as shipped (MXFP4 experts).

    PYTHONPATH=. python bench/mla_rows.py [--limit N] [--engine sglang] [--model DeepSeek]

Needs aiconfigurator-core (``pip install 'cbsim[gpu-data]'``). CPU only; a few seconds per row.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

MODELS = {
    "deepseek-ai/DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-V3",
    "openai/gpt-oss-120b": "openai/gpt-oss-120b",
}  # R1 has V3's shapes: one table serves both
POLICY = {"sglang": "sglang", "vllm": "vllm-v1", "trtllm": "trtllm"}


def corpus_rows(system: str = "h200_sxm"):
    import importlib.resources as res

    path = Path(str(res.files("aiconfigurator_core"))) / "systems" / "silicon_sample.csv"
    seen = set()
    with path.open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["system"] != system or row["mode"] != "agg" or row["model_path"] not in MODELS:
                continue
            m = re.search(r"silicon_concurrency=(\d+)", row["silicon_data_source"])
            row["concurrency"] = int(m.group(1)) if m else int(row["batch_size"])
            key = (
                MODELS[row["model_path"]],
                row["backend"],
                row["backend_version"],
                row["isl"],
                row["osl"],
                row["tp_size"],
                row["attention_dp_size"],
                row["moe_tp_size"],
                row["moe_ep_size"],
                row["concurrency"],
            )
            if key in seen:  # R1 and V3 rows of the same configuration measure the same shapes
                continue
            seen.add(key)
            yield row


def layout_of(row):
    """(tensor_parallel, data_parallel, expert_parallel) or a reason to skip."""
    tp, dp = int(row["tp_size"]), int(row["attention_dp_size"])
    mtp, mep = int(row["moe_tp_size"]), int(row["moe_ep_size"])
    if mtp * mep != tp * dp:
        return f"moe_tp {mtp} x moe_ep {mep} != tp {tp} x attention_dp {dp}: not one replica's layout"
    if mep > 1 and mtp > 1:
        return f"experts both tensor- ({mtp}) and expert-parallel ({mep}): not modelled"
    return tp, dp, mep > 1


def table_for(cache: dict, out: Path, model: str, engine: str, layout, max_len: int, max_seqs: int):
    from calib.sources import kernel_db_moe
    from sim.latency.table_format import write_table

    key = (model, engine, layout)
    if key not in cache:
        comp = kernel_db_moe.build_table(
            model,
            "h200",
            kernel_db_moe.Layout(*layout),
            engine=engine,
            block_size=64,
            max_num_batched_tokens=16384,
            max_model_len=max_len,
            max_num_seqs=max_seqs,
        )
        folder = out / f"{model.replace('/', '--')}-{engine}-tp{layout[0]}-dp{layout[1]}-ep{int(layout[2])}"
        write_table(folder, comp.table)
        cache[key] = folder
    return cache[key]


def engine_section(backend: str, c: int, isl: int, osl: int) -> dict:
    """FlashMLA's 64-token blocks, room for the row's lengths; TensorRT-LLM rows get a token budget
    that holds one prompt beside the other clients' decodes (its default max_num_tokens 8192 with
    chunking off admits an 8192-token context only into an empty step; the corpus does not say
    what its runs set, and a deployment serving 8k prompts sets more)."""
    engine = {"block_size": 64, "max_model_len": isl + osl + 64}
    if backend == "trtllm":
        engine["max_num_batched_tokens"] = max(8192, isl + c)
    return engine


def predict(row, table: Path, layout) -> tuple[float, float]:
    from sim import run
    from sim.scenario.schema import load_scenario

    tp, dp, ep = layout
    c, isl, osl = row["concurrency"], int(row["isl"]), int(row["osl"])
    scn = load_scenario(
        {
            "model": MODELS[row["model_path"]],
            "hardware": {
                "gpu": "h200",
                "tensor_parallel": tp,
                "data_parallel": dp,
                "expert_parallel": ep,
                "gpu_memory_utilization": 0.9,
            },
            "engine": engine_section(row["backend"], c, isl, osl),
            "latency": {"backend": "table", "path": str(table)},
            "workload": {
                "num_requests": max(3 * c, 12),
                "arrival": {"process": "closed", "concurrency": c},
                "prompt_tokens": {"dist": "fixed", "value": isl},
                "output_tokens": {"dist": "fixed", "value": osl},
            },
            "policies": [{"name": POLICY[row["backend"]]}],
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = next(iter(run(scn).summaries.values()))
    return summary["ttft_s"]["mean"] * 1e3, summary["tpot_s"]["mean"] * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="at most this many rows")
    ap.add_argument("--engine", default=None, help="only this backend (sglang, trtllm, vllm)")
    ap.add_argument("--model", default=None, help="only model paths containing this")
    args = ap.parse_args(argv)
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        print("needs aiconfigurator-core: pip install 'cbsim[gpu-data]'")
        return 2
    out = Path(tempfile.mkdtemp(prefix="cbsim-mla-rows-"))
    cache: dict = {}
    groups: dict[str, list[tuple[float, float]]] = {}
    n = 0
    for row in corpus_rows():
        if (
            args.engine
            and row["backend"] != args.engine
            or args.model
            and args.model not in row["model_path"]
        ):
            continue
        if args.limit is not None and n >= args.limit:
            break
        layout = layout_of(row)
        label = (
            f"{row['backend']} {row['backend_version'] or 'current'} {row['model_path'].split('/')[1]} "
            f"{row['isl']}/{row['osl']} tp{row['tp_size']} dp{row['attention_dp_size']} "
            f"ep{row['moe_ep_size']} c{row['concurrency']}"
        )
        if isinstance(layout, str):
            print(f"skip  {label}: {layout}")
            continue
        n += 1
        try:
            table = table_for(
                cache,
                out,
                MODELS[row["model_path"]],
                row["backend"],
                layout,
                max_len=max(8192, int(row["isl"]) + int(row["osl"]) + 64),
                max_seqs=max(64, 2 * row["concurrency"]),
            )
            ttft, tpot = predict(row, table, layout)
        except Exception as exc:  # one row's failure is reported, the rest still run
            print(f"error {label}: {exc}")
            continue
        real_ttft, real_tpot = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
        e_ttft, e_tpot = ttft / real_ttft - 1, tpot / real_tpot - 1
        family = "DeepSeek-V3/R1" if "DeepSeek" in row["model_path"] else row["model_path"].split("/")[1]
        group = f"{row['backend']} {family} tp{layout[0]} dp{layout[1]} {'ep' if layout[2] else 'moe-tp'}"
        groups.setdefault(group, []).append((e_ttft, e_tpot))
        print(
            f"row   {label}: TTFT {ttft:8.1f} vs {real_ttft:8.1f} ms ({e_ttft:+.0%}), "
            f"TPOT {tpot:6.2f} vs {real_tpot:6.2f} ms ({e_tpot:+.0%})",
            flush=True,
        )
    print("\nper group: median |TTFT error|, median |TPOT error| (rows)")
    for group, errs in sorted(groups.items()):
        mt = statistics.median(abs(a) for a, _ in errs)
        mp = statistics.median(abs(b) for _, b in errs)
        print(f"  {group:45s} TTFT {mt:6.1%}  TPOT {mp:6.1%}  ({len(errs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
