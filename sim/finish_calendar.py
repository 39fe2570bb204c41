"""When each running request of a replica finishes, kept by tick instead of found by a pass.

Why: near capacity a replica's batch (about 65 requests on the bench's Poisson load) moves in
lockstep through vllm-v1's bulk decode steps and pure-decode stretches: every running request
emits one token a step. The engine used to find the step's finishing requests (and a stretch's
longest length: the least ``finish_at - num_output_tokens`` of the batch) by visiting every
request, three passes an arrival. While every running request emitted at the last step, its
margin ``finish_at - num_output_tokens`` falls by one a step, as a shared tick grows, so
``tick + margin`` is fixed: a heap of ``(that tick, rank, request)`` gives the least margin at its
top and the finishing requests by popping, and the runs of a stretch all go on (nobody skipped a
step), so a stretch needs no pass over its batch at all.

A *rank* orders the entries as the policy's running list is ordered (ranks are given in running
order when the calendar is built and to each request admitted after, which joins the list's
end), so the requests popped at one tick come out in batch order, the order ``finish_step``
frees them in. The engine (``sim.engine.Replica``) keeps one only for a policy whose running list
changes just by its own steps (``Policy.stretch_past_arrivals``: an arrival only queues) and drops
it whenever a step does something else than one token for every running request (a chunked
prefill, a preemption, a speculative step): the next stretch's pass builds it again.
"""

from __future__ import annotations

import heapq


class FinishCalendar:
    """The running requests of a replica by the tick at which each emits its last token."""

    __slots__ = ("heap", "tick", "rank")

    def __init__(self, entries: list, rank: int) -> None:
        heapq.heapify(entries)
        self.heap = entries  # (finishing tick, rank, request)
        self.tick = 0  # steps taken since it was built: every member emitted one token in each
        self.rank = rank  # the next rank to give

    def margin(self, default: int) -> int:
        """The steps the first member to finish still has to go (``default`` when empty)."""
        heap = self.heap
        return heap[0][0] - self.tick if heap else default

    def advance(self, k: int) -> list:
        """``k`` steps taken: the members that finish in the last one (in rank order), removed."""
        tick = self.tick + k
        self.tick = tick
        heap = self.heap
        if not heap or heap[0][0] > tick:
            return []
        out = []
        pop = heapq.heappop
        while heap and heap[0][0] <= tick:
            out.append(pop(heap)[2])
        return out

    def enter(self, req, margin: int) -> None:
        """A request that joined the end of the running list and emitted at this tick, with
        ``margin`` tokens still to emit."""
        heapq.heappush(self.heap, (self.tick + margin, self.rank, req))
        self.rank += 1
