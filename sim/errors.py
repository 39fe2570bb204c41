"""User-facing errors: the CLI prints their message on one line and exits non-zero.

Raise :class:`CbsimError` (or a subclass) for anything the user can fix: bad scenario values,
missing files, a model that does not fit. The message names the field and the fix.
"""

from __future__ import annotations

import difflib


class CbsimError(Exception):
    """An error in the user's input, with a message that says how to fix it."""


class ScenarioError(CbsimError):
    """A scenario file or override is invalid."""


class TraceError(CbsimError):
    """A trace file is missing, empty or malformed."""


class SettingIgnored(UserWarning):
    """A setting the scenario gives that cannot act in this deployment (the run goes on without
    it): the warning names the setting and what it needs."""


def nearest(word: str, choices) -> str:
    """' (did you mean X?)' for the closest choice, or '' when nothing is close."""
    match = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""
