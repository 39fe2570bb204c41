"""How many draft tokens the target accepts: a seeded draw per request and verification step.

Why a module of its own: acceptance is a property of the text and the draft model, which the
simulator does not have, so it is given as statistics (``policies[].speculative.acceptance``)
and drawn here, apart from the scheduler (which, like vLLM's, learns the outcome only after the
step) and from the latency model.

Three ways to give it, all reduced to *conditional* acceptance probabilities ``c_1..c_k``
(draft ``i`` is accepted given drafts ``1..i-1`` were; verification stops at the first rejection,
as vLLM's rejection sampler does):

* ``rate: a``: the geometric model, ``c_i = a`` (Leviathan et al. 2023, the i.i.d. assumption);
* ``per_position: [r_1, ..., r_k]``: vLLM's per-position acceptance rates (``vllm/v1/spec_decode/
  metrics.py``: accepted drafts at position ``i`` over drafts proposed), i.e. ``P(accepted >= i)``,
  so ``c_i = r_i / r_{i-1}``; non-increasing, as a prefix acceptance makes them;
* ``mean_length: tau``: a measured mean acceptance length (tokens emitted per verification step,
  the bonus token included, as the EAGLE papers report it), turned into the geometric rate with
  ``1 + a + ... + a^k = tau``.

Draws are reproducible and independent of scheduling order: each request has its own stream,
``random.Random`` seeded with the scenario seed and the request id, and every verification step
takes ``k`` numbers from it whatever number of drafts the token budget let through, so another
request's timing never shifts a request's draws.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def conditional_rates(
    k: int,
    rate: float | None = None,
    per_position: Sequence[float] | None = None,
    mean_length: float | None = None,
) -> tuple[float, ...]:
    """``c_1..c_k`` from exactly one of the three forms (checked by the scenario schema)."""
    if rate is not None:
        return (float(rate),) * k
    if per_position is not None:
        out, prev = [], 1.0
        for r in per_position:
            out.append(r / prev if prev > 0 else 0.0)
            prev = r
        return tuple(min(c, 1.0) for c in out)
    if mean_length is not None:
        return (geometric_rate(k, float(mean_length)),) * k
    raise ValueError("acceptance needs one of rate, per_position, mean_length")


def geometric_rate(k: int, tau: float) -> float:
    """The rate ``a`` with ``1 + a + a^2 + ... + a^k = tau`` (``1 <= tau <= k + 1``), by bisection."""
    if not 1.0 <= tau <= k + 1:
        raise ValueError(f"a mean acceptance length of {tau} is not in [1, {k + 1}] for {k} draft tokens")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(k + 1)) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_accepted(rates: Sequence[float]) -> float:
    """Mean accepted drafts per verification of all ``k`` drafts: ``sum_i prod_{j<=i} c_j``."""
    total, p = 0.0, 1.0
    for c in rates:
        p *= c
        total += p
    return total


class Acceptance:
    """Draws the accepted-prefix length of a request's drafts (``draw(record, d)``)."""

    def __init__(self, rates: Sequence[float], seed: int) -> None:
        self.rates = tuple(rates)
        self.k = len(self.rates)
        self.seed = seed

    def draw(self, rec, d: int) -> int:
        """Accepted drafts among the first ``d <= k`` this step verified for ``rec``'s request."""
        rng = rec.spec_rng
        if rng is None:
            rng = rec.spec_rng = random.Random(f"cbsim-speculative/{self.seed}/{rec.spec.id}")
        u = [rng.random() for _ in range(self.k)]  # k numbers per step, whatever d is
        rates = self.rates
        a = 0
        while a < d and u[a] < rates[a]:
            a += 1
        return a
