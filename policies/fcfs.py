"""The queues most policies keep: a FCFS ``waiting`` deque that ``add_request`` appends to, and
the ``running`` list, whose lengths are the counts the engine records.

Static, orca, vllm-v0 and sarathi build on it; vllm-v1 keeps its own (a FIFO or a priority heap).
"""

from __future__ import annotations

from collections import deque

from policies.base import EngineLimits, Policy, Request, Status


class FcfsPolicy(Policy):
    def __init__(self, limits: EngineLimits, **knobs) -> None:
        super().__init__(limits, **knobs)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add_request(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)
