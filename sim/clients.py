"""Closed-loop clients on the SimPy clock: each sends its next request when its previous one ends.

What a closed-loop benchmark does (``vllm bench serve --max-concurrency``: a semaphore of N
around the request coroutines, ``vllm/benchmarks/serve.py``; aiperf and genai-perf
``--concurrency``): N clients, each with one request in flight; when a response ends (its last
token, or an error: a 429 or a rejection frees the client just the same) the client takes the
next request of the workload (in the workload's order) and sends it after its think time. The
draws made before the run (first sends, think times) are :mod:`sim.workload.closed_loop`'s.

Here a request's end is reported by the replica that ended it (``Replica.on_end`` ->
:meth:`Clients.freed`, at that moment of simulated time); the next send is a SimPy timeout of the
think time (0 included: the send is an event of its own, after the step that ended the previous
request, as a real client's next request is), and at that event the request is stamped with its
send time and client and handed to the router.

Fast-forward stays exact. A replica's decode stretch must end strictly before anything outside
it can happen (``sim.engine``). With open-loop arrivals that is the next arrival; here an arrival
can also be caused by an end on *another* replica. Ends happen only at the end of a step (or of a
stretch) or when a replica schedules after a wake-up by an arrival (or, disaggregated, by a KV
transfer landing: a decode instance's own clock already stops before those), so no send can happen before
the earliest of: a send already scheduled (``pending``), and, while requests are left to send,
each other replica's current step end (``busy_until``) plus the smallest think time. That is
:meth:`Clients.bound`, which :class:`ClientClock` adds to what the replica's own clock says.

Sessions (``workload.sessions``, or a trace with ``session_id`` and ``turn``) use the same
machinery: a session's turn k + 1 is sent its ``think_s`` after turn k ended (open loop: the
session's first turn at its own arrival time; closed loop: a client runs one session after
another, its ``think_time_s`` between them).

Where time stops without a ``horizon_s``: as for open-loop arrivals (``sim.runner``), at the last
send + max(drain, the sends' span), the drain being ``DEFAULT_DRAIN_S``; the cap moves with every
send, and the simulation stops when it is reached with no send since (an URGENT event, as SimPy's
``run(until=...)`` stops: nothing scheduled at that very time runs).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from simpy.core import StopSimulation
from simpy.events import URGENT, Event

from sim.workload.closed_loop import ClosedLoop, SendPlan


class Clients:
    """The sends of one simulation. ``items`` (records, or the disaggregated topology's hand-offs,
    each with a ``spec``) in workload order; ``plan`` says which are sessions and whether clients
    run them (:class:`sim.workload.closed_loop.SendPlan`); ``stamp(item, t, client)`` writes the
    send time and client into the item; ``deliver(item)`` routes it; ``all_sent()`` once the last
    one is sent."""

    def __init__(self, env, plan: SendPlan | ClosedLoop, items: Sequence, stamp: Callable, deliver: Callable,
                 all_sent: Callable[[], None], drain_s: float | None = None) -> None:
        if isinstance(plan, ClosedLoop):  # clients sending one request after another
            plan = SendPlan(tuple((i,) for i in range(len(items))), plan)
        self.env = env
        self.items = items
        self.n = len(items)
        self.stamp = stamp
        self.deliver = deliver
        self.all_sent = all_sent
        self.sessions = plan.sessions
        self.closed = plan.closed
        self.where = {}  # request id -> (session, turn position)
        for si, sess in enumerate(self.sessions):
            for k, i in enumerate(sess):
                self.where[items[i].spec.id] = (si, k)
        self.think = plan.closed.think_s.tolist() if plan.closed is not None else []
        self.min_think = plan.min_think_s([it.spec for it in items])
        self.pending: list[float] = []  # times of the sends scheduled and not yet made (a heap)
        self.scheduled = 0  # requests given a send time (sent or pending)
        self.sent = 0
        self.next_session = 0  # closed loop: the next session a free client takes
        self.freed_count = 0  # closed loop: clients freed so far, the index of the next think time
        self.ended = 0
        self.drain_s = drain_s
        if plan.closed is not None:
            first = list(plan.closed.first_send_s)
        else:  # open loop: each session's first turn at its own arrival time
            first = [items[sess[0]].spec.arrival_s for sess in self.sessions]
        self.first_s = min(first) if first else 0.0
        self.last_s = max(first) if first else 0.0
        self.deadline = self._cap() if drain_s is not None else math.inf
        self.stopped_at: float | None = None  # where the cap stopped the run (None: it did not)
        if plan.closed is not None:
            for client, at in enumerate(first):
                self._start_session(client, at)
        else:
            for sess, at in zip(self.sessions, first):
                self._schedule(sess[0], -1, at)
        if self.n == 0:
            all_sent()
        elif drain_s is not None:
            self._arm()

    # --- sends ------------------------------------------------------------------------------------
    def _start_session(self, client: int, delay: float) -> None:
        si = self.next_session
        self.next_session += 1
        self._schedule(self.sessions[si][0], client, delay)

    def _schedule(self, index: int, client: int, delay: float) -> None:
        env = self.env
        heapq.heappush(self.pending, env.now + delay)  # exactly where SimPy puts the timeout
        self.scheduled += 1
        ev = env.timeout(delay, value=(index, client))
        ev.callbacks.append(self._send)

    def _send(self, ev) -> None:
        heapq.heappop(self.pending)  # timeouts fire in time order: this one is the heap's least
        now = self.env.now
        index, client = ev.value
        item = self.items[index]
        self.sent += 1
        self.stamp(item, now, client)
        if now > self.last_s:
            self.last_s = now
            if self.drain_s is not None:
                self.deadline = self._cap()
        self.deliver(item)
        if self.sent == self.n:
            self.all_sent()

    def freed(self, rec) -> None:
        """A request ended now (finished, rejected, or stuck): its session's next turn is sent after
        its think time (not before a trace's timestamp for it); after a session's last turn a
        closed-loop client thinks, then starts the next session, if any is left."""
        self.ended += 1
        if self.scheduled >= self.n:
            return
        si, k = self.where[rec.spec.id]
        sess = self.sessions[si]
        client = rec.spec.client
        if k + 1 < len(sess):
            nxt = sess[k + 1]
            spec = self.items[nxt].spec
            delay = spec.think_s
            if spec.arrival_s == spec.arrival_s and spec.arrival_s - self.env.now > delay:  # a trace's time
                delay = spec.arrival_s - self.env.now
            self._schedule(nxt, client, delay)
        elif self.closed is not None and self.next_session < len(self.sessions):
            k = self.freed_count
            self.freed_count += 1
            self._start_session(client, self.think[k])

    # --- fast-forward -----------------------------------------------------------------------------
    def bound(self, own, replicas: Sequence) -> float:
        """No send happens before this (module docstring); ``own`` is the replica asking."""
        bound = self.pending[0] if self.pending else math.inf
        if self.scheduled < self.n:
            now = self.env.now
            end = math.inf
            for rep in replicas:
                if rep is not own and now <= rep.busy_until < end:
                    end = rep.busy_until
            end += self.min_think
            if end < bound:
                bound = end
        return bound

    # --- the time cap -----------------------------------------------------------------------------
    def _cap(self) -> float:
        return self.last_s + max(self.drain_s, self.last_s - self.first_s)

    def _arm(self) -> None:
        ev = Event(self.env)
        ev._ok = True
        ev._value = self.deadline
        ev.callbacks.append(self._at_deadline)
        self.env.schedule(ev, URGENT, self.deadline - self.env.now)

    def _at_deadline(self, ev) -> None:
        if self.ended >= self.n:
            return  # every request ended: nothing left to stop
        if self.deadline != ev.value:
            self._arm()  # a send moved the cap
            return
        self.stopped_at = self.env.now
        raise StopSimulation(None)


class ClientClock:
    """What one replica's fast-forward reads in a closed-loop run: its own clock's horizon and next
    event (the simulation's, or a decode pool's), bounded by the clients' sends
    (:meth:`Clients.bound`) and the moving time cap."""

    def __init__(self, base, clients: Clients, replicas: Callable[[], Sequence], index: int) -> None:
        self.base = base
        self.clients = clients
        self.replicas = replicas
        self.index = index  # the replica this clock serves, in replicas()

    @property
    def horizon_s(self) -> float | None:
        h = self.base.horizon_s
        cap = self.clients.deadline
        return cap if h is None or cap < h else h

    @property
    def next_arrival_at(self) -> float:
        reps = self.replicas()
        bound = self.clients.bound(reps[self.index], reps)
        base = self.base.next_arrival_at
        return base if base < bound else bound


def stamp_record(rec, t: float, client: int) -> None:
    """A colocated run's item: the record's spec gets its send time and client."""
    rec.spec = replace(rec.spec, arrival_s=t, client=client)
