"""The SimPy engine: arrivals feed replicas; each replica loops over scheduling steps.

The story, as SimPy processes:

* ``arrivals`` sleeps until each request's arrival time, asks the router for a replica, and
  hands the request to that replica's policy (waking the replica if it was idle).
* each ``Replica.loop`` asks its policy for a step plan, spends the plan's time
  (``yield env.timeout(step_time + swap_time)``), emits a token for every request whose prompt is
  fully computed, ends the requests that are done and tells the policy, and records the step.

A request ends finished (it emitted its true output length, or hit ``max_tokens`` or
``max_model_len``), rejected (the policy says it can never be admitted, with a reason), or
unfinished (still queued or running when the horizon is reached, or when no policy step can make
progress and no arrival is pending). Nothing is dropped silently.

Fast-forward (exact). Between arrivals and finishes a busy replica mostly repeats one step:
every running request decodes one token and emits it. When the policy can prove that its next
steps are such pure decodes (``Policy.decode_stretch``), the replica applies ``k`` of them at
once: their step times are priced together (each exactly as a single step would be, contexts
growing by one token per step), the clock is advanced by adding them one by one from ``env.now``
as SimPy would, and the policy advances its state in the order ``k`` single steps would have
(``Policy.advance_decodes``). A stretch ends strictly before the next arrival's event time and
the horizon, with the step in which the first request finishes (that step's finishes are then
applied as a single step applies them), and before KV memory would run out, so nothing any other
process could observe differs: the same steps, tokens, times and records, bit for bit.

Where the arrival reads nothing a stretch changes (``Replica.cross_arrivals``: no closed loop, one
replica or a router that reads no KV state, a policy whose ``add_request`` only queues:
``Policy.stretch_past_arrivals``), two things more are exact. The stretch's last step may contain
the next arrival (start before it, end after it: stepped one by one, that step is scheduled before
the arrival and ends after it; its row's ``waiting`` counts the arrival). And a stretch that ends
with finishes is followed, in the same timeout, by the stretch the policy offers next from that
clock (``Replica._chain_stretches``): the stretches are applied at once, their finished requests
ended at once, except those of a last step containing the arrival, ended after it. Where the
policy admits a request arriving during a step only in the step after next
(``Policy.admits_a_step_late``: vllm-v1's ``async_admission``), the step after the arrival's is the
same pure decode whatever arrives: the stretch takes it too when the arrival after next comes
after it (``Replica._prepare_stretch``).
While every running request emitted at the last step, a vllm-v1 replica knows who finishes when
from a *finish calendar* (``sim.finish_calendar``): a stretch's length, its finishing requests
and a bulk step's are read from it instead of from a pass over the batch.
``Simulation(..., fast_forward=False)`` or the environment variable ``CBSIM_NO_FAST_FORWARD=1``
turns it off (for debugging; tests compare both).

Speculative decoding (``Simulation(..., acceptance=...)``, a policy with ``enable_speculation``):
a plan with ``spec_tokens`` verifies draft tokens. After its step the replica draws how many each
request's target accepted (``sim.speculative.acceptance``), the policy steps the rejected ones back
(``Policy.reject_drafts``) and every request emits its accepted drafts plus one token, all at the
step's end (``sim.metrics.requests.emit_caught_up``). The policy offers no pure-decode stretch
while it speculates, so such runs are stepped one step at a time (the fast-forward stays exact
by not running).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import numpy as np
import simpy

from policies.base import Policy, Request, Status, StepPlan
from policies.kv.hiradix import layerwise_overlap
from sim.finish_calendar import FinishCalendar
from sim.latency.base import LatencyModel, StepShape, step_shape
from sim.metrics.recompute import RecomputeTracker
from sim.metrics.recorder import (
    HORIZON_REACHED,
    Recorder,
    RequestRecord,
    emit_step_tokens,
    explain_unfinished,
)
from sim.metrics.requests import emit_caught_up, verify_drafts
from sim.routing import round_robin
from sim.workload.closed_loop import ClosedLoop, SendPlan
from sim.workload.request_spec import RequestSpec
from sim.workload.sharing import shareable_tokens

Router = Callable[[RequestSpec, Sequence["Replica"]], int]

MAX_STRETCH = 4096  # steps fast-forwarded at once at most (bounds the arrays of one stretch)
MIN_STRETCH = 2  # shorter stretches are stepped normally (but where arrivals may be crossed: _prepare_stretch)
SHORT_STRETCH = 48  # stretches up to this many steps are priced in Python floats, longer ones with NumPy
# what a stretch's last step hands finish_step for a policy that reads no plan there
# (Policy.finish_step_reads_plan): one empty plan, not the batch's lists built again
UNREAD_PLAN = StepPlan()


def fast_forward_default() -> bool:
    return os.environ.get("CBSIM_NO_FAST_FORWARD", "").strip().lower() in ("", "0", "false", "no")


def arrivals_on_the_clock(env: simpy.Environment, clock, items, deliver: Callable):
    """SimPy process body: hand each item (``item.spec.arrival_s`` ascending) to ``deliver`` at its
    arrival time, keeping ``clock.next_arrival_at`` exactly where SimPy will next wake, which a
    replica's decode fast-forward must not run past; ``inf`` once every item has arrived. And
    ``clock.arrival_after_next``: where the arrival after that one will wake (the same time when
    both fall together), which a stretch that crosses the next arrival may run up to with a
    policy that admits a step late (``Replica._prepare_stretch``)."""
    items = iter(items)
    item = next(items, None)
    while item is not None:
        following = next(items, None)  # one ahead: where it will wake (arrival_after_next)
        delay = item.spec.arrival_s - env.now
        at = env.now + delay if delay > 0 else env.now  # exactly where SimPy puts the timeout
        if following is None:
            clock.arrival_after_next = math.inf
        else:  # where SimPy will put the following one's timeout, from this one's clock
            d = following.spec.arrival_s - at
            clock.arrival_after_next = at + d if d > 0 else at
        if delay > 0:
            clock.next_arrival_at = at
            yield env.timeout(delay)
        clock.next_arrival_at = env.now
        deliver(item)
        item = following
    clock.next_arrival_at = clock.arrival_after_next = math.inf


class Replica:
    """One serving engine: a policy (scheduler + KV memory) and a latency model on a clock."""

    def __init__(self, env: simpy.Environment, index: int, policy: Policy, latency: LatencyModel,
                 recorder: Recorder, max_model_len: int, on_progress: Callable[[int], None] | None = None,
                 simulation: Simulation | None = None, fast_forward: bool = False, acceptance=None,
                 start: bool = True):
        self.env = env
        self.acceptance = acceptance  # draws accepted drafts (sim.speculative.acceptance); None: no speculation
        self.index = index
        self.policy = policy
        self.latency = latency
        self.recorder = recorder
        self.steps = recorder.replica_steps(index)
        self.max_model_len = max_model_len
        self.records: dict[str, RequestRecord] = {}  # the requests held here, by id (ended ones leave)
        self.submitted = 0  # requests handed to this replica: the next one's arrival order
        self.outstanding = 0  # requests handed to this replica and not yet ended
        self.wake = env.event()
        self.arrivals_done = False
        self.on_progress = on_progress
        self.simulation = simulation
        # fast-forward needs a policy that implements it and a simulation that knows the next arrival
        self.fast_forward = (fast_forward and simulation is not None
                             and type(policy).decode_stretch is not Policy.decode_stretch)
        self.pricer = DecodePricer(latency) if self.fast_forward else None
        # the last step of a stretch may contain the next arrival (Simulation sets it where that is exact)
        self.cross_arrivals = False
        self.stretches = 0  # pure-decode stretches fast-forwarded, and the steps they held
        self.stretch_steps = 0
        # when the step (or stretch) under way ends: sim.disaggregation bounds its decode pool's
        # fast-forward by its prefill instances' next step ends (nothing else reads it)
        self.busy_until = -math.inf
        self.on_end: Callable[[RequestRecord], None] | None = None  # closed loop: frees the client (sim.clients)
        self.group = None  # a sim.lockstep.LockstepGroup runs this replica's steps instead of loop()
        self.recompute = RecomputeTracker()
        # the running requests by the tick they finish at (sim.finish_calendar), while every one
        # emitted at the last step; None: unknown, the next stretch's pass over its batch builds it.
        # Only where the running list changes by this replica's steps alone (an arrival queues)
        self.calendar: FinishCalendar | None = None
        self.keep_calendar = self.fast_forward and getattr(type(policy), "stretch_past_arrivals", False)
        self.process = env.process(self.loop()) if start else None

    def submit(self, rec: RequestRecord) -> None:
        req = rec.open(self.submitted, self.max_model_len, self.index, self.steps)
        self.submitted += 1
        self.records[req.id] = rec
        self.outstanding += 1
        self.policy.add_request(req)
        self._kick()

    def _kick(self) -> None:
        if self.group is not None:
            self.group.kick()
        elif not self.wake.triggered:
            self.wake.succeed()

    def _end(self, rec: RequestRecord, state: str, reason: str = "") -> None:
        rec.end(state, reason)
        del self.records[rec.spec.id]  # the recorder keeps the record: nothing here looks it up again
        self.outstanding -= 1
        if self.on_progress is not None:
            self.on_progress(1)
        if self.on_end is not None:
            self.on_end(rec)
        self.recorder.ended(rec)  # a compact recorder writes its row and lets the record go

    def loop(self):
        env, policy, records = self.env, self.policy, self.records
        fast_forward = self.fast_forward
        while True:
            if not policy.has_work():
                if self.arrivals_done:
                    return
                self.wake = env.event()
                yield self.wake
                continue
            if fast_forward:
                stretch = policy.decode_stretch()
                if stretch is not None:
                    if self.cross_arrivals:
                        chained = self._chain_stretches(*stretch)
                        if chained is not None:
                            delay, crossed, ending = chained
                            self.busy_until = env.now + delay
                            waiting = policy.num_waiting
                            yield env.timeout(delay)
                            if crossed and policy.num_waiting != waiting:  # arrived in the last step
                                if crossed == 1:
                                    self.steps.set_last_waiting(policy.num_waiting)
                                else:  # in the one before (Policy.admits_a_step_late): both rows
                                    self.steps.set_last_waiting(policy.num_waiting, 2)
                            if crossed == 2:
                                policy.arrivals_behind = 0
                            for req in ending:  # they end after the arrival, as stepped
                                self._end(records[req.id], "finished")
                            continue
                    else:
                        prepared = self._prepare_stretch(*stretch)
                        if prepared is not None:
                            self.busy_until = env.now + prepared[0]
                            yield env.timeout(prepared[0])
                            self._apply_stretch(*prepared[1:8])
                            continue
            plan = policy.schedule()
            for req in plan.rejected:
                self._end(records[req.id], "rejected", req.reject_reason or "rejected by the policy")
            if plan.is_empty:
                if plan.rejected or plan.preempted:
                    # the policy freed memory without running anything (e.g. vllm-v0 preempted
                    # and rejected its only decode): it may admit a waiting request now. Bounded:
                    # each such plan rejects a request or preempts one that ran before.
                    continue
                if self.arrivals_done:
                    # nothing can run and nothing will arrive: what is left can never progress
                    for req in policy.drain():
                        self._end(records[req.id], "unfinished", "stuck: the policy cannot schedule it")
                    return
                self.wake = env.event()
                yield self.wake
                continue
            start = env.now
            item = self._price_plan(plan, start)
            dt = item[0]
            self.busy_until = start + dt  # where SimPy puts the timeout: now + delay
            yield env.timeout(dt)
            self.finish_planned(item, start, env.now, dt)

    def _verified_step(self, plan, now, start, dt, shape, flops, bytes_, swap_s, recomputed) -> None:
        """The end of a speculative step: draws, rejected drafts back to the policy, the accepted
        tokens plus one emitted, finishes, and the step's record."""
        policy, records, steps = self.policy, self.records, self.steps
        if self.acceptance is None:
            raise AssertionError(f"{policy.name} scheduled draft tokens without an acceptance model")
        rejected, proposed, accepted = verify_drafts(plan, records, self.acceptance.draw)
        policy.reject_drafts(plan, rejected)
        finished = emit_caught_up(plan.scheduled, records, len(steps), now)
        policy.finish_step(plan, finished)
        for req in finished:
            self._end(records[req.id], "finished")
        steps.append(now, start, dt, policy, shape, plan, len(finished), flops, bytes_, swap_s, recomputed,
                     proposed, accepted)

    # --- one step in two halves, for a lockstep group (sim.lockstep) --------------------------
    def plan_step(self, start: float):
        """(the step to run or None, whether to schedule again at once): the first half of
        :meth:`loop`'s step, for a :class:`sim.lockstep.LockstepGroup`."""
        policy, records = self.policy, self.records
        if not policy.has_work():
            return None, False
        plan = policy.schedule()
        for req in plan.rejected:
            self._end(records[req.id], "rejected", req.reject_reason or "rejected by the policy")
        if plan.is_empty:
            if plan.rejected or plan.preempted:
                return None, True
            if self.arrivals_done:
                for req in policy.drain():
                    self._end(records[req.id], "unfinished", "stuck: the policy cannot schedule it")
            return None, False
        return self._price_plan(plan, start), False

    def _price_plan(self, plan: StepPlan, start: float):
        """A scheduled step's records at its start and its price: (dt, plan, shape, flops, bytes,
        swap seconds, recomputed tokens), what :meth:`finish_planned` takes at its end."""
        records, latency = self.records, self.latency
        for req in plan.admitted:
            records[req.id].mark_admitted(start)
        if plan.prefix_hit_tokens:  # prefix-cache hits (any tier) of the requests admitted
            for rid, n in plan.prefix_hit_tokens.items():
                records[rid].prefix_hit_tokens += n
        shape = fast_step_shape(plan)
        if plan.spec_tokens is not None:
            shape.spec_tokens = sum(plan.spec_tokens)
        if plan.scheduled or not (plan.kv_loads or plan.kv_store_s):
            dt, flops, bytes_ = latency.price(shape, plan)
        else:  # only tier copies in flight: no forward pass to price (kv_load_step times the copy)
            dt, flops, bytes_ = 0.0, 0.0, 0.0
        recomputed = 0
        if shape.prefill_tokens or plan.preempted:  # only prefill chunks can recompute
            recomputed, pairs = self.recompute.observe(plan)
            if recomputed:  # time spent, not useful work: MFU leaves it out
                flops -= latency.recompute_flops(recomputed, pairs)
        swap_s = 0.0
        if plan.swap_out_blocks or plan.swap_in_blocks:
            swap_s = latency.swap_time(plan.swap_out_blocks + plan.swap_in_blocks)
            dt += swap_s
        if plan.kv_loads or plan.kv_store_s:  # KV moved to or from a tier below the GPU (policies.kv)
            dt = kv_load_step(plan, records, dt)
        return dt, plan, shape, flops, bytes_, swap_s, recomputed

    def finish_planned(self, item, start: float, now: float, dt: float) -> None:
        """The second half: the step ended at ``now`` after the group's ``dt``."""
        _own, plan, shape, flops, bytes_, swap_s, recomputed = item
        if plan.spec_tokens is not None:
            self.calendar = None
            self._verified_step(plan, now, start, dt, shape, flops, bytes_, swap_s, recomputed)
            return
        cal = self.calendar
        nd = plan.num_decodes
        if cal is not None and nd and len(cal.heap) == nd:
            finished = self._calendar_step(cal, plan, nd, now)
        else:
            self.calendar = None
            finished = emit_step_tokens(plan.scheduled, self.records, len(self.steps), now, None, nd)
        self.policy.finish_step(plan, finished)
        if self.calendar is not None and len(self.calendar.heap) != self.policy.num_running:
            self.calendar = None  # someone runs that is not in it (admitted, not scheduled)
        for req in finished:
            self._end(self.records[req.id], "finished")
        self.steps.append(now, start, dt, self.policy, shape, plan, len(finished), flops, bytes_, swap_s, recomputed)

    def _calendar_step(self, cal: FinishCalendar, plan: StepPlan, nd: int, now: float) -> list[Request]:
        """``emit_step_tokens`` for a bulk step whose decodes are the calendar's members (every
        running request, each of which emitted at the last step): each emits one token, continuing
        its run, and those the calendar has at this tick finish; the admitted rest is emitted as
        usual and joins the calendar if it emitted (else the calendar is dropped)."""
        scheduled, records = plan.scheduled, self.records
        whole = nd == len(scheduled)
        for req in scheduled if whole else scheduled[:nd]:
            req.num_output_tokens += 1
        finished = cal.advance(1)
        for req in finished:
            req.status = Status.FINISHED
            records[req.id].finish_s = now
        if whole:
            return finished
        rest = scheduled[nd:]
        outs = [r.num_output_tokens for r in rest]
        finished += emit_step_tokens(rest, records, len(self.steps), now)
        for req, out in zip(rest, outs):
            if req.num_output_tokens == out:  # did not emit (a prefill chunk): its run stops here
                self.calendar = None
                break
            if req.status is not Status.FINISHED:
                cal.enter(req, records[req.id].finish_at - req.num_output_tokens)
        return finished

    # --- fast-forward ---------------------------------------------------------------------------
    def _chain_stretches(self, batch: list[Request], context: int):
        """Stretches one after another, applied now, for one timeout: (its delay, how many of the
        last rows the next arrival's waiting count goes into (0: it does not come in the timeout),
        the requests that finish in the last step), or None when not even one stretch qualifies.
        Where nothing can observe the replica before the next arrival (``cross_arrivals``: no
        closed loop, one replica or a router that reads no KV state), a stretch that ends with
        finishes is followed at once by the stretch the policy offers next, from the same clock,
        as the loop would after a timeout: the same steps, the same state, one SimPy event for
        all. Those requests end at once (nothing reads their end before the arrival); a last step
        containing the arrival is applied now too (the arrival only queues), its finishes and its
        row's waiting count after it. With a policy that admits a step late, the stretch may end
        one step after the one containing the arrival (:meth:`_prepare_stretch`): its finishes
        and the waiting count of its last two rows after the arrival, and the policy told
        (``Policy.arrivals_behind``, until the timeout ends)."""
        now = self.env.now
        t = now
        delay = None
        while True:
            prepared = self._prepare_stretch(batch, context, t)
            if prepared is None:
                break
            d, batch, k, times, dts, flops, bytes_, waiting, late = prepared
            crossed = waiting is not None
            finishing = self._apply_stretch(batch, k, times, dts, flops, bytes_, None, crossed)
            delay = d
            if crossed:
                if late:  # the arrival falls in the step before the last (_prepare_stretch)
                    self.policy.arrivals_behind = 1
                    return delay, 2, finishing
                return delay, 1, finishing
            if not finishing:  # stopped by KV memory, MAX_STRETCH or a landing: a step is scheduled next
                break
            t = float(times[k])
            following = self.policy.decode_stretch()
            if following is None:
                break
            batch, context = following
        return None if delay is None else (delay, 0, ())

    def _prepare_stretch(self, batch: list[Request], context: int, start: float | None = None):
        """Decide how many pure-decode steps to apply at once, price them and find where the
        clock lands; None when fewer than MIN_STRETCH steps qualify.

        Every step but the last ends strictly before the next arrival. The last may contain it
        (start before it, end after it: ``cross_arrivals``) where nothing the arrival does reads
        what the stretch changes: stepped one by one, that step was scheduled before the arrival
        and ends after it, and the arrival only queues a request (``Policy.stretch_past_arrivals``)
        and asks a router that reads no KV state; the one figure it changes, the waiting count,
        goes into the last step's row only. Where arrivals may be crossed, a stretch may be one step
        long: the step an arrival falls in (it saves the scheduled decode step that every arrival
        otherwise costs), or the step in which a request finishes, which the chain of stretches
        then goes on from in the same timeout (scheduled alone, it is a bulk step and a timeout).

        With a policy that admits a request arriving during a step only in the step after next
        (``Policy.admits_a_step_late``), the step after the one the arrival falls in is the same
        pure decode whether it comes or not: the stretch takes it too (``late``) where it ends
        strictly before the arrival after next (``arrival_after_next``: nothing else arrives
        until then) and the horizon, and nobody finishes in the arrival's step; the policy is
        then told that the arrival came one step before the last (``Policy.arrivals_behind``)."""
        env, sim = self.env, self.simulation
        origin = env.now  # where SimPy's clock is: the timeout is added to it
        now = origin if start is None else start  # where this stretch starts (later in a chain)
        arrival = sim.next_arrival_at
        horizon = sim.horizon_s if sim.horizon_s is not None else math.inf
        bound = arrival if arrival < horizon else horizon
        cross = self.cross_arrivals and arrival < horizon and arrival > now
        b = len(batch)
        # a cheap bound from the next step's time (step times grow with the context)
        pricer = self.pricer
        step_time = pricer.step_time
        dt1 = step_time(b, context + b) if step_time is not None else pricer.first_step_time(b, context)
        if not dt1 > 0:
            return None
        room = bound - now
        least = 1 if cross else MIN_STRETCH
        if not cross and room < MIN_STRETCH * dt1:
            return None
        # the step after the arrival's one too (a policy that admits a step late), up to here
        after = sim.arrival_after_next if cross and self.policy.admits_a_step_late else None
        # steps that can end before the bound, and with ``cross`` the one after them (and the next)
        k = MAX_STRETCH if room == math.inf else \
            min(MAX_STRETCH, int(room / dt1) + 1 + cross + (after is not None))
        # no request may finish before the stretch's last step: stop at the first one's last token
        cal = self.calendar
        if cal is not None and len(cal.heap) == b == self.policy.num_running:
            margin = cal.margin(k)  # the least finish_at - num_output_tokens of the batch
            if margin < k:
                k = margin
                if k < least:
                    return None
        else:
            records = self.records
            for req in batch:
                margin = records[req.id].finish_at - req.num_output_tokens
                if margin < k:
                    k = margin
                    if k < least:
                        return None
        k = self.policy.decode_stretch_limit(batch, k)
        if k < least:
            return None
        if k <= SHORT_STRETCH and pricer.steps is not None:
            # a short stretch in plain floats (NumPy's cost per call exceeds the loop's): the same
            # sums in the same order, and the clock added up one step at a time as SimPy adds it
            dts, flops, bytes_ = pricer.steps(b, context, k)
            times = [now]
            t = now
            late = False
            for dt in dts:
                t += dt
                if not t < bound:  # this step and the later ones end at or after the bound
                    if cross and t > arrival and t < horizon:
                        times.append(t)  # the step the arrival falls in, strictly inside it
                        j = len(times) - 1  # the index in dts of the step after it
                        if after is not None and j < len(dts):
                            t += dts[j]
                            if t < after and t < horizon:  # and the step after it
                                times.append(t)
                                late = True
                    break
                times.append(t)
            k = len(times) - 1
        else:
            dts, flops, bytes_ = pricer.price(batch, context, k)
            times = np.empty(k + 1, dtype=np.float64)
            times[0] = now
            times[1:] = dts
            np.cumsum(times, out=times)  # sequential: now + dt1, then + dt2, ... as SimPy adds them
            # every step must end strictly before the next arrival and the horizon
            n = int(np.searchsorted(times[1:], bound, side="left"))
            late = False
            if cross and n < k and times[n + 1] > arrival and times[n + 1] < horizon:
                n += 1
                if after is not None and n < k and times[n + 1] < after and times[n + 1] < horizon:
                    n += 1
                    late = True
            k = n
        crossing = cross and times[k] > arrival
        if k < (1 if cross else MIN_STRETCH):
            return None
        while True:  # SimPy lands at now + delay: find a delay that lands exactly at the k-th end
            delay = landing_delay(origin, float(times[k]))
            if delay is not None:
                break
            k -= 1  # rare: no float delay lands there; the last step is then taken normally
            if late:  # the arrival's step is the last one now
                late = False
                continue
            crossing = False
            if k < MIN_STRETCH:
                return None
        waiting = self.policy.num_waiting if crossing else None  # the rows before the arrival's
        return delay, batch, k, times[: k + 1], dts[:k], flops[:k], bytes_[:k], waiting, late

    def _stretch_pass(self, batch, k, times) -> list[Request]:
        """A stretch's runs and finishes, request by request: each request's run goes on or
        starts (a first token) or breaks, and those that reach their ``finish_at`` in the last step
        are returned in batch order. Where the batch is every running request, the others go
        into a new finish calendar."""
        records = self.records
        step = len(self.steps)  # the stretch's first step on this replica
        first_time = None
        finishing = []
        entries = [] if self.keep_calendar and len(batch) == self.policy.num_running else None
        for rank, req in enumerate(batch):
            out = req.num_output_tokens
            rec = records[req.id]
            if out == 0:  # a 1-token prompt remainder: its first token comes with the first step
                if first_time is None:
                    first_time = float(times[1])
                rec.first_token_s = first_time
                rec.run_step = step
                rec.run_tok = 0
            elif step - rec.run_step != out - rec.run_tok:
                rec.break_run(step, out)
            margin = rec.finish_at - out - k
            if margin <= 0:  # only in the last step (see _prepare_stretch)
                finishing.append(req)
            elif entries is not None:
                entries.append((margin, rank, req))
        self.calendar = None if entries is None else FinishCalendar(entries, len(batch))
        return finishing

    def _apply_stretch(self, batch, k, times, dts, flops, bytes_, waiting_before, defer_ends=False):
        """The stretch's steps on the policy, the records and the step rows; the requests that
        finish in its last step end here, or with ``defer_ends`` are returned for the caller to
        end."""
        policy, records, steps = self.policy, self.records, self.steps
        last_time = float(times[k])
        b = len(batch)  # batch may be the policy's own running list: finish_step changes it
        cal = self.calendar
        if cal is not None and len(cal.heap) == b == policy.num_running:
            # every request emitted at the last step (its run goes on) and the calendar knows
            # who finishes in the last one
            finishing = cal.advance(k)
        else:
            finishing = self._stretch_pass(batch, k, times)
        kv_used, reserved, stored = policy.advance_decodes(batch, k)
        running, waiting = policy.num_running, policy.num_waiting
        if finishing:  # the last step ends these requests, as a single step would
            last = StepPlan(scheduled=list(batch), num_new_tokens=[1] * b,
                            context=[r.num_computed_tokens - 1 for r in batch]) \
                if policy.finish_step_reads_plan else UNREAD_PLAN
            for req in finishing:
                req.status = Status.FINISHED
                records[req.id].finish_s = last_time
            policy.finish_step(last, finishing)
            if not defer_ends:
                for req in finishing:
                    self._end(records[req.id], "finished")
            kv_used[-1] = policy.kv_blocks_used()
            reserved[-1], stored[-1] = policy.kv_tokens_reserved_and_used()
        self.stretches += 1
        self.stretch_steps += k
        crossed = waiting_before is not None and waiting_before != waiting  # arrivals in the last step
        steps.extend_decodes(times, dts, running, waiting_before if crossed else waiting, b, kv_used,
                             policy.cpu_blocks_used(), reserved, stored, flops, bytes_, len(finishing),
                             policy.num_running)
        if crossed:
            steps.set_last_waiting(waiting)
        return finishing


