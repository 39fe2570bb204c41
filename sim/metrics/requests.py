"""Per-request records: what happened to each request, and the per-step token emission.

Why a module of its own: a :class:`RequestRecord` is the engine's bookkeeping for one request
(its scheduler state while it runs, its times, its token-time *runs*), and
:func:`emit_step_tokens` is the one place where both engines (``sim.engine``, ``calib.engine``)
emit tokens and decide which requests are done; the frames and statistics built from the
records at the end live elsewhere (``sim.metrics.recorder``, ``sim.metrics.token_times``).
"""

from __future__ import annotations

from array import array

from policies.base import Request, Status
from sim.metrics.steps import ReplicaSteps

HORIZON_REACHED = "horizon reached"  # the reason of requests still held when simulated time stops
_NAN = float("nan")  # one object for every time not reached yet (not three floats per request)
_FINISHED = Status.FINISHED


class RequestRecord:
    """What happened to one request (seconds of simulated time; NaN = never happened)."""

    __slots__ = (
        "spec",
        "replica",
        "admitted_s",
        "first_token_s",
        "finish_s",
        "state",
        "reason",
        "refused",
        "req",
        # engine bookkeeping: the token count that ends the request, and the token-time runs
        "finish_at",
        "run_step",
        "run_tok",
        "runs",
        "steps",
        "_generated",
        "_preemptions",
        "_swaps",
        "shareable",
        # speculative decoding: steps that verified drafts, drafts proposed and accepted, and the
        # request's own acceptance draws (sim.speculative.acceptance)
        "spec_steps",
        "spec_proposed",
        "spec_accepted",
        "spec_rng",
        # KV tiers below the GPU (policies.kv.tiers): tokens loaded from them, seconds of copying
        "tier_hit_tokens",
        "kv_load_s",
        "prefix_hit_tokens",
        "index",  # the request's row in its recorder (sim.metrics.request_table)
    )

    def __init__(self, spec, replica: int = 0) -> None:
        self.spec = spec
        self.replica = replica
        self.admitted_s = _NAN
        self.first_token_s = _NAN
        self.finish_s = _NAN
        self.state = "unfinished"
        self.reason = ""
        self.refused = False  # rejected for the load at the time (policies.base.Request.refused)
        self.req: Request | None = None
        self.finish_at = 0
        self.run_step = 0  # replica step of the current run's first token
        self.run_tok = 0  # index of the current run's first token
        self.runs: list[tuple[int, int]] | None = None  # closed runs: (first step, tokens)
        self.steps: ReplicaSteps | None = None
        self._generated = 0
        self._preemptions = 0
        self._swaps = 0
        self.shareable: int | None = None  # Request.shareable_tokens (sim.workload.sharing)
        self.spec_steps = 0
        self.spec_proposed = 0
        self.spec_accepted = 0
        self.spec_rng = None
        self.tier_hit_tokens = 0
        self.kv_load_s = 0.0
        self.prefix_hit_tokens = 0  # prompt tokens not computed at admission: GPU and tier hits
        self.index = -1

    @property
    def generated(self) -> int:
        """Tokens emitted so far (the request's ``num_output_tokens``)."""
        return self.req.num_output_tokens if self.req is not None else self._generated

    @property
    def preemptions(self) -> int:
        return self.req.num_preemptions if self.req is not None else self._preemptions

    @property
    def swaps(self) -> int:
        return self.req.num_swaps if self.req is not None else self._swaps

    def open(self, seq: int, max_model_len: int, replica: int = 0, steps: ReplicaSteps | None = None) -> Request:
        """The request's scheduler state (a :class:`Request`, handed to a policy), and when it is
        done: once it has emitted its true output length, ``max_tokens``, or reached
        ``max_model_len`` (emitted tokens are ``num_output_tokens``: the engine is the only emitter)."""
        s = self.spec
        req = Request(s.id, s.arrival_s, s.prompt_tokens, s.max_tokens, s.priority, s.prompt_runs,
                      s.output_key, seq=seq, shareable_tokens=self.shareable)
        self.req = req
        self.replica = replica
        self.steps = steps
        self.finish_at = min(s.output_tokens, s.max_tokens, max_model_len - s.prompt_tokens)
        return req

    def mark_admitted(self, now: float) -> None:
        """A policy admitted the request; ``admitted_s`` keeps the first admission."""
        if self.admitted_s != self.admitted_s:  # NaN: not admitted before
            self.admitted_s = now

    def end(self, state: str, reason: str = "") -> None:
        """The request has ended (finished, rejected or unfinished): keep its counters and let its
        scheduler state go."""
        self.state = state
        self.reason = reason
        if state == "rejected" and self.req is not None:
            self.refused = bool(self.req.refused)
        self.release()

    def break_run(self, step: int, token: int) -> None:
        """Token ``token`` is emitted at ``step``, not right after the previous token's step."""
        if self.runs is None:
            self.runs = []
        self.runs.append((self.run_step, token - self.run_tok))
        self.run_step = step
        self.run_tok = token

    def release(self) -> None:
        """The request has ended: keep its counters and let its scheduler state go."""
        req = self.req
        if req is not None:
            self._generated = req.num_output_tokens
            self._preemptions = req.num_preemptions
            self._swaps = req.num_swaps
            self.req = None

    def token_runs(self) -> list[tuple[int, int]]:
        """Every run of consecutive steps of this request's tokens: ``(first step, tokens)``."""
        out = list(self.runs) if self.runs else []
        n = self.generated - self.run_tok
        if n > 0:
            out.append((self.run_step, n))
        return out

    @property
    def token_times(self) -> array:
        """Every token's time (built from the runs and the replica's step end times)."""
        out = array("d")
        if self.steps is None:
            return out
        ends = self.steps.ends
        for first, n in self.token_runs():
            out.extend(ends[first:first + n])
        return out


