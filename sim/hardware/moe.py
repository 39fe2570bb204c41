"""How many experts a step of a mixture-of-experts model reads.

An MoE layer's GEMMs run only for the experts that at least one of the step's tokens is routed
to, and only those experts' weights are read from memory. At batch 1 a decode step of Mixtral
(8 experts, top 2) reads 2 of its 8 experts per layer; at batch 64 it reads essentially all 8,
which is why an MoE decode step gets dearer with the batch faster than a dense one.

Expected number of distinct experts hit by ``tokens`` tokens, each routed to ``top_k`` distinct
experts out of ``E``, independently and uniformly at random (the routing a load-balancing loss
trains towards; real routers are skewed, so this is the optimistic side for the weight reads):

    P(a given expert is not chosen by one token) = C(E-1, k) / C(E, k) = 1 - k/E
    P(it is chosen by none of T tokens)          = (1 - k/E)^T           (tokens independent)
    E[distinct experts]                          = E · (1 - (1 - k/E)^T) (linearity of expectation)

This is the classical occupancy count (balls into bins, here k distinct bins per ball). With
expert parallelism over ``ep`` ranks, each rank holds ``E/ep`` experts and, by the same argument,
expects ``E/ep · (1 - (1 - k/E)^T)`` of them to be hit by the ``T`` tokens the step dispatches.
"""

from __future__ import annotations


def expected_active_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """E · (1 − (1 − k/E)^T): expected distinct experts hit by ``tokens`` tokens' top-k routing."""
    if tokens <= 0 or num_experts <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