def kv_load_step(plan: StepPlan, records, dt: float) -> float:
    """The step's duration with its KV loads (their copies one after another on the host link):
    overlapped with the step's compute (vLLM's native offloading: the step lasts at least the
    loads) or added to it (LMCache's synchronous load), or layer by layer beside the forward pass
    (SGLang's HiCache: :func:`policies.kv.hiradix.layerwise_overlap`); plus the copies to the host
    the step waited for (HiCache's write-back); each request's load on its record."""
    load_s = 0.0
    for rid, (tokens, seconds) in (plan.kv_loads or {}).items():
        rec = records[rid]
        rec.tier_hit_tokens += tokens
        rec.kv_load_s += seconds
        load_s += seconds
    store = plan.kv_store_s  # the scheduler waited for these before the step was launched
    if not plan.scheduled:  # only copies in flight: the step is the copy
        return load_s + store
    if plan.kv_load_layers:
        return store + layerwise_overlap(dt, load_s, plan.kv_load_layers)
    return store + (max(dt, load_s) if plan.kv_load_async else dt + load_s)


def landing_delay(now: float, target: float) -> float | None:
    """A delay ``d >= 0`` with ``now + d == target`` in floating point (SimPy schedules a timeout
    at ``now + delay``), or None when no float delay lands there (the sum can round past
    ``target`` from both sides when ``target > 2 * now``)."""
    d = target - now
    if now + d == target:
        return d
    for direction in (math.inf, -math.inf):
        e = d
        for _ in range(4):
            e = math.nextafter(e, direction)
            if now + e == target and e >= 0:
                return e
    return None


