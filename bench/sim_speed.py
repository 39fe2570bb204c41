"""How fast does cbsim simulate? Wall time, simulated steps and requests per second, peak memory.

Cases (each runs ``sim.run`` in a fresh subprocess, so its peak RSS is its own):

* ``azure-conv``: the one-hour Azure LLM conversation trace (19,366 requests, real timestamps)
  through vllm-v1, Llama-3-8B on one H200, roofline latency. Vidur needs about two minutes for
  this replay on this class of machine.
* ``poisson-200k``: 200,000 synthetic chat requests (the quickstart's lognormal lengths) arriving
  as a Poisson process at 80 % of vllm-v1's capacity, which ``sim.planning.capacity.search_capacity``
  finds first (p99 TTFT <= 2 s, TPOT <= 0.1 s on 4,000-request probes, as scenarios/quickstart.yaml).
* ``poisson-20k`` (``--only poisson-20k``): 20,000 requests of the same workload at 20.9754 req/s
  (80 % of the capacity measured on this workload; ``--rate`` overrides it, no capacity search): a
  load near capacity, where arrivals interrupt decode stretches every step or two, so it measures
  the cost of steps simulated one by one.
* ``--scale``: the same Poisson workload at 10k, 100k and 1M requests, to show that the cost
  grows linearly with the simulated work (and that 1M requests fit in bounded memory): it prints
  the CPU time per request, and the result frames' bytes per step and per request beside what the
  run kept beyond them.

Usage::

    .venv/bin/python bench/sim_speed.py                   # azure-conv and poisson-200k
    .venv/bin/python bench/sim_speed.py --only azure-conv
    .venv/bin/python bench/sim_speed.py --scale
    .venv/bin/python bench/sim_speed.py --no-record       # print only
    .venv/bin/python bench/sim_speed.py --only azure-conv --compare 084e4d6

``--compare REV`` checks the revision out into a temporary ``git worktree`` and runs each case on
this tree and on it alternately, three times each (``--repeat``), every run in a fresh process
whose ``PYTHONPATH`` is that tree; it prints the median wall time, CPU time and peak RSS of each
and their ratios (this tree over REV). The machine is shared and its speed drifts, so a speed
claim is a ratio of medians measured in one sitting, not two rows of the table measured apart.

Each measured case appends one row to ``bench/results.md`` (with ``git rev-parse --short HEAD``,
``+dirty`` when the tree has uncommitted changes, and the 1-minute load average: other processes
on the machine slow the wall time) and prints the ratio of its wall time to the previous row of
the same case.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results.md"
AZURE_CONV = REPO.parent / "shared" / "reference" / "traces" / "AzureLLMInferenceTrace_conv.csv"
CAPACITY_PROBE_REQUESTS = 4000
LOAD_FRACTION = 0.8
POISSON_20K_RATE = 20.9754  # 80 % of the capacity search's result on this workload (bench/results.md)
INTERPRETER_MB = 115  # peak RSS of a process that imported sim and ran nothing (bench/results.md, issue 33)
TABLE_HEADER = ("| date | commit | case | requests | steps | wall s | cpu s | steps/s | requests/s "
                "| peak RSS MB | wall vs previous | load | notes |")

if str(REPO) not in sys.path and "--measure" not in sys.argv:
    # a --measure child imports the tree its PYTHONPATH names (this one, or --compare's revision)
    sys.path.insert(0, str(REPO))


def azure_scenario() -> dict:
    return {
        "name": "bench-azure-conv",
        "seed": 7,
        "model": "llama-3-8b",
        "hardware": {"gpu": "h200"},
        "latency": {"backend": "roofline"},
        "workload": {"trace": {"path": str(AZURE_CONV), "format": "azure"}},
        "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 16384},
        "policies": [{"name": "vllm-v1"}],
    }


def poisson_scenario(num_requests: int, rate: float) -> dict:
    return {
        "name": f"bench-poisson-{num_requests}",
        "seed": 7,
        "model": "llama-3-8b",
        "hardware": {"gpu": "h200", "tensor_parallel": 1, "gpu_memory_utilization": 0.92},
        "latency": {"backend": "roofline"},
        "workload": {
            "num_requests": num_requests,
            "arrival": {"process": "poisson", "rate": rate},
            "prompt_tokens": {"dist": "lognormal", "mean": 1155, "p99": 4142},
            "output_tokens": {"dist": "lognormal", "mean": 211, "p99": 601},
            "max_tokens": 1024,
        },
        "engine": {"block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 8192},
        "policies": [{"name": "vllm-v1"}],
        "slo": {"ttft_s": 2.0, "tpot_s": 0.1, "percentile": 99},
    }


def find_capacity() -> float:
    """vllm-v1's capacity (req/s) on the bench workload, by sim.planning.capacity's search."""
    from sim.planning.capacity import search_capacity
    from sim.scenario.schema import load_scenario

    scn = load_scenario(poisson_scenario(CAPACITY_PROBE_REQUESTS, 20.0))
    return search_capacity(scn, "vllm-v1").rate_rps


def measure(scenario: dict) -> dict:
    """Run one scenario in this process; what the parent records."""
    import sim

    t0, c0 = time.perf_counter(), time.process_time()
    result = sim.run(scenario)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    summary = result.summaries[result.labels[0]]
    return {
        "requests": int(summary["requests_total"]),
        "finished": int(summary["requests_finished"]),
        "steps": int(summary["steps"]),
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "token_times_in_memory": "token_times_s" in result.requests.columns,
        "itl_p50_s": summary["itl_s"]["p50"],
        # the result frames' own bytes (strings included), to tell them from what a run keeps beside
        "steps_frame_mb": result.steps.memory_usage(deep=True).sum() / 2**20,
        "requests_frame_mb": result.requests.memory_usage(deep=True).sum() / 2**20,
    }


def run_case(name: str, scenario: dict, tree: Path = REPO) -> dict:
    """``measure`` in a fresh Python process (clean peak RSS, no warm caches) importing ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "--measure", json.dumps(scenario)], cwd=tree,
                         capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{name} failed in {tree}:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["case"] = name
    return res


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def previous_wall(case: str) -> float | None:
    """Wall time of the last recorded row of this case in bench/results.md."""
    if not RESULTS.exists():
        return None
    last = None
    for line in RESULTS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[2] == case:
            try:
                last = float(cells[5])
            except ValueError:
                pass
    return last


