"""From a policy entry's ``speculative`` section to what a run needs: the policy switched to
speculative scheduling, the latency model with the drafter's cost, and the acceptance draws.

Why a module of its own: the runner builds replicas for many kinds of runs (sweeps, capacity
search, plans); keeping the one place that reads the section here leaves the runner a single call.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.speculative.acceptance import Acceptance, conditional_rates
from sim.speculative.draft_cost import DraftCost, SpeculativeLatency

# vLLM Scheduler.__init__ (vllm/v1/core/sched/scheduler.py): num_lookahead_tokens = num_spec_tokens
# when speculative_config.use_eagle() (eagle, eagle3, mtp) or uses_draft_model(); 0 for n-gram
LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp", "draft")


@dataclass
class Speculation:
    cfg: object  # sim.scenario.schema.Speculative
    acceptance: Acceptance
    draft: DraftCost | None

    @property
    def k(self) -> int:
        return self.cfg.num_speculative_tokens

    @property
    def lookahead(self) -> int:
        return self.k if self.cfg.method in LOOKAHEAD_METHODS else 0

    def enable(self, policy) -> None:
        policy.enable_speculation(self.k, self.lookahead)

    def wrap(self, latency):
        return SpeculativeLatency(latency, self.draft)


def speculation_for(dep, entry) -> Speculation | None:
    """The entry's speculation on this deployment, or None when it has no ``speculative`` section."""
    cfg = getattr(entry, "speculative", None)
    if cfg is None:
        return None
    from sim.hardware.models import get_model

    acc = cfg.acceptance
    k = cfg.num_speculative_tokens
    rates = conditional_rates(k, acc.rate, acc.per_position, acc.mean_length)
    scn = dep.scenario
    draft = None
    if scn.latency.backend != "constant":  # a constant step_s is the whole step, drafting included
        lat = scn.latency
        draft = DraftCost(cfg.method, k, dep.model, dep.gpu, dep.tensor_parallel, dep.block_size,
                          draft_model=get_model(cfg.draft_model) if cfg.draft_model is not None else None,
                          draft_vocab_size=cfg.draft_vocab_size, propose_s_per_request=cfg.propose_s_per_request,
                          compute_efficiency=getattr(lat, "compute_efficiency", None),
                          memory_efficiency=getattr(lat, "memory_efficiency", None))
    return Speculation(cfg, Acceptance(rates, scn.seed), draft)