def fast_step_shape(plan: StepPlan) -> StepShape:
    """``step_shape(plan)``, with the decodes (one new token on a non-empty context) summed by
    builtins and only the prefill chunks visited one by one, in batch order as there. The plan's
    leading ``num_decodes`` requests are decodes (the policy says so): only the rest are looked at."""
    nn = plan.num_new_tokens
    ctx = plan.context
    nd = plan.num_decodes
    if nd:
        if nd == len(nn):
            return decode_step_shape(plan)
        total_ctx = sum(ctx)
        prefill_tokens = prefill_ctx = 0
        prefill_attn = 0.0
        decodes = nd
        for i in range(nd, len(nn)):
            n, c = nn[i], ctx[i]
            if n == 1 and c > 0:
                decodes += 1
            else:
                prefill_tokens += n
                prefill_attn += n * (c + (n + 1) / 2)
                prefill_ctx += c
        return _shape(plan, total_ctx, prefill_tokens, prefill_ctx, prefill_attn, decodes)
    if not nn or min(ctx) <= 0:
        return step_shape(plan)
    total_ctx = sum(ctx)
    prefill_tokens = prefill_ctx = 0
    prefill_attn = 0.0
    if min(nn) == 1 == max(nn):
        decodes = len(nn)
    else:
        decodes = nn.count(1)
        for i in [i for i, n in enumerate(nn) if n != 1]:
            n, c = nn[i], ctx[i]
            prefill_tokens += n
            prefill_attn += n * (c + (n + 1) / 2)
            prefill_ctx += c
    return _shape(plan, total_ctx, prefill_tokens, prefill_ctx, prefill_attn, decodes)


