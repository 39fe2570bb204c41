"""Help strings shown as written: every command's and option's help is escaped for rich markup.

Why: typer renders help through rich, which reads ``[...]`` as a style tag, so the help of
``cbsim calibrate --from-kernel-db`` printed ``pip install 'cbsim')`` for
``pip install 'cbsim[gpu-data]'`` and ``[--policy LABEL]`` lost its brackets. The help strings of
``sim/cli/`` are prose and commands to copy, never markup: :func:`escape_help` escapes them once,
after every command module has registered (``sim/cli/main.py``), and tests/test_help_text.py checks
that each one renders as written.
"""

from __future__ import annotations

import inspect
import typing

_ESCAPED = "__cbsim_help_escaped__"


def escape_help(app) -> None:
    """Escape rich markup in the help of every command registered on ``app`` and of its parameters
    (typer's ``Option``/``Argument`` defaults, plain or inside ``Annotated``); idempotent."""
    from rich.markup import escape

    for cmd in app.registered_commands:
        fn = cmd.callback
        if fn is None or getattr(fn, _ESCAPED, False):
            continue
        if cmd.help:
            cmd.help = escape(cmd.help)
        elif fn.__doc__:
            cmd.help = escape(inspect.cleandoc(fn.__doc__))
        for info in _parameter_infos(fn):
            if getattr(info, "help", None):
                info.help = escape(info.help)
        setattr(fn, _ESCAPED, True)


def _parameter_infos(fn):
    """typer's ParameterInfo objects of ``fn``'s parameters, each once (an ``Annotated`` alias shared
    by several commands, such as ``search_options.SetOpt``, is the same object everywhere)."""
    from typer.models import ParameterInfo

    seen: set[int] = set()
    hints = typing.get_type_hints(fn, include_extras=True)
    for name, param in inspect.signature(fn).parameters.items():
        candidates = [param.default]
        hint = hints.get(name)
        if typing.get_origin(hint) is typing.Annotated:
            candidates += list(typing.get_args(hint)[1:])
        for c in candidates:
            if isinstance(c, ParameterInfo) and id(c) not in seen:
                seen.add(id(c))
                yield c
