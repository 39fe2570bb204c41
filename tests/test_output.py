"""Readable output when piped or narrow (issue 28, item 2): a table is printed whole when it fits and
stacked otherwise, never with a cell cut by an ellipsis; ``--json`` gives the same content."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from sim.cli.output import fits, show_table, table_records

REPO = Path(__file__).resolve().parents[1]


def _table() -> Table:
    t = Table(title="capacity: 20 req/s on h200", header_style="bold")
    for c in ("policy", "replicas", "cost per 1M req", "offered/achieved", "p99 TTFT s"):
        t.add_column(c, justify="right")
    t.add_row("vllm-v1-with-a-long-label", "4", "388.89", "19.9 / 19.6", "1.02")
    t.add_row("colocated, cheapest", "416.123456", "1,234,567.89", "19.7 / 19.8", "0.718")
    return t


def _render(width: int, stacked: str = "block") -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False)
    show_table(console, _table(), stacked=stacked)
    return buf.getvalue()


@pytest.mark.parametrize("width", [40, 60, 80])
@pytest.mark.parametrize("stacked", ["block", "line"])
def test_a_table_too_wide_is_stacked_with_every_cell_whole(width, stacked):
    out = _render(width, stacked)
    assert "…" not in out
    flat = re.sub(r"\s+", " ", out)
    for row in table_records(_table()):
        for header, cell in row.items():
            assert cell in flat
            if stacked == "block":
                assert f"{header}: {cell}" in flat


def test_a_table_that_fits_is_printed_as_a_table():
    out = _render(200)
    assert out.count("┏") == 1 and "416.123456 │" in out  # drawn as a table, the cell whole
    assert fits(Console(width=200), _table()) and not fits(Console(width=60), _table())


def test_the_run_table_piped_at_60_columns(tmp_path):
    proc = _cbsim("run", "scenarios/seed_toy.yaml", "--out", str(tmp_path / "toy"), "--no-plots", "-q",
                  columns="60")
    assert "…" not in proc.stdout
    assert re.search(r"^metric: finished / .* / unfinished$", proc.stdout, re.M)  # stacked: a row a block
    assert re.search(r"^  static: 6 / 0 / 0", proc.stdout, re.M)


def test_plan_piped_keeps_numbers_and_names_whole():
    """The issue's `cbsim plan scenarios/capacity.yaml --target-rate 20 | cat`, one policy at a small size:
    piped with no COLUMNS the table is printed at its natural width, at COLUMNS=60 stacked; never cut."""
    args = ["plan", "scenarios/capacity.yaml", "--target-rate", "20", "--policy", "vllm-v1",
            "--set", "workload.num_requests=100", "--seeds", "1"]
    piped = _cbsim(*args)
    narrow = _cbsim(*args, columns="60")
    plan = json.loads(_cbsim(*args, "--json", "-").stdout)["policies"]["vllm-v1"]
    for out in (piped.stdout, narrow.stdout):
        assert "…" not in out
    row = next(ln for ln in piped.stdout.splitlines() if "│ vllm-v1" in ln)
    assert f"│ {plan['replicas']} " in row.replace("  ", " ") or f" {plan['replicas']} │" in row
    assert re.search(r"^policy: vllm-v1$", narrow.stdout, re.M)
    assert f"  replicas: {plan['replicas']}\n" in narrow.stdout
    assert re.search(r"^  cost per 1M req: [\d,]+\.\d\d$", narrow.stdout, re.M)


def _cbsim(*args, columns: str | None = None):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    if columns:
        env["COLUMNS"] = columns
    proc = subprocess.run([sys.executable, "-c", "from sim.cli.main import main; main()", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_json_flags_print_json_alone_on_stdout(tmp_path):
    run = json.loads(_cbsim("run", "scenarios/seed_toy.yaml", "--out", str(tmp_path / "toy"), "--json").stdout)
    saved = json.loads((tmp_path / "toy" / "summary.json").read_text())["policies"]
    assert run["policies"]["orca"]["steps"] == saved["orca"]["steps"] == 8
    assert run["policies"]["orca"]["prefix_reuse"] == saved["orca"]["prefix_reuse"]
    policies = json.loads(_cbsim("policies", "--json").stdout)
    assert policies["vllm-v1"]["knobs"]["scheduling_policy"]["default"] == "fcfs"
    tables = json.loads(_cbsim("tables", "--json").stdout)
    assert {t["name"] for t in tables} >= {"kernel-db-llama-3-8b-h200-tp1"}
