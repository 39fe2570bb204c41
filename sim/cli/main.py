"""The ``cbsim`` entry point: runs the app of :mod:`sim.cli.app` with every command of ``sim/cli/`` on it.

Every command turns a :class:`sim.errors.CbsimError` into one clear line on stderr and exit
code 2, and Ctrl-C into a one-line message and exit code 130: never a traceback.
"""

from __future__ import annotations

import sys

import typer

# Every command module registers its command on `app` when imported: the one sorted line below.
from sim.cli import calibrate, capacity, conformance, plan, plot, policies, run, sweep, validate  # noqa: F401
from sim.cli.app import INTERRUPTED, INTERRUPTED_MESSAGE, app

__all__ = ["INTERRUPTED", "INTERRUPTED_MESSAGE", "app", "main"]


def main() -> None:
    from rich.console import Console
    from rich.markup import escape

    from sim.errors import CbsimError

    err = Console(stderr=True, soft_wrap=True)
    try:
        rc = app(standalone_mode=False)
        if rc == INTERRUPTED:  # typer turns Ctrl-C inside a command into exit code 130, silently
            raise KeyboardInterrupt
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except CbsimError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print(INTERRUPTED_MESSAGE, highlight=False)
        sys.exit(INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors and aborts
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            err.print(INTERRUPTED_MESSAGE, highlight=False)
            sys.exit(INTERRUPTED)
        raise
