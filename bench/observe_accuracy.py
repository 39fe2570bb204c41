"""How close does cbsim get to a real vLLM it observed? Run on an idle machine (no other load).

Starts ``vllm serve`` (vLLM 0.32.0 CPU build from ``.venv-vllm``, ``make vllm-env``) with the tiny
random Llama of tests/vllm_server on 127.0.0.1, observes workload A, then workload B three times
(the server's own repeat spread), calibrates on A (token times alone, and with the iteration log),
validates on every B run, and prints TTFT, TPOT and E2E mean errors next to the repeat spread
((max − min) / min of the three B runs' means). Each workload is first observed once unmeasured: the
CPU build creates its kernels per batch shape the first time it meets one, which made the first
observation of a workload up to 25 % slower in TTFT than its repeats. The goal (issue #22): 10 % on each mean, or the repeat spread where that is larger.
Each observation draws fresh prompt content (``cbsim observe``'s default), so the repeat of B does
not hit the prefix cache that the first B left on the server.

    .venv/bin/python bench/observe_accuracy.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.test_observe_vllm import workload_a, workload_b  # noqa: E402
from tests.vllm_server.launch import vllm_server, write_model  # noqa: E402

CBSIM = str(REPO / ".venv" / "bin" / "cbsim")
KEYS = ("ttft_mean", "tpot_mean", "e2e_mean")
REPEATS = ("b1", "b2", "b3")


def cbsim(*args) -> None:
    subprocess.run([CBSIM, *map(str, args)], check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="keep runs, tables and reports here")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="observe-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    model = write_model(out / "tiny-llama")
    runs = {}
    with vllm_server(model, out / "vllm.log") as url:
        sequence = (("a-warm-up", workload_a()), ("a", workload_a()), ("b-warm-up", workload_b()),
                    *((b, workload_b()) for b in REPEATS))
        for name, scn in sequence:
            (out / f"{name}.yaml").write_text(yaml.safe_dump(scn))
            runs[name] = out / f"run_{name}.json"
            cbsim("observe", out / f"{name}.yaml", "--url", url, "--out", runs[name], "-q")
    rows = []
    for how, extra in (("token times", []), ("iteration log", ["--iteration-log", out / "vllm.log"])):
        table = out / f"table-{how.replace(' ', '-')}"
        cbsim("calibrate", "--from-run", runs["a"], *extra, "--out", table, "-q")
        for b in ("a-warm-up", *REPEATS):  # A's own unmeasured repeat: how far the machine moved
            report = out / f"validate-{how.replace(' ', '-')}-{b}.json"
            cbsim("validate", "--against", runs[b], "--table", table, "--json", report)
            rows.append((how, b, json.loads(report.read_text())))
    real = {b: r["real"] for _, b, r in rows}
    spread = {k: max(real[b][k] for b in REPEATS) / min(real[b][k] for b in REPEATS) - 1 for k in KEYS}
    lags = {n: json.loads(p.read_text())["observe"]["send_lag_s"] for n, p in runs.items() if "warm" not in n}
    print("| table from run A | validated on | TTFT mean | TPOT mean | E2E mean |")
    print("|---|---|---|---|---|")
    in_sample = next(r for how, b, r in rows if b == "a-warm-up" and how == "iteration log")
    print("| iteration log | A's unmeasured first observation | "
          + " | ".join(f"{in_sample['error'][k]:+.1%}" for k in KEYS) + " |")
    for how, b, r in rows:
        if b not in REPEATS:
            continue
        print(f"| {how} | {b} | " + " | ".join(f"{r['error'][k]:+.1%}" for k in KEYS) + " |")
    print(f"| server's repeat spread | {', '.join(REPEATS)} | " + " | ".join(f"{spread[k]:.1%}" for k in KEYS) + " |")
    print("measured: " + "; ".join(f"{b}: TTFT {real[b]['ttft_mean'] * 1e3:.1f} ms, TPOT "
                                   f"{real[b]['tpot_mean'] * 1e3:.2f} ms, E2E {real[b]['e2e_mean'] * 1e3:.0f} ms"
                                   for b in REPEATS))
    print("send lag (mean / p99 / max ms): " + "; ".join(
        f"{n} {v['mean'] * 1e3:.2f} / {v['p99'] * 1e3:.2f} / {v['max'] * 1e3:.2f}" for n, v in lags.items()))
    goal = {k: max(0.10, spread[k]) for k in KEYS}
    cells = [abs(r["error"][k]) <= goal[k] for _, b, r in rows if b in REPEATS for k in KEYS]
    print("goal (max of 10 % and the repeat spread): " + ", ".join(f"{k} {goal[k]:.1%}" for k in KEYS)
          + f"; met in {sum(cells)} of {len(cells)} cells")
    print(f"files: {out}")


if __name__ == "__main__":
    main()
