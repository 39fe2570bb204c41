"""``cbsim conformance FILE.json ...``: replay vLLM golden step logs through ``vllm-v1``.

Prints ``NAME: matched N/N steps`` per file and, at the first step that differs, what vLLM did
and what we did. Exits 0 only if every step of every file matches (1 otherwise; 2 for a file
that cannot be read).
"""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app


@app.command("conformance")
def conformance_cmd(
    files: list[Path] = typer.Argument(
        ..., help="golden step logs recorded from vLLM's V1 scheduler (e.g. reference/oracle/*.json)"
    ),
):
    """Check that vllm-v1 makes vLLM's own scheduling decisions, step by step."""
    from sim.recorded.conformance import check_log

    all_ok = True
    for path in files:
        result = check_log(path)
        typer.secho(result.summary(), fg="green" if result.ok else "red", bold=not result.ok)
        if not result.ok:
            all_ok = False
            typer.echo(result.divergence.describe())
    if not all_ok:
        # SystemExit, not typer.Exit: the CLI runs click with standalone_mode=False, which
        # returns a typer.Exit's code instead of exiting with it
        raise SystemExit(1)
