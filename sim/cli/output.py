"""How every command prints a table: whole, or stacked when it does not fit; and ``--json`` to stdout.

Why: rich squeezes a table to the console's width (80 columns in a pipe, ``COLUMNS`` in a narrow
terminal) by cutting cells with an ellipsis, so ``cbsim plan ... | cat`` printed ``416.…`` and
``vllm…``: a number a reader cannot use and a name a script cannot match. Here a table is printed
as it is only when its natural width (every cell on one line) fits the console; otherwise each
row is printed as a block of ``column: value`` lines that the terminal may wrap but nothing cuts.

``--json``: commands that print a table also give its content as JSON on stdout, nothing else
there (the human lines go to stderr), so ``cbsim models --json | jq`` works. Commands whose
``--json`` already took a file (``plan``, ``capacity``, ``validate``, ``sweep``) take ``-`` for stdout.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def console_for(json_to_stdout: bool):
    """The console a command prints its human lines on: stderr when its JSON takes stdout."""
    from rich.console import Console

    return Console(stderr=True) if json_to_stdout else Console()


def print_json(payload: Any) -> None:
    """``payload`` as indented JSON on stdout (non-finite floats as null: JSON has no inf/nan)."""
    sys.stdout.write(json.dumps(_finite(payload), indent=2, default=str) + "\n")
    sys.stdout.flush()


def _finite(x: Any) -> Any:
    if isinstance(x, float) and x != x or isinstance(x, float) and x in (float("inf"), float("-inf")):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def cells(table) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of a rich table as plain strings."""
    headers = [_plain(c.header) for c in table.columns]
    columns = [[_plain(v) for v in c._cells] for c in table.columns]
    rows = [list(r) for r in zip(*columns)] if columns else []
    return headers, rows


def table_records(table) -> list[dict[str, str]]:
    """The rows of a rich table as ``{header: cell}`` mappings: the generic ``--json`` of a table."""
    headers, rows = cells(table)
    return [dict(zip(headers, r)) for r in rows]


def natural_width(console, table) -> int:
    """The table's width with every cell on one line."""
    from rich.measure import Measurement

    wide = console.options.update(width=10**6, max_width=10**6)  # rich clamps a measure to the width it is given
    return Measurement.get(console, wide, table).maximum


def widen_when_piped(console, table) -> None:
    """Piped or logged with no ``COLUMNS`` set: room for the table at its natural width (nothing to
    wrap to); an explicit ``COLUMNS`` is obeyed, a table wider than it stacked by :func:`show_table`."""
    import os

    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = max(console.width, natural_width(console, table))


def fits(console, table) -> bool:
    """Whether the table, every cell on one line, fits the console's width."""
    return natural_width(console, table) <= console.width


def show_table(console, table, stacked: str = "block") -> None:
    """Print ``table`` whole when it fits, else stacked so that no number or name is ever cut:
    ``stacked="block"`` gives each row a heading (its first cell) and one ``header: value`` line per
    other column; ``"line"`` gives each row one line, ``first  header value; header value; ...``
    (for long lists such as ``cbsim models``), which the terminal may wrap between words."""
    if fits(console, table):
        console.print(table)
        return
    headers, rows = cells(table)
    say = {"highlight": False, "soft_wrap": True, "markup": False}
    if table.title:
        console.print(_plain(table.title), style="bold", **say)
    for row in rows:
        if stacked == "line":
            rest = "; ".join(f"{h} {v}" for h, v in zip(headers[1:], row[1:]) if v not in ("", "-"))
            console.print(f"{row[0]}  {rest}", **say)
            continue
        console.print(f"{headers[0]}: {row[0]}" if headers[0] else row[0], style="bold", **say)
        for h, v in zip(headers[1:], row[1:]):
            console.print(f"  {h}: {v}", **say)
    if table.caption:
        console.print(_plain(table.caption), **say)


def _plain(v: Any) -> str:
    if v is None:
        return ""
    plain = getattr(v, "plain", None)
    if isinstance(plain, str):
        return plain
    if isinstance(v, str):
        from rich.text import Text

        return Text.from_markup(v).plain
    return str(v)
