"""Every help string of every command renders as written (rich markup would eat ``[...]``)."""

from __future__ import annotations

import inspect
import re

import pytest
from typer.testing import CliRunner

from sim.cli.help_text import _parameter_infos
from sim.cli.main import app

COMMANDS = [c for c in app.registered_commands]


def _flat(text: str) -> str:
    """Help output without the panels' box characters, whitespace collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text)).strip()


def _unescaped(help_text: str) -> str:
    return re.sub(r"\s+", " ", help_text.replace("\\[", "[")).strip()


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.name for c in COMMANDS])
def test_help_renders_every_string_as_written(cmd, monkeypatch):
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 3000)  # one line per string: nothing wrapped mid-string
    out = CliRunner().invoke(app, [cmd.name, "--help"], prog_name="cbsim")
    assert out.exit_code == 0, out.output
    shown = _flat(out.output)
    doc = inspect.cleandoc(cmd.callback.__doc__ or "").split("\n\n")[0]
    assert _unescaped(doc) in shown
    helps = [info.help for info in _parameter_infos(cmd.callback) if info.help]
    assert helps, f"{cmd.name}: no option help found to check"
    for h in helps:
        assert _unescaped(h) in shown, f"cbsim {cmd.name} --help does not show {h!r} as written"


def test_brackets_survive_in_the_calibrate_help(monkeypatch):
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 3000)
    out = CliRunner().invoke(app, ["calibrate", "--help"], prog_name="cbsim")
    assert "pip install 'cbsim[gpu-data]'" in out.output