def decode_step_shape(plan: StepPlan) -> StepShape:
    """The shape of a plan of decodes only (``num_decodes`` covers the batch)."""
    total_ctx = sum(plan.context)
    b = len(plan.num_new_tokens)
    return _shape(plan, total_ctx, 0, 0, 0.0, b)


def _shape(plan: StepPlan, total_ctx: int, prefill_tokens: int, prefill_ctx: int, prefill_attn: float,
           decodes: int) -> StepShape:
    nn = plan.num_new_tokens
    kv_read = total_ctx + sum(nn) + plan.padding_context
    return StepShape(num_tokens=prefill_tokens + decodes + plan.padding_tokens, num_seqs=len(plan.scheduled),
                     prefill_tokens=prefill_tokens, decode_tokens=decodes, prefill_attn=prefill_attn,
                     decode_ctx=total_ctx - prefill_ctx + decodes + plan.padding_context, kv_tokens_read=kv_read,
                     padding_tokens=plan.padding_tokens, padding_ctx=plan.padding_context)


class DecodePricer:
    """Prices ``k`` consecutive pure-decode steps of a batch, each exactly as the latency model
    prices that step alone. Step ``j`` (1-based) of a batch of ``b`` requests whose contexts sum
    to ``C`` has decode context ``C + b·j`` (keys read: each request's context plus its new token).

    A latency model may provide ``price_decodes(num_seqs, context, k) -> (seconds, flops,
    bytes)`` (arrays), as the roofline and table models do. The constant model is priced here with
    NumPy, term by term as its ``price`` computes one step (checked against it on the last step of
    every stretch). Any other model is priced one step at a time through its own ``price``."""

    def __init__(self, latency: LatencyModel) -> None:
        from sim.latency.constant import ConstantLatency

        self.latency = latency
        self.custom = getattr(latency, "price_decodes", None)
        self.kind = "constant" if type(latency) is ConstantLatency else None
        # a model's scalar price of one decode step (the roofline's: no StepShape, no loop over
        # its operators), the same float as its price of that step
        self.step_time = getattr(latency, "decode_step_time", None)
        # the model's price of a short stretch as lists (the roofline's ``decode_steps``): the same
        # floats as ``price_decodes``
        self.steps = getattr(latency, "decode_steps", None)

    @staticmethod
    def shape(b: int, context: int, j: int) -> StepShape:
        d = context + b * j
        return StepShape(num_tokens=b, num_seqs=b, prefill_tokens=0, decode_tokens=b, prefill_attn=0.0,
                         decode_ctx=d, kv_tokens_read=d)

    def first_step_time(self, b: int, context: int) -> float:
        if self.step_time is not None:
            return self.step_time(b, context + b)
        return self.latency.price(self.shape(b, context, 1), None)[0]

    def price(self, batch: list[Request], context: int, k: int):
        b = len(batch)
        if self.custom is not None:
            dts, flops, bytes_ = self.custom(b, context, k)
            return np.asarray(dts, dtype=np.float64), np.asarray(flops), np.asarray(bytes_)
        if self.kind is not None:
            out = self._vectorized(b, context, k)
            if out is not None:
                return out
        return self._stepwise(batch, context, k)

    def _vectorized(self, b: int, context: int, k: int):
        lat = self.latency
        d = context + b * np.arange(1, k + 1, dtype=np.int64)  # decode_ctx = kv_tokens_read
        # LatencyModel.step_flops_bytes, term by term
        flops = lat._flops_per_token * b + lat._attn_flops_per_pair * (0.0 + d)
        bytes_ = lat._weight_bytes + lat.kv_bytes_per_token * (d + b) + lat._act_bytes_per_token * b
        dts = np.full(k, lat.step_s, dtype=np.float64)
        # the model's own price of the last step must agree (a guard against drift)
        dt, f, by = lat.price(self.shape(b, context, k), None)
        if not (dt == dts[-1] and f == flops[-1] and by == bytes_[-1]):
            self.kind = None  # the model changed under us: price step by step from now on
            return None
        return dts, flops, bytes_

    def _stepwise(self, batch: list[Request], context: int, k: int):
        lat = self.latency
        b = len(batch)
        ctx0 = [r.num_computed_tokens for r in batch]
        dts, flops, bytes_ = np.empty(k), [], []
        for j in range(k):
            plan = StepPlan(scheduled=list(batch), num_new_tokens=[1] * b, context=[c + j for c in ctx0])
            dt, f, by = lat.price(step_shape(plan), plan)
            dts[j] = dt
            flops.append(f)
            bytes_.append(by)
        return dts, np.asarray(flops), np.asarray(bytes_)


