"""Static (request-level) batching, as FasterTransformer-style servers do it.

A batch of up to ``batch_size`` requests is formed from the queue (FCFS, each reserving its
max-length KV) and runs until *every* member finishes; only then is the next batch formed.
Finished members keep their slot and their memory until the batch drains, and the batch pays for
padding: prompts are padded to the longest one, and finished slots are still computed. This is
the idle-slot and head-of-line-blocking behaviour continuous batching removes
(reference/schedulers.md section 5).
"""

from __future__ import annotations

from policies.base import Knob, Request, StepPlan
from policies.reservation import ReservationPolicy


class StaticPolicy(ReservationPolicy):
    name = "static"
    summary = "request-level batching: a batch runs until every member finishes; padding waste"
    KNOBS = {
        "batch_size": Knob(
            None, "requests per batch (slots); default: engine.max_num_seqs", type=int
        ),
    }

    def __init__(self, limits, **knobs) -> None:
        super().__init__(limits, **knobs)
        size = self.knobs["batch_size"]
        self.batch_size = limits.max_num_seqs if size is None else size
        if self.batch_size < 1:
            raise ValueError("static batch_size must be at least 1")
        self.batch: list[Request] = []  # every member of the current batch, finished or not

    @property
    def max_slots(self) -> int:
        return self.batch_size

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        if not self.batch:
            self._admit(plan, self.batch_size)
            self.batch = list(self.running)
            longest = max((r.num_tokens for r in self.batch), default=0)
            plan.padding_tokens = sum(longest - n for n in plan.num_new_tokens)
            return plan
        for req in self.batch:
            if req in self.running:
                plan.add(req, 1, req.num_computed_tokens)
                req.num_computed_tokens += 1
            else:  # a finished member: its slot is still computed
                plan.padding_tokens += 1
                plan.padding_context += req.num_computed_tokens
        return plan

    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        for req in finished:
            self.running.remove(req)
        if not self.running:  # the batch drained: now its memory is freed
            for req in self.batch:
                self.kv.release(req)
            self.batch = []
