"""Shared test fixtures.

Tests that read ``../shared/reference`` use the ``shared_ref`` fixture: without the folder they
skip on a developer's machine and *fail* in CI (CI=true), where the folder must be present.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_REF = REPO.parent / "shared" / "reference"


def require_shared(sub: str = "") -> Path:
    path = SHARED_REF / sub
    if not path.exists():
        msg = f"{path} is missing: tests that replay vLLM's reference data need ../shared/reference"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture
def shared_ref() -> Path:
    return require_shared()


@pytest.fixture
def repo() -> Path:
    return REPO
