"""Which component of a latency table explains its error on a real run? Swap them in one at a time.

Why: ``bench/compare_tables.py`` shows where two tables of the same model and GPU differ; this
shows which of those differences matter for a served run. Table A is validated against RUN as it
is, then with each component of table B put in its place (and B's decode-skew factor, as the
pseudo-component ``skew``), then with the combinations named by ``--also``. The run is only
predicted, never fitted: nothing here changes a table that cbsim ships.

    .venv/bin/python bench/ablate_tables.py RUN TABLE_A TABLE_B [--gpu GPU] [--also decode_attn_mixed+skew]

For the RTX PRO 6000 run of ../shared/reference/gpu-runs/ with A = the kernel-db table and B = the
LLMServingSim bundle table, this is the evidence behind issue 17's open 10 % bound (docs/accuracy.md,
"Accuracy against real GPU runs").
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.latency.table_format import read_table, write_table  # noqa: E402
from sim.recorded.validate_against import validate_against  # noqa: E402

KEYS = ("ttft_mean", "tpot_mean", "e2e_mean")
SKEW = "skew"


def swapped(a, b, names: list[str]):
    """Table A with B's components ``names`` (``skew``: B's ``decode_skew_alpha``)."""
    t = copy.deepcopy(a)
    for name in names:
        if name == SKEW:
            t.metadata["decode_skew_alpha"] = b.metadata.get("decode_skew_alpha") or 0.0
        elif name in b.components:
            t.components[name] = b.components[name]
        else:
            raise SystemExit(f"table B has no component {name!r}; it has {', '.join(b.components)}")
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--gpu", default=None, help="cbsim GPU id, where the run does not name its device")
    ap.add_argument("--also", action="append", default=[], help="a combination to swap, e.g. x+y (repeatable)")
    args = ap.parse_args(argv)
    ta, tb = read_table(args.a), read_table(args.b)
    singles = [c for c in tb.components if c in ta.components or c == "decode_attn_mixed"]
    if tb.metadata.get("decode_skew_alpha"):
        singles.append(SKEW)
    cases = [("A as it is", []), ("B as it is", None)] + [(f"A with B's {c}", [c]) for c in singles]
    cases += [(f"A with B's {c}", c.split("+")) for c in args.also]
    print(f"run {args.run}\nA = {args.a}\nB = {args.b}\n")
    print(f"| table | {' | '.join(KEYS)} |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="cbsim-ablate-") as tmp:
        for i, (label, names) in enumerate(cases):
            table = args.b if names is None else write_table(Path(tmp) / str(i), swapped(ta, tb, names))
            err = validate_against(args.run, table, args.gpu)["error"]
            print(f"| {label} | " + " | ".join(f"{err[k]:+.1%}" for k in KEYS) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
