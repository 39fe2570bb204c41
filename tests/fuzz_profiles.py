"""Hypothesis settings for the property and fuzz tests: a fixed, small budget in ``make test``
and a deep one in ``make fuzz``.

``CBSIM_FUZZ_PROFILE=ci`` (the default): derandomized (the same examples every run, so a test
that passes once passes always and CI never flakes), no example database written, a budget that
keeps each file well under a minute on two cores. ``CBSIM_FUZZ_PROFILE=deep`` (``make fuzz``):
random examples, many more of them, failures saved in ``.hypothesis/`` to replay.

Tests scale their own ``max_examples`` with :func:`examples` so one number per test states its
relative weight.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("CBSIM_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "deep"):
    raise RuntimeError(f"CBSIM_FUZZ_PROFILE must be 'ci' or 'deep', got {PROFILE!r}")

DEEP_FACTOR = 10  # deep runs this many times more examples than ci

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def examples(ci: int) -> settings:
    """Settings with ``ci`` examples under the ci profile, ``DEEP_FACTOR`` times as many when deep."""
    if PROFILE == "deep":
        return settings(max_examples=ci * DEEP_FACTOR, deadline=None, suppress_health_check=_SUPPRESS,
                        derandomize=False, print_blob=True)
    return settings(max_examples=ci, deadline=None, suppress_health_check=_SUPPRESS, derandomize=True,
                    database=None, print_blob=True)
