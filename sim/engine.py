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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import simpy

from policies.base import Policy, Request, Status, emit_tokens
from sim.latency.base import LatencyModel, step_shape
from sim.metrics import Recorder, RequestRecord
from sim.request_spec import RequestSpec

Router = Callable[[RequestSpec, Sequence["Replica"]], int]


def round_robin() -> Router:
    counter = iter(range(1 << 62))

    def route(spec, replicas):
        return next(counter) % len(replicas)

    return route


class Replica:
    """One serving engine: a policy (scheduler + KV memory) and a latency model on a clock."""

    def __init__(self, env: simpy.Environment, index: int, policy: Policy, latency: LatencyModel,
                 recorder: Recorder, max_model_len: int, on_progress: Callable[[int], None] | None = None):
        self.env = env
        self.index = index
        self.policy = policy
        self.latency = latency
        self.recorder = recorder
        self.max_model_len = max_model_len
        self.records: dict[str, RequestRecord] = {}
        self.outstanding = 0  # requests handed to this replica and not yet ended
        self.wake = env.event()
        self.arrivals_done = False
        self.on_progress = on_progress
        self.process = env.process(self.loop())

    def submit(self, rec: RequestRecord) -> None:
        s = rec.spec
        req = Request(s.id, s.arrival_s, s.prompt_tokens, s.max_tokens, s.priority, s.prompt_runs,
                      s.output_key, seq=len(self.records))
        rec.req = req
        rec.replica = self.index
        self.records[s.id] = rec
        self.outstanding += 1
        self.policy.add_request(req)
        self._kick()

    def _kick(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def _end(self, rec: RequestRecord, state: str, reason: str = "") -> None:
        rec.state = state
        rec.reason = reason
        self.outstanding -= 1
        if self.on_progress is not None:
            self.on_progress(1)

    def loop(self):
        env, policy, records = self.env, self.policy, self.records
        latency, recorder = self.latency, self.recorder
        while True:
            if not policy.has_work():
                if self.arrivals_done:
                    return
                self.wake = env.event()
                yield self.wake
                continue
            plan = policy.schedule()
            for req in plan.rejected:
                self._end(records[req.id], "rejected", req.reject_reason or "rejected by the policy")
            if plan.is_empty:
                if self.arrivals_done:
                    # nothing can run and nothing will arrive: what is left can never progress
                    for req in policy.drain():
                        self._end(records[req.id], "unfinished", "stuck: the policy cannot schedule it")
                    return
                self.wake = env.event()
                yield self.wake
                continue
            start = env.now
            for req in plan.admitted:
                rec = records[req.id]
                if rec.admitted_s != rec.admitted_s:  # first admission only (NaN check)
                    rec.admitted_s = start
            shape = step_shape(plan)
            dt, flops, bytes_ = latency.price(shape, plan)
            if plan.swap_out_blocks or plan.swap_in_blocks:
                dt += latency.swap_time(plan.swap_out_blocks + plan.swap_in_blocks)
            yield env.timeout(dt)
            now = env.now
            finished = []
            for req in emit_tokens(plan):
                rec = records[req.id]
                rec.token_times.append(now)
                rec.generated += 1
                if rec.generated == 1:
                    rec.first_token_s = now
                if (
                    rec.generated >= rec.spec.output_tokens
                    or req.num_output_tokens >= req.max_tokens
                    or req.num_tokens >= self.max_model_len
                ):
                    req.status = Status.FINISHED
                    rec.finish_s = now
                    finished.append(req)
            policy.finish_step(plan, finished)
            for req in finished:
                self._end(records[req.id], "finished")
            recorder.on_step(self.index, start, dt, plan, policy, len(finished), shape, flops, bytes_)


class Simulation:
    """Runs one policy configuration (N identical replicas behind a router) over a workload."""

    def __init__(self, specs: Sequence[RequestSpec], replicas: Sequence[tuple[Policy, LatencyModel]],
                 max_model_len: int, router: Router | None = None, horizon_s: float | None = None,
                 on_progress: Callable[[int], None] | None = None):
        self.env = simpy.Environment()
        self.specs = specs
        self.recorder = Recorder()
        self.replicas = [
            Replica(self.env, i, pol, lat, self.recorder, max_model_len, on_progress)
            for i, (pol, lat) in enumerate(replicas)
        ]
        self.router = router or round_robin()
        self.horizon_s = horizon_s
        self.records = [RequestRecord(s) for s in specs]
        for rec in self.records:
            self.recorder.add_request(rec)
        self.env.process(self.arrivals())

    def arrivals(self):
        env = self.env
        for rec in self.records:
            delay = rec.spec.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            idx = self.router(rec.spec, self.replicas)
            self.replicas[idx].submit(rec)
        for rep in self.replicas:
            rep.arrivals_done = True
            rep._kick()

    def run(self) -> Recorder:
        if self.horizon_s is not None:
            self.env.run(until=self.horizon_s)
        else:
            self.env.run()
        for rec in self.records:  # not yet arrived, or still held at the horizon
            if rec.state == "unfinished" and not rec.reason:
                rec.reason = "horizon reached" if self.horizon_s is not None else "never scheduled"
        return self.recorder
