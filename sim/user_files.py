"""Reading a file a user hands over: one clear line naming the file (and the field), never a crash.

Why a module of its own: every command that reads a user's file (golden logs for
``conformance``, step logs for ``calibrate --from-steplog`` and ``validate --against``, latency
tables, results folders for ``plot``) meets the same failures: the path is missing or a folder,
the bytes are not UTF-8 text, the text is not JSON, JSON nested thousands deep or holding a
5000-digit number, and a document whose shape is wrong (a number where an object belongs, a
string where an integer belongs). Each reader calls :func:`read_json` (or :func:`read_text`)
and reads fields through :class:`Fields`, so each of those failures is one
:class:`~sim.errors.CbsimError` that says which file, which field, and what was expected.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sim.errors import CbsimError


def read_text(path: str | Path, what: str, hint: str = "") -> str:
    """The text of a UTF-8 file. ``what`` names the kind ("step log"), ``hint`` says what to give."""
    p = Path(path)
    more = f"; {hint}" if hint else ""
    if not p.exists():
        raise CbsimError(f"{what} {str(path)!r} does not exist{more}")
    if p.is_dir():
        raise CbsimError(f"{what} {str(path)!r} is a folder, not a file{more}")
    try:
        data = p.read_bytes()
    except OSError as exc:  # permissions, a broken link, an I/O error
        raise CbsimError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CbsimError(f"{path}: not a UTF-8 text file (undecodable byte at offset {exc.start}); "
                         f"expected a {what}{more}") from None


def read_json(path: str | Path, what: str, hint: str = "") -> Any:
    """The parsed JSON of a file (any shape: check it with :class:`Fields`)."""
    text = read_text(path, what, hint)
    more = f"; {hint}" if hint else ""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CbsimError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg}); expected a {what}"
                         f"{more}") from None
    except RecursionError:
        raise CbsimError(f"{path}: nested too deeply to read (thousands of levels of [ or {{); expected a "
                         f"{what}{more}") from None
    except ValueError as exc:  # a number Python refuses to convert (more than 4300 digits)
        raise CbsimError(f"{path}: unreadable value: {str(exc).split(';')[0]}; expected a {what}") from None


_WORDS = {float: "a number", int: "an integer", str: "a string", bool: "true or false",
          dict: "a JSON object", list: "a list"}


def short(value: Any, limit: int = 60) -> str:
    """A value as an error message shows it, cut to ``limit`` characters (never rendered whole)."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a list" if len(value) > 8 else _cut(repr(value[:8]), limit)
    if isinstance(value, str):
        return _cut(repr(value[: limit + 2]), limit)
    return _cut(repr(value), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Fields:
    """Typed access to a JSON document whose errors name the file and the key path.

    ``get(obj, key, where, kind)``: ``obj[key]`` if it is of ``kind`` (``float`` accepts finite
    numbers and returns a float, ``int`` refuses booleans and fractions; ``minimum`` bounds
    numbers), else a :class:`CbsimError` such as ``run.json: config.block_size: expected an
    integer, got 'x'``. ``default`` (when given) is returned for a missing key or a null.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def fail(self, where: str, msg: str) -> CbsimError:
        return CbsimError(f"{self.path}: {where}: {msg}" if where else f"{self.path}: {msg}")

    def get(self, obj: Any, key: str, where: str, kind: type | tuple, default: Any = ...,
            minimum: float | None = None) -> Any:
        at = f"{where}.{key}" if where else key
        if not isinstance(obj, dict):
            raise self.fail(where or "the file", f"expected a JSON object, got {short(obj)}")
        if key not in obj or (obj[key] is None and default is not ...):
            if default is not ...:
                return default
            raise self.fail(at, "required key is missing")
        return self.check(obj[key], at, kind, minimum)

    def check(self, value: Any, at: str, kind: type | tuple, minimum: float | None = None) -> Any:
        """``value`` if it is of ``kind`` (and >= ``minimum``), else the error naming ``at``."""
        if kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(kind, tuple):
            ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in kind)
        else:
            ok = isinstance(value, kind)
        if not ok:
            kinds = kind if isinstance(kind, tuple) else (kind,)
            word = " or ".join(_WORDS.get(k, getattr(k, "__name__", str(k))) for k in kinds)
            raise self.fail(at, f"expected {word}, got {short(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(at, f"must be >= {minimum:g}, got {short(value)}")
        return float(value) if kind is float else value

    def items(self, obj: Any, at: str, kind: type | tuple = object) -> list[tuple[str, Any]]:
        """The entries of a JSON object at ``at`` (each value checked against ``kind``)."""
        self.check(obj, at, dict)
        return [(k, self.check(v, f"{at}.{k}", kind) if kind is not object else v) for k, v in obj.items()]

    def entries(self, obj: Any, at: str, kind: type | tuple = object) -> list[Any]:
        """The entries of a JSON list at ``at`` (each checked against ``kind``)."""
        self.check(obj, at, list)
        return [self.check(v, f"{at}[{i}]", kind) if kind is not object else v for i, v in enumerate(obj)]
