"""The README and docs/ document the interfaces other tools read: every scenario key (docs/scenario-keys.md,
generated), every CLI command (the README's command table)."""

from __future__ import annotations

from pathlib import Path

from sim.scenario.docs import field_docs
from sim.scenario.schema import Scenario

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_starts_with_the_two_setup_commands():
    first_block = README.split("```")[1]
    lines = [ln.split("#")[0].strip() for ln in first_block.strip().splitlines()[1:]]
    assert lines[:2] == ["make run", "make test"]


def test_the_key_reference_documents_every_scenario_key():
    """docs/scenario-keys.md is generated from the schema, so every key is in it with its type and
    default; after a schema change `python -m sim.scenario.docs` rewrites it."""
    from sim.scenario.docs import KEY_PAGE, key_reference_page

    page = (ROOT / KEY_PAGE).read_text()
    missing = [d["key"] for d in field_docs(Scenario) if f"`{d['key']}`" not in page]
    assert not missing, f"{KEY_PAGE} lacks scenario keys {missing}: run python -m sim.scenario.docs"
    assert page == key_reference_page(), f"{KEY_PAGE} is out of date: run python -m sim.scenario.docs"
    assert "docs/scenario-keys.md" in README


def test_readme_documents_every_command():
    from sim.cli.main import app

    names = [c.name for c in app.registered_commands]
    assert len(names) >= 9
    missing = [n for n in names if f"cbsim {n}" not in README]
    assert not missing, f"README lacks commands {missing}"
