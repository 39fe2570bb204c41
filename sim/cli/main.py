"""The ``cbsim`` entry point: runs the app of :mod:`sim.cli.app` with every command of ``sim/cli/`` on it.

The one place where every command's errors become what a user sees, never a traceback: a
:class:`sim.errors.CbsimError` is one clear line on stderr and exit code 2; a usage error (an
unknown option, an extra or missing argument, a bad option value) is the usual usage message and
exit code 2; Ctrl-C is a one-line message and exit code 130; a warning is one ``warning:`` line.
"""

from __future__ import annotations

import sys

import typer

# Every command module registers its command on `app` when imported: the one sorted line below.
from sim.cli import (  # noqa: F401
    calibrate,
    capacity,
    conformance,
    models,
    observe,
    plan,
    plot,
    policies,
    run,
    sweep,
    tables,
    validate,
)
from sim.cli.app import INTERRUPTED, INTERRUPTED_MESSAGE, app
from sim.cli.flag_checks import attach_checks
from sim.cli.help_text import escape_help

escape_help(app)  # after every command registered: help renders as written, brackets included
attach_checks(app)  # every numeric flag refuses inf, nan and absurd values in one line naming it

__all__ = ["INTERRUPTED", "INTERRUPTED_MESSAGE", "app", "main"]


def main() -> None:
    from rich.console import Console
    from rich.markup import escape

    from sim.errors import CbsimError

    err = Console(stderr=True, soft_wrap=True)
    try:
        with _one_line_warnings(err):
            rc = app(standalone_mode=False, prog_name="cbsim")
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
    except USAGE_ERRORS as exc:
        sys.exit(show_usage_error(exc))
    except ABORTS:  # a prompt's input ended (EOF): as Ctrl-C
        err.print(INTERRUPTED_MESSAGE, highlight=False)
        sys.exit(INTERRUPTED)


def _usage_error_classes() -> tuple[type[BaseException], ...]:
    """The exception classes a usage error can come as: typer >= 0.16 raises those of the click
    copy it bundles (``typer._click``), older typer those of the installed ``click``; both are
    caught, so the CLI works with either."""
    classes: list[type[BaseException]] = []
    try:
        from typer._click.exceptions import ClickException as bundled
        classes.append(bundled)
    except ImportError:  # a typer that uses the installed click
        pass
    try:
        import click
        classes.append(click.exceptions.ClickException)
    except ImportError:
        pass
    return tuple(dict.fromkeys(classes))


def _abort_classes() -> tuple[type[BaseException], ...]:
    classes: list[type[BaseException]] = [typer.Abort]
    try:
        import click
        classes.append(click.exceptions.Abort)
    except ImportError:
        pass
    return tuple(dict.fromkeys(classes))


USAGE_ERRORS = _usage_error_classes()
ABORTS = _abort_classes()


def show_usage_error(exc: BaseException) -> int:
    """Print a usage error as typer does when it runs standalone (the command's usage line, the
    --help hint, the message) and return its exit code (2 for usage errors, as click)."""
    code = getattr(exc, "exit_code", 2)
    if type(exc).__name__ == "NoArgsIsHelpError":  # bare `cbsim` or a group without a command: the help
        exc.show()
        return code
    try:
        from typer import rich_utils

        rich_utils.rich_format_error(exc)
    except Exception:  # an older typer without rich_utils, or without rich: the plain click form
        exc.show()
    return code


class _one_line_warnings:
    """Show a warning as one line ``warning: MESSAGE`` on stderr (Python's default prints the
    source file and line of the warn call: noise to a user); restored on exit."""

    def __init__(self, console) -> None:
        self.console = console

    def __enter__(self):
        import warnings

        from rich.markup import escape

        self._saved = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            self.console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False)

        warnings.showwarning = show
        return self

    def __exit__(self, *exc):
        import warnings

        warnings.showwarning = self._saved
        return False
