"""The random draws of a synthetic workload: one stream per quantity, arrival gaps and lengths.

Why a module of its own: both the request generator (:mod:`sim.workload.synthetic`) and the session
generator (:mod:`sim.workload.sessions`) draw arrivals and lengths the same way, and neither may
import the other (the generator dispatches to the sessions). The rules are documented in
:mod:`sim.workload.synthetic`'s docstring.
"""

from __future__ import annotations

import numpy as np

from sim.workload.distributions import lognormal_params

# one independent random stream per quantity: [seed, STREAM]
ARRIVALS, PROMPT, OUTPUT, ROWS, PREFIX = 1, 2, 3, 4, 5


def rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


def unit_gaps(process: str, n: int, generator: np.random.Generator, cv: float | None = None) -> np.ndarray:
    """``n`` inter-arrival gaps of a rate-1 process (divide by the rate to scale)."""
    if process == "poisson":
        return generator.exponential(1.0, n)
    if process == "gamma":
        shape = 1.0 / (cv * cv)
        return generator.gamma(shape, 1.0 / shape, n)
    if process == "constant":
        return np.ones(n)
    raise ValueError(f"no synthetic arrival process {process!r}")


def synthetic_arrivals(arrival, n: int, seed: int) -> np.ndarray:
    """Arrival times of ``n`` requests, the first at 0."""
    gaps = unit_gaps(arrival.process, max(n - 1, 0), rng(seed, ARRIVALS), arrival.cv)
    return np.concatenate(([0.0], np.cumsum(gaps)))[:n] / arrival.rate


def sample_lengths(dist, n: int, generator: np.random.Generator, field: str = "prompt") -> np.ndarray:
    """``n`` integer lengths from a fixed, uniform, lognormal or azure-conv ``LengthDist`` (the
    last one's table depends on ``field``, "prompt" or "output")."""
    if dist.dist == "fixed":
        return np.full(n, dist.value, dtype=np.int64)
    if dist.dist == "uniform":
        return generator.integers(dist.min, dist.max, size=n, endpoint=True, dtype=np.int64)
    if dist.dist == "lognormal":
        mu, sigma = lognormal_params(dist.mean, dist.p99)
        return np.rint(generator.lognormal(mu, sigma, n)).astype(np.int64)
    if dist.dist == "azure-conv":
        from sim.workload.azure_conv import sample

        return sample(field, n, generator)
    raise ValueError(f"no synthetic length distribution {dist.dist!r}")
