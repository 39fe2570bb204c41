"""Every shipped kernel-db table is what its own recorded command builds today.

Each ``calib/tables/kernel-db-*/metadata.json`` records the command that built it
(``provenance.command``, written by ``cbsim calibrate --from-kernel-db``; the same command is the
table's row in ``calib/tables/README.md``). When the composition changes (a new term in
``calib/sources/kernel_db.py``) and nobody rebuilds the shipped tables, they silently stop being what
their command builds: the issue-26 DRAM floor at the database's own rate moved 101-134 decode rows of
each table by up to -14 % before they were rebuilt. The test runs every recorded command verbatim in a
scratch folder (the whole grid: about 3 s of CPU for all four, the database is loaded once) and
compares what it writes with the committed folder: the same rows, each value within a relative 1e-9
(``table.csv`` stores ``repr`` of the float, so on one platform they are bit-equal; the tolerance only
absorbs a libm's last bit elsewhere, six orders below the smallest change a composition term makes),
and the same metadata except ``date`` and ``corpus_error`` (stamped afterwards by
``bench/silicon_accuracy.py --stamp``).
"""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import require_aic

REPO = Path(__file__).resolve().parents[1]
TABLES = REPO / "calib" / "tables"
REL_TOL = 1e-9
# keys of metadata.json a rebuild does not reproduce: when it ran, and the corpus error stamped later
NOT_REBUILT = ("date", "corpus_error")


def kernel_db_tables() -> list[Path]:
    return sorted(p.parent for p in TABLES.glob("*/metadata.json")
                  if json.loads(p.read_text(encoding="utf-8")).get("source") == "kernel_db")


def rows(folder: Path) -> dict[tuple[str, str, str], float]:
    with (folder / "table.csv").open(encoding="utf-8") as fh:
        return {(r["component"], r["x"], r["y"]): float(r["seconds"]) for r in csv.DictReader(fh)}


def table_differences(committed: Path, rebuilt: Path, rel_tol: float = REL_TOL) -> list[str]:
    """What differs between two table folders: rows present in one only, values beyond ``rel_tol``,
    and metadata keys other than :data:`NOT_REBUILT`; empty when they match."""
    a, b = rows(committed), rows(rebuilt)
    out = [f"row {k} only in the committed table" for k in sorted(a.keys() - b.keys())]
    out += [f"row {k} only in the rebuilt table" for k in sorted(b.keys() - a.keys())]
    out += [f"{k}: committed {a[k]!r}, rebuilt {b[k]!r} (rel {b[k] / a[k] - 1:+.2e})" if a[k] else
            f"{k}: committed {a[k]!r}, rebuilt {b[k]!r}"
            for k in sorted(a.keys() & b.keys()) if not math.isclose(a[k], b[k], rel_tol=rel_tol, abs_tol=0.0)]
    ma, mb = (json.loads((f / "metadata.json").read_text(encoding="utf-8")) for f in (committed, rebuilt))
    for key in sorted((ma.keys() | mb.keys()) - set(NOT_REBUILT)):
        if ma.get(key) != mb.get(key):
            out.append(f"metadata.json {key!r} differs")
    return out


def readme_commands() -> dict[str, str]:
    """The rebuild command of each table in calib/tables/README.md's table, by folder."""
    text = (TABLES / "README.md").read_text(encoding="utf-8")
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([\w.-]+)` \|.*\| `(cbsim calibrate [^`]+)` \|$",
                                                         text, flags=re.M)}


def test_every_shipped_kernel_db_table_is_found_and_states_its_command():
    tables = kernel_db_tables()
    assert {t.name for t in tables} >= {"kernel-db-llama-3-8b-h200-tp1", "kernel-db-llama-3-8b-h100-sxm-tp1",
                                        "kernel-db-llama-3-70b-h200-tp2",
                                        "kernel-db-llama-3-8b-eagle3-head-h100-sxm-tp1"}
    documented = readme_commands()
    for t in tables:
        prov = json.loads((t / "metadata.json").read_text(encoding="utf-8"))["provenance"]
        words = shlex.split(prov["command"])
        assert words[:3] == ["cbsim", "calibrate", "--from-kernel-db"], (t.name, prov["command"])
        assert words[words.index("--out") + 1] == f"calib/tables/{t.name}", (t.name, prov["command"])
        assert documented.get(t.name) == prov["command"], (t.name, "calib/tables/README.md shows another command")


