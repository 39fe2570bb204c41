"""Two latency tables of the same model and GPU, component by component: B / A at shared points.

Why: a table composed from a kernel database and one composed from a profile bundle can predict a
served run differently for reasons one number (TTFT error) hides. This prints each component's
values in both tables at points that matter for serving (inside both grids) and their ratio, so
the difference can be traced to a component (linear, per_seq, prefill_attn, decode_attn,
decode_attn_mixed, engine_cpu) and a region (small batches, long contexts, ...).

    .venv/bin/python bench/compare_tables.py TABLE_A TABLE_B [--points serving|grid]

``serving`` (default): points a server with a 2048-token budget and up to 256 sequences reaches;
``grid``: every grid point of A that lies inside B's grid. A component missing from a table is
priced as the simulator prices it (``decode_attn_mixed`` falls back to ``decode_attn``; ``per_seq``
and ``engine_cpu`` to 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calib.sources.kernel_db import interp  # noqa: E402  (the table backend's own interpolation)
from sim.latency.table_format import read_table  # noqa: E402

SERVING = {
    "linear": [(t,) for t in (1, 8, 32, 64, 128, 256, 512, 1024, 2048)],
    "per_seq": [(s,) for s in (1, 8, 32, 64, 128, 256)],
    "prefill_attn": [(n, c) for n in (16, 128, 512, 1024, 2048) for c in (0, 512, 2048, 8192)],
    "decode_attn": [(b, c) for b in (1, 8, 32, 64, 128, 256) for c in (256, 1024, 4096)],
    "decode_attn_mixed": [(b, c) for b in (1, 8, 32, 64, 128, 256) for c in (256, 1024, 4096)],
    "engine_cpu": [(s,) for s in (1, 32, 128, 256)],
}
FALLBACK = {"decode_attn_mixed": "decode_attn"}


def value(table, component: str, point) -> float | None:
    comp = component if component in table.components else FALLBACK.get(component)
    if comp is None or comp not in table.components:
        return 0.0 if component in ("per_seq", "engine_cpu") else None
    return interp(table, comp, *point)


def inside(table, component: str, point) -> bool:
    comp = component if component in table.components else FALLBACK.get(component)
    if comp is None or comp not in table.components:
        return True
    return all(ax[0] <= x <= ax[-1] for ax, x in zip(table.components[comp].axes, point))


def grid_points(a, b, component: str):
    comp = component if component in a.components else FALLBACK.get(component)
    if comp is None or comp not in a.components:
        return []
    axes = a.components[comp].axes
    if len(axes) == 1:
        pts = [(x,) for x in axes[0]]
    else:
        pts = [(x, y) for x in axes[0] for y in axes[1]]
    return [p for p in pts if inside(b, component, p)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--points", choices=("serving", "grid"), default="serving")
    args = ap.parse_args(argv)
    ta, tb = read_table(args.a), read_table(args.b)
    print(f"A = {args.a} ({ta.metadata.get('source')}, {ta.metadata.get('device')})")
    print(f"B = {args.b} ({tb.metadata.get('source')}, {tb.metadata.get('device')})")
    for k in ("decode_skew_alpha",):
        print(f"{k}: A {ta.metadata.get(k) or 0}  B {tb.metadata.get(k) or 0}")
    for component in SERVING:
        pts = SERVING[component] if args.points == "serving" else grid_points(ta, tb, component)
        pts = [p for p in pts if inside(ta, component, p) and inside(tb, component, p)]
        rows = []
        for p in pts:
            va, vb = value(ta, component, p), value(tb, component, p)
            if va is None or vb is None:
                continue
            ratio = f"{vb / va:6.3f}" if va > 0 else "   inf" if vb > 0 else "     -"
            rows.append(f"  {str(p):>14}  A {va * 1e3:9.3f} ms  B {vb * 1e3:9.3f} ms  B/A {ratio}")
        print(f"\n{component}" + ("" if component in ta.components else "  (A: absent)")
              + ("" if component in tb.components else "  (B: absent)"))
        print("\n".join(rows) if rows else "  (no shared points)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
