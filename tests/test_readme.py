"""The README documents the interfaces other tools read: every scenario key, every CLI command."""

from __future__ import annotations

from pathlib import Path

from sim.scenario.docs import field_docs
from sim.scenario.schema import Scenario

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_starts_with_the_two_setup_commands():
    first_block = README.split("```")[1]
    lines = [ln.split("#")[0].strip() for ln in first_block.strip().splitlines()[1:]]
    assert lines[:2] == ["make run", "make test"]


def test_readme_documents_every_scenario_key():
    missing = [d["key"] for d in field_docs(Scenario) if f"`{d['key']}`" not in README]
    assert not missing, f"README lacks scenario keys {missing}: paste field_docs_markdown(Scenario)"


def test_readme_documents_every_command():
    from sim.cli.main import app

    names = [c.name for c in app.registered_commands]
    assert len(names) >= 9
    missing = [n for n in names if f"cbsim {n}" not in README]
    assert not missing, f"README lacks commands {missing}"
