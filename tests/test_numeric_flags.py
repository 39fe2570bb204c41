"""Every numeric flag of every command refuses non-finite and absurd values in one line naming it
(issue 28, item 5): checked for every flag :func:`sim.cli.flag_checks.numeric_flags` finds, so a flag
added later is covered too; the refusal comes before any work (no scenario is even read)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli.flag_checks import BOUNDS, DEFAULT_BOUNDS, numeric_flags
from sim.cli.main import app
from tests.test_bad_input_cli import one_line_error

REPO = Path(__file__).resolve().parents[1]
# arguments that get each command past its required ones (never read: the flag is refused first)
REQUIRED = {"run": ["X.yaml"], "sweep": ["X.yaml"], "capacity": ["X.yaml"], "plan": ["X.yaml"],
            "observe": ["X.yaml", "--url", "http://127.0.0.1:9", "--out", "r.json"], "plot": ["DIR"],
            "calibrate": ["--out", "T"], "validate": [], "conformance": ["F.json"]}
FLAGS = [(cmd, flag) for cmd, flags in numeric_flags(app).items() for flag in flags]


def test_the_numeric_flags_are_found():
    found = dict(numeric_flags(app))
    assert "--target-rate" in found["plan"] and "--tolerance" in found["capacity"]
    assert "--read-timeout" in found["observe"] and "--seed" in found["calibrate"]
    assert "--seeds" in found["plan"] and "--seeds" in found["capacity"]  # an Annotated option too
    assert len(FLAGS) >= 20


@pytest.mark.parametrize("cmd, flag", FLAGS, ids=[f"{c}{f}" for c, f in FLAGS])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e300"])
def test_every_numeric_flag_refuses_non_finite_and_absurd_values(capsys, tmp_path, cmd, flag, value):
    is_int = _is_int(cmd, flag)
    if is_int and value != "1e300":  # click refuses 'inf' for an integer itself: its usage message, exit 2
        assert flag in _usage_error(capsys, cmd, [*REQUIRED.get(cmd, []), flag, value])
        return
    msg = one_line_error(capsys, cmd, *REQUIRED.get(cmd, []), flag, str(10**300) if is_int else value)
    assert msg.startswith(f"{flag}: ")
    assert "not a finite number" in msg or "absurdly large" in msg or "too small" in msg


def test_the_bounds_admit_the_defaults_and_refuse_just_outside():
    for flag, b in BOUNDS.items():
        assert b.refusal(float(b.example)) is None, flag
        assert b.refusal(b.hi * 2 + 1) is not None and b.refusal(b.lo - 1) is not None, flag
    assert DEFAULT_BOUNDS.refusal(0) is None


def test_plan_target_rate_inf_exits_2_with_one_line():
    """The issue's own command, as a user runs it (a fresh process, the installed entry point)."""
    proc = subprocess.run([sys.executable, "-c", "from sim.cli.main import main; main()", "plan",
                           str(REPO / "scenarios/quickstart.yaml"), "--target-rate", "inf"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: --target-rate: inf is not a finite number; give a number such as --target-rate 20 "
        "(requests per second)"]


def _is_int(cmd: str, flag: str) -> bool:
    import typing

    from sim.cli.flag_checks import _flag, _named_infos

    fn = next(c.callback for c in app.registered_commands if c.name == cmd)
    hints = typing.get_type_hints(fn)
    for name, info in _named_infos(fn):
        if _flag(name, info) == flag:
            args = [a for a in (typing.get_args(hints[name]) or (hints[name],)) if a is not type(None)]
            return args == [int]
    raise AssertionError(flag)


def _usage_error(capsys, cmd, args) -> str:
    from tests.test_bad_input_cli import run_cli

    code, out, err = run_cli(capsys, cmd, *args)
    assert code == 2 and "Traceback" not in out + err
    return out + err
