"""``cbsim plot RESULTS_DIR``: redraw every figure of a saved run from its files, without re-running.

A results folder holds everything the plots need (``requests.parquet``, ``steps.parquet``,
``summary.json`` with the per-policy facts, ``scenario.yaml``), so a changed plot style or a
deleted PNG costs a redraw, not a simulation.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app


@app.command("plot")
def plot_cmd(
    results_dir: Path = typer.Argument(..., help="a results folder written by `cbsim run`"),
    out: Path = typer.Option(None, "--out", "-o", help="where to write the PNGs (default: RESULTS_DIR)"),
    max_requests: int = typer.Option(60, "--max-requests", min=1,
                                     help="draw the per-request timeline only up to this many requests per policy"),
):
    """Regenerate the PNG plots of a results folder (utilization, KV, latency CDFs; timeline up to --max-requests; paged vs contiguous when both kinds ran; capacity when `cbsim run` measured saturated throughputs)."""
    from rich.console import Console

    from sim.errors import CbsimError
    from sim.plots import write_all
    from sim.results import RunResult

    if not results_dir.is_dir():
        raise CbsimError(f"{results_dir} is not a folder: give the results folder of a run "
                         "(`cbsim run SCENARIO --out DIR` writes one)")
    from sim.outputs import check_folder

    check_folder(out or results_dir, "the plots")  # a file, an unwritable folder: refused before reading
    result = RunResult.load(results_dir)
    written = write_all(result, out or results_dir, max_requests=max_requests)
    console = Console()
    for path in written:
        console.print(f"wrote {path}", highlight=False)
    from sim.plots import skipped

    for line in skipped(result, max_requests):
        console.print(line, highlight=False, soft_wrap=True)