def record(rows: list[dict]) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else "# cbsim simulation speed\n"
    if TABLE_HEADER not in text:
        text = text.rstrip("\n") + "\n\n## Measurements (appended by bench/sim_speed.py)\n\n" + TABLE_HEADER + "\n"
        text += "|" + "|".join(["---"] * (TABLE_HEADER.count("|") - 1)) + "|\n"
    for r in rows:
        text = text.rstrip("\n") + "\n" + row_markdown(r) + "\n"
    RESULTS.write_text(text)


def row_markdown(r: dict) -> str:
    ratio = f"{r['ratio']:.2f}" if r.get("ratio") else "—"
    cells = [r["date"], r["commit"], r["case"], f"{r['requests']:,}", f"{r['steps']:,}", f"{r['wall_s']:.2f}",
             f"{r['cpu_s']:.2f}", f"{r['steps'] / r['wall_s']:,.0f}", f"{r['requests'] / r['wall_s']:,.0f}",
             f"{r['peak_rss_mb']:,.0f}", ratio, f"{r['load']:.1f}", r.get("notes", "")]
    return "| " + " | ".join(cells) + " |"


def compare(cases: list[tuple[str, dict]], rev: str, repeat: int) -> None:
    """Each case on this tree and on ``rev``, alternately, ``repeat`` times each; ratios of medians."""
    from statistics import median

    from bench.revision_tree import revision_tree

    with revision_tree(rev) as other:
        for name, scn in cases:
            runs: dict[str, list[dict]] = {"this": [], rev: []}
            for i in range(repeat):
                for side, tree in (("this", REPO), (rev, other)) if i % 2 == 0 else ((rev, other), ("this", REPO)):
                    r = run_case(name, scn, tree)
                    runs[side].append(r)
                    print(f"  {name} [{side} {i + 1}/{repeat}]: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, "
                          f"{r['steps']:,} steps, peak RSS {r['peak_rss_mb']:,.0f} MB", flush=True)
            med = {side: {k: median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "peak_rss_mb")}
                   for side, rs in runs.items()}
            steps = {side: rs[0]["steps"] for side, rs in runs.items()}
            a, b = med["this"], med[rev]
            print(f"{name}: this tree {a['wall_s']:.2f} s wall / {a['cpu_s']:.2f} s CPU / "
                  f"{a['peak_rss_mb']:,.0f} MB ({steps['this']:,} steps); {rev} {b['wall_s']:.2f} s / "
                  f"{b['cpu_s']:.2f} s / {b['peak_rss_mb']:,.0f} MB ({steps[rev]:,} steps)")
            print(f"{name}: ratio this/{rev} (medians of {repeat}): wall {a['wall_s'] / b['wall_s']:.3f}x, "
                  f"CPU {a['cpu_s'] / b['cpu_s']:.3f}x, peak RSS {a['peak_rss_mb'] / b['peak_rss_mb']:.3f}x",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["azure-conv", "poisson-200k", "poisson-20k"], help="run just this case")
    ap.add_argument("--scale", action="store_true", help="the Poisson workload at 10k, 100k and 1M requests")
    ap.add_argument("--rate", type=float, help="skip the capacity search: Poisson rate in req/s")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/results.md")
    ap.add_argument("--note", default="", help="free text for the notes column")
    ap.add_argument("--compare", metavar="REV", help="run each case on this tree and on git revision REV "
                    "alternately and print the ratios of the medians (nothing is recorded)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tree with --compare (default 3)")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # internal: run one scenario (JSON), print JSON
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))))
        return 0

    cases: list[tuple[str, dict]] = []
    rate = None
    if args.only == "poisson-20k" and not args.scale:
        cases.append(("poisson-20k", poisson_scenario(20_000, args.rate or POISSON_20K_RATE)))
    elif args.only != "azure-conv" or args.scale:
        if args.rate:
            rate = args.rate
        else:
            t = time.perf_counter()
            capacity = find_capacity()
            rate = round(LOAD_FRACTION * capacity, 4)
            print(f"vllm-v1 capacity {capacity:.3f} req/s (search: {time.perf_counter() - t:.1f} s); "
                  f"Poisson runs at {LOAD_FRACTION:.0%}: {rate} req/s")
    if args.scale:
        cases += [(f"poisson-{n // 1000}k" if n < 10**6 else "poisson-1M", poisson_scenario(n, rate))
                  for n in (10_000, 100_000, 1_000_000)]
    else:
        if args.only in (None, "azure-conv"):
            cases.append(("azure-conv", azure_scenario()))
        if args.only in (None, "poisson-200k"):
            cases.append(("poisson-200k", poisson_scenario(200_000, rate)))

    if args.compare:
        if args.repeat < 1:
            raise SystemExit(f"--repeat must be >= 1, got {args.repeat}")
        compare(cases, args.compare, args.repeat)
        return 0
    rows = []
    for name, scn in cases:
        load = os.getloadavg()[0]
        res = run_case(name, scn)
        res.update(date=dt.date.today().isoformat(), commit=commit(), load=load)
        prev = previous_wall(name)
        res["ratio"] = res["wall_s"] / prev if prev else None
        notes = [args.note] if args.note else []
        if name.startswith("poisson"):
            notes.append(f"rate {scn['workload']['arrival']['rate']} req/s")
        if not res["token_times_in_memory"]:
            notes.append("token_times_s not in memory")
        res["notes"] = "; ".join(notes)
        rows.append(res)
        vs = f", {res['ratio']:.2f}x the previous wall time ({prev:.2f} s)" if prev else ""
        print(f"{name}: {res['requests']:,} requests, {res['steps']:,} steps in {res['wall_s']:.2f} s wall "
              f"({res['cpu_s']:.2f} s CPU, load {load:.1f}): {res['steps'] / res['wall_s']:,.0f} steps/s, "
              f"{res['requests'] / res['wall_s']:,.0f} requests/s, peak RSS {res['peak_rss_mb']:,.0f} MB{vs}")
    if args.scale and len(rows) > 1:
        base = rows[0]["cpu_s"] / rows[0]["requests"]
        print("\nscaling: CPU time per request relative to 10k; memory: the frames' bytes per step and per "
              f"request, and what the run kept beyond them and the interpreter ({INTERPRETER_MB} MB) per request")
        for r in rows:
            beyond = (r["peak_rss_mb"] - INTERPRETER_MB - r["steps_frame_mb"] - r["requests_frame_mb"]) * 2**20
            print(f"  {r['requests']:>9,}  {r['cpu_s']:8.2f} s CPU  {r['cpu_s'] / r['requests'] * 1e6:7.1f} us/request  "
                  f"x{r['cpu_s'] / r['requests'] / base:.2f}  peak {r['peak_rss_mb']:,.0f} MB: steps frame "
                  f"{r['steps_frame_mb'] * 2**20 / r['steps']:.0f} B/step, requests frame "
                  f"{r['requests_frame_mb'] * 2**20 / r['requests']:.0f} B/request, beyond "
                  f"{beyond / r['requests']:.0f} B/request")
    if not args.no_record:
        record(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
