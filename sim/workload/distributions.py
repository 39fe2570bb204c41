"""The lognormal by mean and 99th percentile: the one distribution both the scenario schema (to
refuse an impossible mean/p99 pair as the user types it) and the workload generator (to draw from
it) need, so it lives below both (the derivation: :mod:`sim.workload.synthetic`'s docstring)."""

from __future__ import annotations

import math

from sim.errors import CbsimError

Z99 = 2.3263478740408408  # Φ⁻¹(0.99), the standard normal's 99th percentile


def lognormal_params(mean: float, p99: float) -> tuple[float, float]:
    """(μ, σ) of the lognormal with this mean and 99th percentile (see the module docstring)."""
    if not (mean > 0 and p99 > mean):
        raise CbsimError(f"a lognormal needs 0 < mean < p99, got mean {mean}, p99 {p99}")
    gap = math.log(p99 / mean)
    if gap > Z99 * Z99 / 2:
        raise CbsimError(f"no lognormal has mean {mean} and p99 {p99}: p99 can be at most "
                         f"{math.exp(Z99 * Z99 / 2):.2f} × mean ({math.exp(Z99 * Z99 / 2) * mean:.0f})")
    sigma = Z99 - math.sqrt(Z99 * Z99 - 2 * gap)
    return math.log(mean) - sigma * sigma / 2, sigma
