"""Every numeric flag of every command refuses non-finite and absurd values in one line naming it.

Why: typer turns ``--target-rate inf`` into a float infinity and hands it on; deep in the capacity
search it became ``OverflowError: cannot convert float infinity to integer``, a traceback. Checks
scattered through the commands caught some flags and not others. Here each ``int`` or ``float``
option of every registered command gets one check, attached as its click callback when the app is
assembled (:func:`attach_checks`, called from ``sim/cli/main.py``), so a command added later is
covered without a line of its own: the value must be finite and inside the flag's bounds
(:data:`BOUNDS`; an unlisted flag gets :data:`DEFAULT_BOUNDS`). A refusal is a
:class:`sim.errors.CbsimError`: ``error: --target-rate: inf is not a finite number; ...``, exit 2.
"""

from __future__ import annotations

import inspect
import math
import typing
from dataclasses import dataclass

from sim.errors import CbsimError


@dataclass(frozen=True, slots=True)
class Bounds:
    """``lo < x`` (``lo <= x`` with ``lo_inclusive``) and ``x <= hi``; ``unit`` says what the value counts."""

    lo: float
    hi: float
    unit: str
    lo_inclusive: bool = True
    example: str = "1"

    def refusal(self, value: float | int) -> str | None:
        shown = str(value) if isinstance(value, int) else f"{value:g}"
        if self.lo_inclusive and value < self.lo or not self.lo_inclusive and value <= self.lo:
            low = f"at least {self.lo:g}" if self.lo_inclusive else f"above {self.lo:g}"
            return f"{shown} is too small: give {low} ({self.unit})"
        if value > self.hi:
            return f"{shown} is absurdly large: give at most {self.hi:,g} ({self.unit})"
        return None


SEED = Bounds(0, 2**63 - 1, "a seed: a non-negative integer below 2**63")
TOKENS = Bounds(1, 2**24, "tokens")
# The limits a sane run stays inside: far beyond any real deployment, short of numbers that overflow
# a search (a rate of 1e300 req/s asks for more replicas than atoms) or a clock.
BOUNDS: dict[str, Bounds] = {
    "--target-rate": Bounds(0, 1e6, "requests per second", lo_inclusive=False, example="20"),
    "--tolerance": Bounds(0, 1, "a fraction: 0.02 is 2 %", lo_inclusive=False, example="0.02"),
    "--target-concurrency": Bounds(1, 10_000_000, "closed-loop clients", example="32"),
    "--max-replicas": Bounds(1, 100_000, "replicas"),
    "--seeds": Bounds(1, 1000, "workload seeds judged at every probe", example="3"),
    "--workers": Bounds(1, 4096, "parallel processes"),
    "--tp": Bounds(1, 1024, "GPUs per tensor-parallel group"),
    "--data-parallel": Bounds(1, 1024, "data-parallel ranks"),
    "--block-size": Bounds(1, 4096, "tokens per KV block"),
    "--max-num-batched-tokens": TOKENS,
    "--max-model-len": TOKENS,
    "--max-num-seqs": Bounds(1, 2**20, "sequences"),
    "--gpu-memory-utilization": Bounds(0, 1, "a fraction of GPU memory", lo_inclusive=False, example="0.92"),
    "--rounds": Bounds(1, 10_000, "timed runs per grid point"),
    "--heldout-batches": Bounds(0, 100_000, "batches"),
    "--threads": Bounds(1, 4096, "threads"),
    "--time-budget": Bounds(0, 7 * 86_400, "seconds", lo_inclusive=False, example="600"),
    "--heldout": Bounds(0, 1, "a fraction of the steps", lo_inclusive=False, example="0.2"),
    "--seed": SEED,
    "--content-seed": SEED,
    "--read-timeout": Bounds(0, 86_400, "seconds", lo_inclusive=False, example="120"),
    "--allreduce-gbps": Bounds(0, 1e6, "GB/s", lo_inclusive=False, example="400"),
    "--max-requests": Bounds(1, 10_000_000, "requests"),
}
DEFAULT_BOUNDS = Bounds(-1e15, 1e15, "a number")

_CHECKED = "__cbsim_flags_checked__"


def check_value(flag: str, value):
    """``value`` if it is a usable value for ``flag`` (None: not given), else a :class:`CbsimError`."""
    if value is None or isinstance(value, bool):
        return value
    for v in value if isinstance(value, list | tuple) else (value,):
        if isinstance(v, float) and not math.isfinite(v):
            b = BOUNDS.get(flag, DEFAULT_BOUNDS)
            raise CbsimError(f"{flag}: {v} is not a finite number; give a number such as {flag} {b.example} "
                             f"({b.unit})")
        why = BOUNDS.get(flag, DEFAULT_BOUNDS).refusal(v)
        if why:
            raise CbsimError(f"{flag}: {why}")
    return value


def attach_checks(app) -> None:
    """Give every ``int``/``float`` option of every command on ``app`` the check of its flag; idempotent."""
    for cmd in app.registered_commands:
        fn = cmd.callback
        if fn is None or getattr(fn, _CHECKED, False):
            continue
        hints = typing.get_type_hints(fn)
        for name, info in _named_infos(fn):
            if _numeric(hints.get(name)) and _flag(name, info):
                info.callback = _chained(info.callback, _flag(name, info))
        setattr(fn, _CHECKED, True)


def numeric_flags(app) -> dict[str, list[str]]:
    """Every command's numeric flags (what :func:`attach_checks` covers), for tests and docs."""
    out: dict[str, list[str]] = {}
    for cmd in app.registered_commands:
        hints = typing.get_type_hints(cmd.callback)
        out[cmd.name] = [_flag(name, info) for name, info in _named_infos(cmd.callback)
                         if _numeric(hints.get(name)) and _flag(name, info)]
    return out


def _flag(name: str, info) -> str | None:
    """The ``--flag`` of an option (None for an argument): its declared names, or, inside ``Annotated``
    (where typer reads ``typer.Option("--seeds", ...)``'s first argument as the name), that argument."""
    from typer.models import ArgumentInfo

    if isinstance(info, ArgumentInfo):
        return None
    decls = [d for d in (info.param_decls or ()) if isinstance(d, str)]
    if not decls and isinstance(info.default, str) and info.default.startswith("-"):
        decls = [info.default]
    return next((d for d in decls if d.startswith("--")), decls[0] if decls else f"--{name.replace('_', '-')}")


def _named_infos(fn):
    """(parameter name, ParameterInfo) pairs of ``fn``."""
    from typer.models import ParameterInfo

    hints = typing.get_type_hints(fn, include_extras=True)
    for name, param in inspect.signature(fn).parameters.items():
        found = param.default if isinstance(param.default, ParameterInfo) else None
        hint = hints.get(name)
        if found is None and typing.get_origin(hint) is typing.Annotated:
            found = next((a for a in typing.get_args(hint)[1:] if isinstance(a, ParameterInfo)), None)
        if found is not None:
            yield name, found


def _numeric(hint) -> bool:
    if hint in (int, float):
        return True
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return bool(args) and all(a in (int, float) for a in args) if typing.get_origin(hint) is not list else False


def _chained(previous, flag: str):
    def check(value):
        value = check_value(flag, value)
        return previous(value) if previous is not None else value

    return check