def test_table_differences_sees_one_row_moved_by_a_millionth(tmp_path):
    """The comparison is not blind: one decode row of a shipped table moved by 1e-6 relative (a
    thousand times finer than any composition change so far) and a metadata key changed are reported."""
    import shutil

    src = TABLES / "kernel-db-llama-3-8b-h200-tp1"
    copy = tmp_path / src.name
    shutil.copytree(src, copy)
    assert table_differences(src, copy) == []
    lines = (copy / "table.csv").read_text(encoding="utf-8").splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("decode_attn,128,4096,"))
    value = float(lines[i].rsplit(",", 1)[1])
    lines[i] = f"decode_attn,128,4096,{value * (1 + 1e-6)!r}"
    (copy / "table.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    meta = json.loads((copy / "metadata.json").read_text(encoding="utf-8"))
    meta["date"] = "2000-01-01T00:00:00+00:00"  # not compared
    meta["prefill_attn_launch_s"] *= 2
    (copy / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    diffs = table_differences(src, copy)
    assert len(diffs) == 2, diffs
    assert diffs[0].startswith("('decode_attn', '128', '4096')") and diffs[0].endswith("(rel +1.00e-06)")
    assert diffs[1] == "metadata.json 'prefill_attn_launch_s' differs"


@pytest.mark.parametrize("name", [t.name for t in kernel_db_tables()])
def test_the_shipped_table_is_what_its_recorded_command_builds(name, tmp_path, monkeypatch):
    require_aic()  # the kernel database is the optional extra cbsim[gpu-data]: fails on CI without it
    from typer.testing import CliRunner

    from calib.sources.kernel_db import package_version
    from sim.cli.main import app

    committed = TABLES / name
    meta = json.loads((committed / "metadata.json").read_text(encoding="utf-8"))
    assert meta["provenance"]["package_version"] == package_version(), (
        "the table was built with another aiconfigurator-core than the one installed; install the pinned "
        "one (pip install -e '.[gpu-data]')")
    words = shlex.split(meta["provenance"]["command"])
    monkeypatch.chdir(tmp_path)  # the command verbatim: its relative --out lands in the scratch folder
    res = CliRunner().invoke(app, words[1:], terminal_width=200)
    assert res.exit_code == 0, res.output
    diffs = table_differences(committed, tmp_path / "calib" / "tables" / name)
    assert not diffs, (f"{name} is not what its command builds ({len(diffs)} differences; rebuild it from the "
                       f"repository root with: {meta['provenance']['command']}):\n" + "\n".join(diffs[:20]))


def test_the_recorded_command_keeps_every_option_given_and_drops_the_defaults():
    from sim.cli.calibrate import kernel_db_command

    common = dict(tp=1, dtype=None, engine="vllm", engine_version=None, block_size=16, limits={}, data_parallel=1,
                  expert_parallel=False, draft=None, draft_vocab_size=None, allreduce="custom")
    assert kernel_db_command(Path("t"), model="llama-3-8b", gpu="h200", **common) == (
        "cbsim calibrate --from-kernel-db --gpu h200 --model llama-3-8b --out t")
    cmd = kernel_db_command(Path("my tables/ds"), model="deepseek-ai/DeepSeek-V3", gpu="h200",
                            **{**common, "tp": 1, "data_parallel": 8, "expert_parallel": True, "dtype": "fp8",
                               "engine": "sglang", "block_size": 64, "limits": {"max_num_seqs": 256}})
    assert shlex.split(cmd) == ["cbsim", "calibrate", "--from-kernel-db", "--gpu", "h200", "--model",
                                "deepseek-ai/DeepSeek-V3", "--data-parallel", "8", "--dtype", "fp8", "--engine",
                                "sglang", "--block-size", "64", "--max-num-seqs", "256", "--expert-parallel",
                                "--out", "my tables/ds"]