def emit_step_tokens(scheduled: list[Request], records: dict[str, RequestRecord], step: int, now: float,
                     on_token=None, decodes: int = 0) -> list[Request]:
    """After step ``step`` (of one replica) ended at ``now``: ``policies.base.emit_tokens`` and the
    end-of-request test in one pass, in batch order. Every scheduled request whose prompt (plus
    earlier outputs) is fully computed emits one token, recorded in its :class:`RequestRecord`'s
    token-time runs (and passed to ``on_token(req)`` when given); those that reach their
    ``finish_at`` are marked finished at ``now`` and returned, in batch order, for
    ``policy.finish_step``. Both engines (``sim.engine`` and ``calib.engine``) step through here.

    ``decodes`` (``StepPlan.num_decodes``): the first ``decodes`` requests are decodes that
    emitted at the previous step, so each emits here and its run of consecutive steps goes on
    (nothing to record but the count); only their end is tested."""
    finished = []
    if decodes and on_token is None:
        for req in scheduled if decodes == len(scheduled) else scheduled[:decodes]:  # no index per request
            out = req.num_output_tokens + 1
            req.num_output_tokens = out
            rec = records[req.id]
            if out >= rec.finish_at:
                req.status = _FINISHED
                rec.finish_s = now
                finished.append(req)
        if decodes == len(scheduled):
            return finished
        scheduled = scheduled[decodes:]
    for req in scheduled:
        out = req.num_output_tokens
        if req.num_computed_tokens >= req.prompt_tokens + out:
            req.num_output_tokens = out + 1
            if on_token is not None:
                on_token(req)
            rec = records[req.id]
            if out == 0:
                rec.first_token_s = now
                rec.run_step = step
                rec.run_tok = 0
            elif step - rec.run_step != out - rec.run_tok:
                rec.break_run(step, out)
            if out + 1 >= rec.finish_at:
                req.status = _FINISHED
                rec.finish_s = now
                finished.append(req)
    return finished


def verify_drafts(plan, records: dict[str, RequestRecord], draw) -> tuple[list[int], int, int]:
    """After a speculative step: how many drafts of each scheduled request the target rejected.

    ``plan.spec_tokens[i]`` drafts of ``plan.scheduled[i]`` were verified; ``draw(record, d)``
    says how many of them the target accepted (a prefix, 0..d), counted in the request's record
    (vLLM counts every accepted draft in its spec-decode stats, even those past a stop).
    Returns the rejected counts in batch order (for ``Policy.reject_drafts``, which steps
    ``num_computed_tokens`` back as vLLM's ``update_from_output`` does), and the step's drafts
    verified and accepted."""
    scheduled = plan.scheduled
    rejected = [0] * len(scheduled)
    proposed = accepted = 0
    for i, d in enumerate(plan.spec_tokens):
        if d:
            rec = records[scheduled[i].id]
            a = draw(rec, d)
            rejected[i] = d - a
            rec.spec_steps += 1
            rec.spec_proposed += d
            rec.spec_accepted += a
            proposed += d
            accepted += a
    return rejected, proposed, accepted


def emit_caught_up(scheduled: list[Request], records: dict[str, RequestRecord], step: int,
                   now: float) -> list[Request]:
    """Emit, at ``now``, every token a scheduled request has computed past its outputs: a
    request whose ``num_computed_tokens`` reached ``prompt_tokens + num_output_tokens + m - 1``
    emits ``m`` tokens (``m = 1`` for a decode or a completed prefill, more after accepted drafts),
    recorded as token-time runs (tokens of one step share its end time), and stops at its
    ``finish_at``. Returns the requests that finished, in batch order."""
    finished = []
    for req in scheduled:
        out = req.num_output_tokens
        m = req.num_computed_tokens - req.prompt_tokens - out + 1
        if m <= 0:
            continue
        rec = records[req.id]
        if out + m > rec.finish_at:
            m = rec.finish_at - out
        for t in range(out, out + m):
            if t == 0:
                rec.first_token_s = now
                rec.run_step = step
                rec.run_tok = 0
            elif step - rec.run_step != t - rec.run_tok:
                rec.break_run(step, t)
        req.num_output_tokens = out + m
        if out + m >= rec.finish_at:
            req.status = _FINISHED
            rec.finish_s = now
            finished.append(req)
    return finished


def explain_unfinished(records, horizon_s: float | None, horizon_reason: str = HORIZON_REACHED) -> None:
    """When a run stops: requests that are unfinished with no reason yet were held (queued,
    running or not yet arrived) at the horizon (``horizon_reason``), or, without one, never
    scheduled. None entries are requests a compact recorder already let go (they ended)."""
    reason = horizon_reason if horizon_s is not None else "never scheduled"
    for rec in records:
        if rec is not None and rec.state == "unfinished" and not rec.reason:
            rec.reason = reason
