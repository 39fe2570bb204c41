"""The disaggregated deployment as SimPy processes: two pools of the engine's own replica loop,
two routers and the links between them.

The story of one request:

1. ``arrivals`` sleeps until its arrival time, asks the router for a prefill instance and hands
   it the request (with ``max_tokens = 1``: see :mod:`sim.disaggregation.handoff`).
2. The prefill instance's :class:`sim.engine.Replica` loop schedules it like any request, through
   its policy, until its first token; the request then ends there, its KV blocks pinned.
3. ``handoff`` (one process per request) asks the router for a decode instance at that moment,
   waits until that instance has room for the request's blocks (free blocks less those promised
   to transfers already under way, first come first served: a KV connector allocates the
   destination blocks before it pulls), then queues for the link (a ``simpy.Resource`` of
   capacity 1 per link, ``transfer.link`` deciding which transfers share one) and holds it for
   ``latency_s + bytes / bandwidth``. ``bytes`` are the request's KV blocks on the prefill
   instance: ``blocks × block_size × ModelSpec.kv_bytes_per_token()`` (every layer, every KV head).
4. When the transfer lands, the prefill instance's blocks are freed (and that instance woken: a
   request may have been waiting for them; it never counts as stuck while transfers hold its
   blocks) and the request joins the decode instance's policy with its prompt computed; that
   instance's loop decodes it to the end.

Fast-forward stays exact. A prefill instance's requests all end at their first token, so it
never meets a pure-decode stretch. A decode instance may fast-forward, but things happen to it
from outside: the router reads its state when a prefill finishes, and transfers land on it. So
its stretches end strictly before the earliest of: the next arrival, the end of any prefill
instance's step under way (``Replica.busy_until``: no prefill can finish before it, and a request
arriving at an idle one finishes after it arrives), and the landing of any transfer in flight
(transfers waiting for a link or for room start only at such moments or at the decode
instance's own step ends). Tests compare runs with and without fast-forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import simpy

from sim.disaggregation.handoff import Handoff, HandOffPolicy, pin_blocks, unpin_blocks
from sim.engine import Replica, arrivals_on_the_clock, fast_forward_default
from sim.metrics.recorder import HORIZON_REACHED, Recorder, explain_unfinished
from sim.routing import make_router
from sim.workload.sharing import shareable_tokens


@dataclass
class Pool:
    """One pool's instances as built by :mod:`sim.disaggregation.run`: (policy, latency) per
    instance, and the limits they share."""

    instances: Sequence[tuple[object, object]]
    max_model_len: int
    block_size: int


@dataclass(frozen=True)
class Link:
    """``transfer``: which transfers share a link, its bandwidth (bytes/s) and fixed latency (s)."""

    kind: str = "per-decode"
    bandwidth: float = 50e9
    latency_s: float = 0.0

    def key(self, prefill: int, decode: int):
        return {"per-decode": decode, "per-prefill": prefill, "per-pair": (prefill, decode),
                "shared": 0}[self.kind]

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth


class PrefillReplica(Replica):
    """A prefill instance: the engine's replica loop; a request it hands off has not ended for
    the progress bar (its decode instance reports it)."""

    def __init__(self, topology: DisaggregatedSimulation, *args) -> None:
        self.topology = topology
        super().__init__(*args)

    def _end(self, rec, state: str, reason: str = "") -> None:
        on_progress = self.on_progress
        if state == "finished" and self.topology.by_id[rec.spec.id].handed_off:
            self.on_progress = None
        super()._end(rec, state, reason)
        self.on_progress = on_progress


class DecodeReplica(Replica):
    """A decode instance: the engine's replica loop; requests count as outstanding from the moment
    the router sends them here (their KV still in transfer), so routers see what is coming."""

    def __init__(self, topology: DisaggregatedSimulation, *args) -> None:
        self.topology = topology
        super().__init__(*args)

    def submit(self, rec) -> None:
        """The request's KV has landed: it joins this instance's policy (see HandedOffRecord)."""
        req = rec.open(self.submitted, self.max_model_len, self.index, self.steps)
        self.submitted += 1
        self.records[req.id] = rec
        self.policy.add_request(req)
        self._kick()

    def _end(self, rec, state: str, reason: str = "") -> None:
        super()._end(rec, state, reason)
        self.topology.settle(rec.handoff)


class DecodeClock:
    """What a decode instance's fast-forward reads of the simulation: the horizon, and the earliest
    moment anything outside it can happen (module docstring)."""

    def __init__(self, topology: DisaggregatedSimulation) -> None:
        self.topology = topology
        self.horizon_s = topology.horizon_s

    @property
    def next_arrival_at(self) -> float:
        top = self.topology
        now = top.env.now
        bound = top.next_arrival_at
        for rep in top.prefill:
            if now <= rep.busy_until < bound:
                bound = rep.busy_until
        if top.landings:
            first = min(top.landings)
            if first < bound:
                bound = first
        return bound


class DisaggregatedSimulation:
    """Prefill and decode pools behind a router, joined by KV transfers (module docstring)."""

    def __init__(self, specs, prefill: Pool, decode: Pool, link: Link, kv_bytes_per_token: int,
                 router: str = "least-outstanding", horizon_s: float | None = None,
                 on_progress: Callable[[int], None] | None = None, fast_forward: bool | None = None,
                 horizon_reason: str = HORIZON_REACHED, clients=None, drain_s: float | None = None,
                 cap_reason: Callable[[float], str] | None = None):
        """``clients`` (a :class:`sim.workload.closed_loop.ClosedLoop`): closed-loop clients send
        the requests, as in :class:`sim.engine.Simulation`."""
        self.env = env = simpy.Environment()
        self.recorder = Recorder()
        self.horizon_s = horizon_s
        self.horizon_reason = horizon_reason
        self.cap_reason = cap_reason
        self.next_arrival_at = math.inf
        if fast_forward is None:
            fast_forward = fast_forward_default()
        self.link = link
        self.kv_bytes_per_token = kv_bytes_per_token
        self.prefill_block_size = prefill.block_size
        self.decode_block_size = decode.block_size
        self.decode_max_model_len = decode.max_model_len
        self.handoffs = [Handoff(s, replace(s, max_tokens=1), decode.max_model_len) for s in specs]
        for h, own in zip(self.handoffs, shareable_tokens(specs)):
            h.prefill.shareable = h.decode.shareable = own
        self.by_id = {h.spec.id: h for h in self.handoffs}
        self.landings: list[float] = []  # landing times of the transfers in flight
        self.in_flight = 0  # handed off by a prefill instance, not yet submitted to a decode instance
        self.prefill_done = False
        self.arrivals_over = False
        self.pins = [0] * len(prefill.instances)  # transfers holding blocks, per prefill instance
        n_prefill = len(prefill.instances)
        self.clients = None
        prefill_clocks, decode_clocks = [self] * n_prefill, [DecodeClock(self)] * len(decode.instances)
        if clients is not None:  # every instance's fast-forward also bounded by the clients' sends
            from sim.clients import ClientClock, Clients

            self.clients = Clients(env, clients, self.handoffs, stamp_handoff, self._to_prefill,
                                   self._arrivals_over, drain_s if horizon_s is None else None)

            def everyone():
                return [*self.prefill, *self.decode]

            prefill_clocks = [ClientClock(self, self.clients, everyone, i) for i in range(n_prefill)]
            decode_clocks = [ClientClock(decode_clocks[0], self.clients, everyone, n_prefill + j)
                             for j in range(len(decode.instances))]
        self.prefill: list[PrefillReplica] = []
        for i, (pol, lat) in enumerate(prefill.instances):
            hooked = HandOffPolicy(pol, on_finished=lambda reqs, i=i: self._prefilled(i, reqs))
            self.prefill.append(PrefillReplica(self, env, i, hooked, lat, self.recorder, prefill.max_model_len,
                                               on_progress, prefill_clocks[i], fast_forward))
        self.decode: list[DecodeReplica] = []
        for j, (pol, lat) in enumerate(decode.instances):
            hooked = HandOffPolicy(pol, after_step=lambda finished, j=j: self._open_room(j))
            self.decode.append(DecodeReplica(self, env, n_prefill + j, hooked, lat, self.recorder,
                                             decode.max_model_len, on_progress, decode_clocks[j], fast_forward))
        if self.clients is not None:
            for rep in (*self.prefill, *self.decode):
                rep.on_end = self._ended
        self.promised = [0] * len(self.decode)  # blocks promised to transfers under way, per decode instance
        self.waiting_room: list[list[tuple[Handoff, simpy.Event]]] = [[] for _ in self.decode]
        self.links: dict[object, simpy.Resource] = {}
        self.prefill_router = make_router(router)
        self.decode_router = make_router(router)
        if self.clients is None:
            env.process(self.arrivals())
        elif self.clients.sent == self.clients.n:
            self._arrivals_over()
        env.process(self._close_decode_pool())

    # --- processes --------------------------------------------------------------------------------
    def arrivals(self):
        yield from arrivals_on_the_clock(self.env, self, self.handoffs, self._to_prefill)
        self._arrivals_over()

    def _arrivals_over(self) -> None:
        self.arrivals_over = True
        for i in range(len(getattr(self, "prefill", ()))):
            self._prefill_may_stop(i)

    def _ended(self, rec) -> None:
        """An instance ended a record: the request's end (frees its closed-loop client) unless it is
        a prefill record handed off to the decode pool."""
        h = self.by_id[rec.spec.id]
        if rec is h.prefill and h.handed_off and rec.state == "finished":
            return
        self.clients.freed(h.decode)

    def _to_prefill(self, h: Handoff) -> None:
        h.prefill_replica = self.prefill_router(h.spec, self.prefill)
        self.prefill[h.prefill_replica].submit(h.prefill)

    def _prefill_may_stop(self, i: int) -> None:
        """Prefill instance ``i`` has nothing more coming once arrivals are over and none of its
        blocks is pinned by a transfer: only then may its loop end, or call what it holds stuck
        (a transfer that lands frees blocks it may be waiting for)."""
        rep = self.prefill[i]
        if self.arrivals_over and self.pins[i] == 0:
            rep.arrivals_done = True
        rep._kick()

    def _close_decode_pool(self):
        """Once every prefill instance has stopped, the decode pool's arrivals end with the last
        transfer."""
        yield simpy.AllOf(self.env, [rep.process for rep in self.prefill])
        self.prefill_done = True
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self.prefill_done and self.in_flight == 0:
            for rep in self.decode:
                if not rep.arrivals_done:
                    rep.arrivals_done = True
                    rep._kick()

    def _prefilled(self, i: int, finished) -> None:
        """Prefill instance ``i`` finished these requests' first tokens (its policy is about to
        free them): pin the blocks of those that go on decoding, and start their hand-offs."""
        policy = self.prefill[i].policy.inner
        for req in finished:
            h = self.by_id[req.id]
            if h.finish_at <= 1:  # its only token is out: done on the prefill instance
                continue
            h.blocks = pin_blocks(policy, req)
            self.pins[i] += 1
            h.prefilled_s = self.env.now
            h.bytes = len(h.blocks) * self.prefill_block_size * self.kv_bytes_per_token
            self.in_flight += 1
            self.env.process(self.handoff(h))

    def handoff(self, h: Handoff):
        env = self.env
        j = self.decode_router(h.spec, self.decode)  # reads the decode instances' state now
        h.decode_replica = j
        dec = self.decode[j]
        dec.outstanding += 1
        h.decode.on_admitted = self._admitted
        need = -(-min(h.spec.prompt_tokens + 1, self.decode_max_model_len) // self.decode_block_size)
        h.decode_blocks = need
        if need <= dec.policy.kv_blocks_total():  # one that can never fit is refused by the policy itself
            if self.waiting_room[j] or not self._has_room(j, need):
                ready = env.event()
                self.waiting_room[j].append((h, ready))
                yield ready  # _open_room made the promise
            else:
                self.promised[j] += need
                h.promised = True
        h.room_s = env.now
        key = self.link.key(h.prefill_replica, j)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = simpy.Resource(env, capacity=1)
        with link.request() as slot:
            yield slot
            h.transfer_start_s = env.now
            wire = self.link.seconds(h.bytes)
            land = env.now + wire  # where SimPy puts the timeout
            self.landings.append(land)
            yield env.timeout(wire)
            self.landings.remove(land)
        h.landed_s = env.now
        unpin_blocks(self.prefill[h.prefill_replica].policy.inner, h.blocks)
        self.pins[h.prefill_replica] -= 1
        self._prefill_may_stop(h.prefill_replica)  # wakes it: the freed blocks may admit a request
        self.in_flight -= 1
        dec.submit(h.decode)
        self._maybe_close()

    # --- room on a decode instance ----------------------------------------------------------------
    def _has_room(self, j: int, need: int) -> bool:
        pol = self.decode[j].policy
        return need <= pol.kv_blocks_total() - pol.kv_blocks_used() - self.promised[j]

    def _open_room(self, j: int) -> None:
        """After each step of decode instance ``j``: let waiting transfers go, first come first served."""
        queue = self.waiting_room[j]
        while queue and self._has_room(j, queue[0][0].decode_blocks):
            h, ready = queue.pop(0)
            self.promised[j] += h.decode_blocks  # taken now, before the next one is checked
            h.promised = True
            ready.succeed()

    def _admitted(self, rec) -> None:
        self.settle(rec.handoff)

    def settle(self, h: Handoff) -> None:
        """The decode instance has allocated the request's blocks (or ended it): its promise is kept."""
        if h.promised:
            h.promised = False
            self.promised[h.decode_replica] -= h.decode_blocks
            self._open_room(h.decode_replica)

    def run(self) -> DisaggregatedSimulation:
        if self.horizon_s is not None:
            self.env.run(until=self.horizon_s)
        else:
            self.env.run()
        records = [h.prefill for h in self.handoffs] + [h.decode for h in self.handoffs if h.landed_s == h.landed_s]
        stop = self.end_s
        if stop is not None:  # the closed loop's moving time cap (sim.clients)
            reason = self.cap_reason(stop) if self.cap_reason is not None else self.horizon_reason
            self.horizon_reason = reason  # request_rows reads it for transfers cut short
            explain_unfinished(records, stop, reason)
        else:
            explain_unfinished(records, self.horizon_s, self.horizon_reason)
        return self

    @property
    def end_s(self) -> float | None:
        """Where a closed loop's time cap stopped the run (None: it did not)."""
        return self.clients.stopped_at if self.clients is not None else None


def stamp_handoff(h: Handoff, t: float, client: int) -> None:
    """A disaggregated run's item: the request's spec, on both of its records, gets its send time
    and client."""
    h.spec = replace(h.spec, arrival_s=t, client=client)
    h.prefill.spec = replace(h.prefill.spec, arrival_s=t, client=client)
    h.decode.spec = h.spec
