"""How fast are the shared traces parsed? Wall time per trace and rows per second.

The speed goal (the one-hour Azure conversation trace, 19,366 rows, in well under a second) used to
be a timed assertion in tests/test_traces.py, where a neighbouring test worker on the same two
cores could fail it at random; a goal that holds only on an idle machine belongs here (issue 14).

Usage::

    .venv/bin/python bench/trace_parse.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "reference" / "traces"
GOAL_S = 1.0  # the Azure conversation trace


def main() -> int:
    sys.path.insert(0, str(REPO))
    from sim.workload.traces import _load_cached, load_trace

    if not TRACES.is_dir():
        print(f"{TRACES} is missing: the bench parses the shared traces", file=sys.stderr)
        return 1
    print(f"load average {os.getloadavg()[0]:.2f} (other processes slow the wall time)")
    for path in sorted(p for p in TRACES.iterdir() if p.suffix in {".csv", ".jsonl"}):
        _load_cached.cache_clear()
        start = time.perf_counter()
        trace = load_trace(path)
        wall = time.perf_counter() - start
        note = f"  goal {GOAL_S:.1f} s: {wall / GOAL_S:.2f}x of it" if path.name.endswith("_conv.csv") else ""
        print(f"{path.name:45s} {len(trace):>8,d} rows {wall:7.3f} s {len(trace) / wall:>12,.0f} rows/s{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
