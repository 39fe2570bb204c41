"""Does this tree simulate exactly what another revision does? Digests of the step and request frames.

A speed change must decide nothing differently. This script runs the cases below, each in a fresh
process, on this tree and on a git revision (checked out into a temporary ``git worktree``), and
compares a SHA-256 of every policy's ``steps`` and ``requests`` frames (values, columns, the kind
of each dtype; token times included). It prints one line per case and policy and exits 1 on any difference.

Cases (what each exercises):

* ``azure-conv``: the one-hour Azure conversation trace through vllm-v1 (prefix caching on by
  default; no content shared): the bench's main case.
* ``mooncake-prefix``: the first 510 s (1,500 requests) of the Mooncake conversation trace (hash ids: real
  shared prefixes) on a small KV pool, vllm-v1 and SGLang: prefix hits, evictions, preemptions.
* ``memory-pressure``: ``scenarios/memory_pressure.yaml`` (vllm-v0 recompute and swap, vllm-v1).
* ``engines``: ``scenarios/engines.yaml`` (vllm-v1, SGLang, TGI, TensorRT-LLM; 8 shared system prompts).
* ``poisson``: 3,000 requests of ``bench/sim_speed.py``'s Poisson workload at 80 % of capacity
  (vllm-v1): arrivals every step or two, so nearly every step is scheduled one by one.

Usage::

    .venv/bin/python bench/frames_equal.py --against main     # or any revision
    .venv/bin/python bench/frames_equal.py --only engines --against 124fa25
    .venv/bin/python bench/frames_equal.py                     # digests of this tree only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "reference" / "traces"

CASES = ("azure-conv", "mooncake-prefix", "memory-pressure", "engines", "poisson")


def cases() -> dict[str, object]:
    """Case name -> a scenario dict or a scenario file path (the same for both trees)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.sim_speed import POISSON_20K_RATE, azure_scenario, poisson_scenario

    mooncake = {
        "name": "bench-mooncake-prefix",
        "seed": 3,
        "model": "llama-3-8b",
        "hardware": {"gpu": "h200", "gpu_memory_utilization": 0.2},
        "latency": {"backend": "roofline"},
        "workload": {"trace": {"path": str(TRACES / "mooncake_conversation_trace.jsonl"), "format": "mooncake",
                               "window_s": [0, 510]}},
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 8192, "max_model_len": 32768},
        "policies": [{"name": "vllm-v1"}, {"name": "sglang"}],
    }
    return {
        "azure-conv": azure_scenario(),
        "mooncake-prefix": mooncake,
        "memory-pressure": str(REPO / "scenarios" / "memory_pressure.yaml"),
        "engines": str(REPO / "scenarios" / "engines.yaml"),
        "poisson": poisson_scenario(3000, POISSON_20K_RATE),
    }


def frame_digest(frame) -> str:
    """SHA-256 of a frame's columns, dtype kinds and values (array cells by their bytes).

    Values, not storage: an integer column is hashed as int64 and a float column as float64
    whatever its width, so a tree that stores a count as int32 where another stored int64
    compares equal exactly when every value is the same (the kind, signed int / unsigned /
    float / bool / object, must still match)."""
    import numpy as np

    h = hashlib.sha256()
    h.update(repr(list(frame.columns)).encode())
    h.update(repr([t.kind if t.kind in "iufbO" else str(t) for t in frame.dtypes]).encode())
    for col in frame.columns:
        values = frame[col].to_numpy()
        if values.dtype.kind in "iu":
            values = values.astype(np.int64 if values.dtype.kind == "i" else np.uint64)
        elif values.dtype.kind == "f":
            values = values.astype(np.float64)
        if values.dtype == object:
            for v in values:
                h.update(np.asarray(v).tobytes() if isinstance(v, np.ndarray | list) else repr(v).encode())
                h.update(b"\0")
        else:
            h.update(np.ascontiguousarray(values).tobytes())
    return h.hexdigest()[:16]


def digests(scenario) -> dict[str, dict[str, str]]:
    """Run one scenario in this process (``sim`` from PYTHONPATH): policy label -> frame -> digest."""
    import sim

    result = sim.run(scenario)
    out = {}
    for label in result.labels:
        steps = result.steps[result.steps["policy"] == label] if "policy" in result.steps else result.steps
        reqs = result.requests[result.requests["policy"] == label] if "policy" in result.requests else result.requests
        out[label] = {"steps": frame_digest(steps.reset_index(drop=True)),
                      "requests": frame_digest(reqs.reset_index(drop=True)),
                      "summary": hashlib.sha256(json.dumps(result.summaries[label], sort_keys=True,
                                                           default=str).encode()).hexdigest()[:16],
                      "rows": f"{len(steps)} steps, {len(reqs)} requests"}
    return out


def run_in(tree: Path, case: str) -> dict:
    """``digests`` of the case in a fresh process whose imports come from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(REPO / "bench" / "frames_equal.py"), "--digest",
                          json.dumps(cases()[case])], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{case} failed in {tree}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=CASES, action="append", help="run just this case (repeatable)")
    ap.add_argument("--against", metavar="REV", help="compare with this git revision")
    ap.add_argument("--digest", help=argparse.SUPPRESS)  # internal: one scenario (JSON) here, print JSON
    args = ap.parse_args(argv)
    if args.digest:
        print(json.dumps(digests(json.loads(args.digest))))
        return 0
    sys.path.insert(0, str(REPO))
    from bench.revision_tree import revision_tree

    names = args.only or list(CASES)
    differ = 0
    with revision_tree(args.against) if args.against else _no_tree() as other:
        for case in names:
            mine = run_in(REPO, case)
            theirs = run_in(other, case) if other else None
            for label, d in mine.items():
                if theirs is None:
                    print(f"{case} / {label}: steps {d['steps']}, requests {d['requests']} ({d['rows']})")
                    continue
                t = theirs.get(label)
                same = t is not None and all(t[k] == d[k] for k in ("steps", "requests", "summary"))
                differ += not same
                print(f"{case} / {label}: {'identical' if same else 'DIFFERENT'} to {args.against} "
                      f"({d['rows']}; steps {d['steps']}, requests {d['requests']}"
                      + ("" if same else f"; theirs {t}") + ")")
    return 1 if differ else 0


class _no_tree:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
