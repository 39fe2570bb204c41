"""The one typer app every ``cbsim`` command registers on.

Why a module of its own: each command module (``sim/cli/run.py``, ``plot.py``, ...) decorates its
function with ``@app.command``, and :mod:`sim.cli.main` imports every command module to run the
app. With the app here, commands depend on this module only and the entry point on both: no
module imports one that imports it back.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="cbsim",
    help="Simulate LLM serving: schedulers, paged KV memory, latency from real GPU measurements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

INTERRUPTED = 130  # the shell's code for a process ended by SIGINT (128 + 2)
INTERRUPTED_MESSAGE = "interrupted: stopped by Ctrl-C; nothing half-written was left behind"
