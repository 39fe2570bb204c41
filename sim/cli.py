"""The ``cbsim`` command line: one typer app, one module per command in ``sim.commands``.

Every command turns a :class:`sim.errors.CbsimError` into one clear line on stderr and exit
code 2, and Ctrl-C into a one-line message and exit code 130: never a traceback.
"""

from __future__ import annotations

import sys

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


def main() -> None:
    from rich.console import Console
    from rich.markup import escape

    from sim import commands  # noqa: F401  (registers every command on `app`)
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
