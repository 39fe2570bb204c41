"""Orca iteration-level scheduling (Yu et al., OSDI'22), as Sarathi-Serve's and Vidur's Orca
baselines implement it (reference/schedulers.md section 4).

Every step, each running request decodes one token; then waiting requests join FCFS while a slot
is free (``max_num_seqs``) and their max-length KV reservation (prompt + max_tokens) fits. A new
request's whole prompt runs in the same step as the decodes (selective batching). There is no
token budget and, since memory is reserved up front, no preemption.
"""

from __future__ import annotations

from policies.base import Request, StepPlan
from policies.reservation import ReservationPolicy


class OrcaPolicy(ReservationPolicy):
    name = "orca"
    summary = "iteration-level batching with max-length KV reservation; whole prompts join decodes"
    KNOBS = {}

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        for req in self.running:
            plan.add(req, 1, req.num_computed_tokens)
            req.num_computed_tokens += 1
        self._admit(plan, self.limits.max_num_seqs)
        return plan

    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        for req in finished:
            self.running.remove(req)
            self.kv.release(req)