class Simulation:
    """Runs one policy configuration (N identical replicas behind a router) over a workload."""

    def __init__(self, specs: Sequence[RequestSpec], replicas: Sequence[tuple[Policy, LatencyModel]],
                 max_model_len: int, router: Router | None = None, horizon_s: float | None = None,
                 on_progress: Callable[[int], None] | None = None, fast_forward: bool | None = None,
                 horizon_reason: str = HORIZON_REACHED, clients: SendPlan | ClosedLoop | None = None,
                 drain_s: float | None = None, cap_reason: Callable[[float], str] | None = None,
                 acceptance=None, lockstep: int = 1, compact: bool = False, release_specs: bool = False):
        """``clients``: closed-loop clients and sessions send the specs during the run instead of
        at their arrival times (:mod:`sim.clients`); without ``horizon_s`` time then stops ``drain_s``
        after the last send at the latest (the requests left get ``cap_reason(cap)``). ``acceptance``:
        the draws of accepted draft tokens when the policies speculate (:mod:`sim.speculative.acceptance`).
        ``lockstep`` > 1: consecutive groups of that many replicas are the data-parallel ranks of
        one MoE engine, stepping together (:mod:`sim.lockstep`). ``compact``: each request's record
        is written to the recorder's table when it ends and let go (open loops only: clients read
        the records); ``release_specs``: so is its entry of ``specs`` (the caller's list, which it
        is done with: :func:`sim.runner.run_policy`'s ``release``)."""
        self.env = simpy.Environment()
        self.specs = specs
        compact = compact and clients is None
        self.recorder = Recorder(compact, specs if compact and release_specs and isinstance(specs, list) else None)
        self.compact = compact
        self.horizon_s = horizon_s
        self.horizon_reason = horizon_reason  # why requests still held at horizon_s are unfinished
        self.cap_reason = cap_reason
        self.next_arrival_at = math.inf  # event time of the next arrival not yet handed out
        self.arrival_after_next = math.inf  # and of the one after it (arrivals_on_the_clock)
        if fast_forward is None:
            fast_forward = fast_forward_default()
        self.fast_forward = fast_forward
        if compact:  # each record made as its request arrives (arrivals()), let go when it ends
            self.records = [None] * len(specs)
            self._own = shareable_tokens(specs)
            self.recorder.expect(specs, self.records)
        else:
            self.records = [RequestRecord(s) for s in specs]
            for rec, own in zip(self.records, shareable_tokens(specs)):
                rec.shareable = own
            self.recorder.add_requests(self.records)
        self.clients = None
        if clients is not None:
            from sim.clients import ClientClock, Clients, stamp_record

            self.clients = Clients(self.env, clients, self.records, stamp_record, self._route, self._arrivals_over,
                                   drain_s if horizon_s is None else None)
            clocks = [ClientClock(self, self.clients, lambda: self.replicas, i) for i in range(len(replicas))]
        else:
            clocks = [self] * len(replicas)
        self.replicas = [
            Replica(self.env, i, pol, lat, self.recorder, max_model_len, on_progress, clocks[i], fast_forward,
                    acceptance, start=lockstep <= 1)
            for i, (pol, lat) in enumerate(replicas)
        ]
        if lockstep > 1:
            from sim.lockstep import LockstepGroup

            self.groups = [LockstepGroup(self.env, self.replicas[i:i + lockstep])
                           for i in range(0, len(self.replicas), lockstep)]
        if self.clients is not None:
            for rep in self.replicas:
                rep.on_end = self.clients.freed
            if self.clients.sent == self.clients.n:  # nothing to send at all
                self._arrivals_over()
        self.router = router or round_robin()
        # a stretch's last step may contain an arrival where the arrival reads nothing the stretch
        # changes: no closed loop (its sends follow ends), no lockstep, one replica or a router that
        # reads no KV state, and a policy whose add_request only queues (Replica._prepare_stretch)
        cross = (self.clients is None and lockstep <= 1
                 and (len(self.replicas) == 1 or getattr(self.router, "reads_kv_state", True) is False))
        for rep in self.replicas:
            rep.cross_arrivals = (cross and rep.fast_forward
                                  and getattr(type(rep.policy), "stretch_past_arrivals", False))
        if self.clients is None:
            self.env.process(self.arrivals())

    def arrivals(self):
        yield from arrivals_on_the_clock(self.env, self, self._arriving() if self.compact else self.records,
                                         self._route)
        self._arrivals_over()

    def _arriving(self):
        """The records of a compact run, each made when the arrivals reach its spec."""
        records, own = self.records, self._own
        for i, spec in enumerate(self.specs):
            rec = RequestRecord(spec)
            rec.shareable = own[i]
            rec.index = i
            records[i] = rec
            yield rec

    def _arrivals_over(self) -> None:
        for rep in getattr(self, "replicas", ()):  # closed loop with no requests: before the replicas exist
            rep.arrivals_done = True
            rep._kick()

    def _route(self, rec: RequestRecord) -> None:
        self.replicas[self.router(rec.spec, self.replicas)].submit(rec)

    def run(self) -> Recorder:
        if self.horizon_s is not None:
            self.env.run(until=self.horizon_s)
        else:
            self.env.run()
        if self.compact:  # the requests that never arrived get their records now, to be explained
            self.recorder.open_the_rest(self._own)
        stop = self.clients.stopped_at if self.clients is not None else None
        if stop is not None:  # the closed loop's moving time cap (sim.clients)
            reason = self.cap_reason(stop) if self.cap_reason is not None else self.horizon_reason
            explain_unfinished(self.records, stop, reason)
        else:
            explain_unfinished(self.records, self.horizon_s, self.horizon_reason)
        return self.recorder

    def release_records(self) -> None:
        """After the frames are built: drop this run's per-request records (the recorder's too),
        so they are freed before the summary is computed rather than with the run."""
        self.records.clear()  # the same list the arrivals process and the clients walk
        self.recorder.records.clear()

    @property
    def end_s(self) -> float | None:
        """Where a closed loop's time cap stopped the run (None: it did not)."""
        return self.clients.stopped_at if self.clients is not None else None
