"""Invariants every scheduling policy must keep, checked after every step, and a pure driver.

Why a separate module: the property tests (tests/test_property_policies.py) run these checks on
random workloads and knobs twice, once with the tiny driver below (the engine protocol of
policies/base.py in a loop, no SimPy) and once through ``sim.engine.Simulation`` with the
policy wrapped in :class:`Checked`. The checks read each policy's *own* accounting (vllm-v1's
block pool and block tables, v0/sarathi's ``V0BlockManager``, static/orca's contiguous
allocator), so a block created or lost anywhere shows up at the step it happened.

What is checked, after every ``schedule()``:

* blocks are conserved: free + held == total on every pool, and each block's reference count
  equals the number of block tables holding it (vllm-v1, where prefix caching shares blocks);
* only running requests hold GPU blocks; swapped requests hold CPU blocks only;
* every scheduled token has a KV slot, and no request is scheduled beyond its length
  (context + new tokens <= prompt + generated <= max_model_len), each request at most once;
* the token budget and the slot limit (max_num_seqs, static's batch size) are never exceeded;
* a recompute victim starts again from 0 and its next token comes only after prompt +
  generated tokens were computed again (prefix-cache hits aside); a swap victim keeps its
  progress and gets back exactly the blocks it swapped out;
* a prefix-cache hit (a request starting afresh at a context > 0) is legal only with the
  policy's cache on, in whole pages of that cache (vllm-v1: engine blocks; sglang's page_size,
  tgi's block_size: 1 token by default; TGI's full-prompt match backs off one token), short of
  all the request's tokens, equal to what the policy reports (``plan.prefix_hit_tokens``, ``admission_hits``),
  and only of tokens with the same identities that some request computed before: in an earlier
  step (its own tokens before a preemption count) or earlier in the same batch (vLLM V1 caches
  a block when it allocates it, and a forward writes each layer's KV before attention reads
  it): a cache can only serve what was computed;
* every rejection carries a reason.

At the end: every request is finished (with the right number of tokens) or rejected with a
reason, nothing is left queued, every block is free, swapped blocks all came back, and a
request that fits comfortably (prompt + max_tokens within every limit) was never rejected,
unless it was refused at arrival with TGI's 429 while ``max_concurrent_requests`` requests
were already queued or running.
"""

from __future__ import annotations

from collections import Counter

from policies.base import EngineLimits, Policy, Request, Status, StepPlan, emit_tokens
from policies.kv.paged import PagedKVManager
from policies.kv.radix import RadixCache
from policies.reservation import ReservationPolicy
from policies.static import StaticPolicy
from policies.tgi import TgiPolicy
from policies.trtllm import TrtllmPolicy
from policies.vllm_v0 import VllmV0Policy
from policies.vllm_v1 import VllmV1Policy


class InvariantError(AssertionError):
    pass


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def token_ids(req: Request, n: int) -> tuple:
    """The identities of a request's first ``n`` tokens (prompt runs, then generated tokens), as
    policies/base.py defines them: the checker's own reading, independent of any cache's."""
    out: list = []
    for key, length in req.prompt_runs:
        out.extend((key, i) for i in range(min(length, n - len(out))))
        if len(out) >= n:
            return tuple(out)
    out.extend((req.output_key, j) for j in range(n - len(out)))
    return tuple(out)


def _radix(policy) -> RadixCache | None:
    cache = getattr(policy, "cache", None)
    return cache if isinstance(cache, RadixCache) else None


def _paged(policy) -> PagedKVManager | None:
    """The block-table KV manager of vllm-v1 and trtllm (blocks of its own block_size)."""
    kv = getattr(policy, "kv", None)
    return kv if isinstance(kv, PagedKVManager) else None


def prefix_cache_of(policy, limits: EngineLimits) -> tuple[bool, int]:
    """(cache on?, page size of its hits): a block-hash cache (vllm-v1, trtllm) hits whole blocks of
    its KV manager, a radix cache (sglang, tgi) whole pages of its own."""
    radix = _radix(policy)
    if radix is not None:
        return radix.enabled, radix.page_size
    paged = _paged(policy)
    if paged is not None:
        return paged.enable_caching, paged.block_size
    return bool(getattr(policy, "knobs", {}).get("enable_prefix_caching", False)), limits.block_size


class InvariantChecker:
    """Watches one policy instance; call :meth:`after_schedule` and :meth:`after_step` each step."""

    def __init__(self, policy, limits: EngineLimits, true_out: dict[str, int]):
        self.policy = policy
        self.limits = limits
        self.true_out = true_out  # the engine's secret: how many tokens each request generates
        self.requests: dict[str, Request] = {}
        self.computed: dict[str, int] = {}  # tokens computed since the last recompute reset
        self.swapped_blocks: dict[str, int] = {}  # swapped-out request -> CPU blocks it holds
        self.swap_out_total = 0
        self.swap_in_total = 0
        self.swap_lost_to_rejection = 0
        self.outputs_before: dict[str, int] = {}
        self.steps = 0
        self.seen = Counter()  # what happened (preempted, swapped, rejected, prefix hit), for coverage
        self.caching, self.hit_page = prefix_cache_of(policy, limits)
        self.high_water: dict[str, int] = {}  # most tokens a request ever had computed (KV written)
        self.load_at_arrival: dict[str, int] = {}  # requests queued or running when it arrived

    # --- bookkeeping -------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        assert req.id not in self.requests, f"{req.id} submitted twice"
        self.requests[req.id] = req
        self.computed[req.id] = 0
        self.high_water[req.id] = 0
        self.load_at_arrival[req.id] = self.policy.num_running + self.policy.num_waiting

    def _fail(self, msg: str) -> None:
        raise InvariantError(f"{self.policy.name} step {self.steps}: {msg}")

    # --- after schedule() ----------------------------------------------------------------------
    def after_schedule(self, plan: StepPlan) -> None:
        pol, lim = self.policy, self.limits
        self.check_blocks()
        seen = set()
        self.seen["preempted"] += len(plan.preempted)
        self.seen["swapped"] += len(plan.swapped_out)
        self.seen["rejected"] += len(plan.rejected)
        for req in plan.rejected:
            if req.status is not Status.REJECTED or not req.reject_reason:
                self._fail(f"{req.id} rejected without status/reason ({req.status}, {req.reject_reason!r})")
            if req.id in self.swapped_blocks:  # rejected while swapped out: its CPU blocks were freed
                self.swap_lost_to_rejection += self.swapped_blocks.pop(req.id)
        # recompute victims lose their progress; swap victims keep it
        swapped_out = {r.id for r in plan.swapped_out}
        for req in plan.preempted:
            if req.id not in swapped_out:
                self.computed[req.id] = 0
        out_blocks = 0
        for req in plan.swapped_out:
            n = pol.blocks.cpu_blocks_of(req) if req.status is Status.SWAPPED else 0
            if req.status is Status.SWAPPED:
                self.swapped_blocks[req.id] = n
            out_blocks += n
        if out_blocks != plan.swap_out_blocks:
            self._fail(f"swap_out_blocks {plan.swap_out_blocks} but the victims hold {out_blocks} CPU blocks")
        in_blocks = 0
        for req in plan.swapped_in:
            if req.id not in self.swapped_blocks:
                self._fail(f"{req.id} swapped in but was never swapped out")
            in_blocks += self.swapped_blocks.pop(req.id)
        if in_blocks != plan.swap_in_blocks:
            self._fail(f"swap_in_blocks {plan.swap_in_blocks} but {in_blocks} blocks were swapped out")
        self.swap_out_total += plan.swap_out_blocks
        self.swap_in_total += plan.swap_in_blocks

        if len(plan.num_new_tokens) != len(plan.scheduled) or len(plan.context) != len(plan.scheduled):
            self._fail("plan lists have different lengths")
        total = 0
        for req, n, ctx in zip(plan.scheduled, plan.num_new_tokens, plan.context):
            if req.id in seen:
                self._fail(f"{req.id} scheduled twice in one step")
            seen.add(req.id)
            if req.status is not Status.RUNNING:
                self._fail(f"{req.id} scheduled with status {req.status}")
            if n < 1:
                self._fail(f"{req.id} scheduled with {n} tokens")
            if ctx + n != req.num_computed_tokens:
                self._fail(f"{req.id}: context {ctx} + {n} != num_computed_tokens {req.num_computed_tokens}")
            if ctx + n > req.num_tokens:
                self._fail(f"{req.id} scheduled beyond its length: {ctx} + {n} > {req.num_tokens} tokens")
            if ctx + n > lim.max_model_len:
                self._fail(f"{req.id} computes past max_model_len: {ctx} + {n} > {lim.max_model_len}")
            expected = self.computed[req.id]
            if ctx != expected:
                if expected != 0:
                    self._fail(f"{req.id} resumes at context {ctx}, but {expected} tokens were computed "
                               f"since its last reset")
                self.check_prefix_hit(plan, req, ctx)
                self.seen["prefix hit"] += 1
            self.computed[req.id] = ctx + n
            self.high_water[req.id] = max(self.high_water[req.id], ctx + n)
            if self._slots_of(req) < ctx + n:
                self._fail(f"{req.id} computes {ctx + n} tokens but holds KV slots for {self._slots_of(req)}")
            total += n
        budget = pol.token_budget
        if budget is not None and total > budget:
            self._fail(f"{total} tokens scheduled, over the token budget {budget}")
        if len(plan.scheduled) > pol.max_slots:
            self._fail(f"{len(plan.scheduled)} requests scheduled, over {pol.max_slots} slots")
        if pol.num_running > pol.max_slots:
            self._fail(f"{pol.num_running} requests running, over {pol.max_slots} slots")
        if pol.limits.max_num_seqs < pol.num_running and not isinstance(pol, StaticPolicy):
            self._fail(f"{pol.num_running} running, over max_num_seqs {pol.limits.max_num_seqs}")
        self.outputs_before = {r.id: r.num_output_tokens for r in plan.scheduled}

    def check_prefix_hit(self, plan: StepPlan, req: Request, ctx: int) -> None:
        """A request starting afresh at context ``ctx`` > 0: legal only as a prefix-cache hit."""
        pol = self.policy
        if not self.caching:
            self._fail(f"{req.id} starts at context {ctx} with the prefix cache off")
        if ctx >= req.num_tokens:
            self._fail(f"{req.id}: a {ctx}-token prefix hit leaves none of its {req.num_tokens} tokens "
                       f"to compute, so no token can be sampled")
        # whole pages; TGI's match of a whole prompt backs off one token (radix.rs, tgi.py)
        backed_off = (isinstance(pol, TgiPolicy) and ctx == req.prompt_tokens - 1
                      and req.prompt_tokens % self.hit_page == 0)
        if ctx % self.hit_page and not backed_off:
            self._fail(f"{req.id}: a prefix hit of {ctx} tokens is not whole pages of {self.hit_page}")
        reported = plan.prefix_hit_tokens.get(req.id, getattr(pol, "admission_hits", {}).get(req.id, ctx))
        if reported != ctx:
            self._fail(f"{req.id} starts at context {ctx} but the policy reports a {reported}-token hit")
        mine = token_ids(req, ctx)
        for other in self.requests.values():  # who computed these tokens (this step: earlier in the batch)?
            if self.high_water[other.id] >= ctx and token_ids(other, ctx) == mine:
                return
        self._fail(f"{req.id}: a {ctx}-token prefix hit, but no request computed those tokens before")

    # --- after emit_tokens() and finish_step() -------------------------------------------------
    def after_step(self, plan: StepPlan, finished: list[Request]) -> None:
        for req in plan.scheduled:
            emitted = req.num_output_tokens - self.outputs_before[req.id]
            if emitted not in (0, 1):
                self._fail(f"{req.id} emitted {emitted} tokens in one step")
            if emitted:
                # a token is sampled only once prompt + every earlier output is in KV, exactly
                if self.computed[req.id] != req.num_tokens - 1:
                    self._fail(f"{req.id} emitted a token with {self.computed[req.id]} of "
                               f"{req.num_tokens - 1} tokens computed")
            if req.num_output_tokens > min(req.max_tokens, self.true_out[req.id]):
                self._fail(f"{req.id} generated {req.num_output_tokens} tokens, past its length")
        for req in finished:
            if req.status is not Status.FINISHED:
                self._fail(f"{req.id} finished but has status {req.status}")
        self.check_blocks()
        self.steps += 1

    # --- per-policy accounting -----------------------------------------------------------------
    def _slots_of(self, req: Request) -> int:
        pol, bs = self.policy, self.limits.block_size
        paged = _paged(pol)
        if paged is not None:
            st = paged._reqs.get(req)
            return min(len(st.blocks) * paged.block_size if st else 0, self.limits.max_model_len)
        if isinstance(pol, ReservationPolicy):
            held = pol.kv._held.get(req.id)
            return held[1] * bs if held else 0
        return pol.blocks.gpu_blocks_of(req) * bs  # vllm-v0, sarathi

    def check_blocks(self) -> None:
        pol = self.policy
        paged = _paged(pol)
        if paged is not None:
            pool = paged.pool
            try:
                pool.check_invariants()
            except AssertionError as exc:
                self._fail(f"block pool: {exc}")
            holders: Counter = Counter()
            for req, st in paged._reqs.items():
                if st.blocks and req.status is not Status.RUNNING:
                    self._fail(f"{req.id} holds {len(st.blocks)} blocks while {req.status.value}")
                if 0 in st.blocks:
                    self._fail(f"{req.id} holds the null block")
                holders.update(st.blocks)
            ref_cnt = pool.ref_cnt  # the exact counts (built from the free queue: read once)
            for b in range(1, pool.num_usable + 1):
                if ref_cnt[b] != holders.get(b, 0):
                    self._fail(f"block {b}: ref_cnt {ref_cnt[b]} but {holders.get(b, 0)} tables hold it")
            if pool.num_free != pool.num_usable - len(holders):
                self._fail(f"{pool.num_free} free + {len(holders)} held != {pool.num_usable} blocks")
        elif isinstance(pol, ReservationPolicy):
            kv = pol.kv
            held = sum(n for _, n in kv._held.values())
            if kv.free_blocks < 0 or kv.free_blocks + held != kv.num_blocks:
                self._fail(f"contiguous pool: free {kv.free_blocks} + held {held} != {kv.num_blocks}")
            holders = set(kv._held)
            members = {r.id for r in (pol.batch if isinstance(pol, StaticPolicy) else pol.running)}
            if holders != members:
                self._fail(f"reservations {sorted(holders)} != batch/running {sorted(members)}")
        else:  # vllm-v0, sarathi: V0BlockManager
            try:
                pol.blocks.check()
            except AssertionError as exc:
                self._fail(str(exc))
            for req in self.requests.values():
                gpu, cpu = pol.blocks.gpu_blocks_of(req), pol.blocks.cpu_blocks_of(req)
                if req.status is Status.SWAPPED:
                    if gpu or not cpu:
                        self._fail(f"swapped {req.id} holds {gpu} GPU and {cpu} CPU blocks")
                elif cpu or (gpu and req.status is not Status.RUNNING):
                    self._fail(f"{req.id} ({req.status.value}) holds {gpu} GPU and {cpu} CPU blocks")

    # --- the end ---------------------------------------------------------------------------------
    def expected_output(self, req: Request) -> int:
        return min(self.true_out[req.id], req.max_tokens, max(self.limits.max_model_len - req.prompt_tokens, 1))

    def surely_fits(self, req: Request) -> bool:
        """prompt + max_tokens within every limit of every policy, with the watermark's room:
        such a request must never be rejected."""
        lim, pol = self.limits, self.policy
        total = req.prompt_tokens + req.max_tokens
        wm = float(pol.knobs.get("watermark", 0.0) or 0.0)
        reserve = _cdiv(int(wm * 1000) * (lim.num_gpu_blocks + 1), 1000) + 1 if wm else 0
        budget = pol.token_budget or total
        if isinstance(pol, VllmV1Policy) and pol.knobs["enable_chunked_prefill"]:
            budget = total  # chunked prefill splits any prompt
        if isinstance(pol, TrtllmPolicy) and pol.chunked:
            budget = total  # chunked context splits any prompt
        if not isinstance(pol, VllmV0Policy | VllmV1Policy | TrtllmPolicy) and pol.token_budget is not None:
            budget = total  # sarathi chunks prompts too
        radix = _radix(pol)
        if radix is not None and radix.ceil_page(total) > radix.capacity:
            return False  # the radix pool is whole pages of its own (sglang page_size, tgi block_size)
        if isinstance(pol, TgiPolicy) and not pol.chunking and req.prompt_tokens > radix.ceil_page(pol.max_prefill):
            return False  # TGI refuses (422) a prompt one prefill cannot hold when chunking is off
        return (total < lim.max_model_len and total <= budget
                and _cdiv(total, lim.block_size) + reserve <= lim.num_gpu_blocks)

    def refused_as_overloaded(self, req: Request) -> bool:
        """TGI's 429: refused at arrival while ``max_concurrent_requests`` were queued or running."""
        limit = getattr(self.policy, "max_concurrent", None)
        return (limit is not None and self.load_at_arrival[req.id] >= limit
                and req.reject_reason.startswith("429"))

    def at_end(self) -> None:
        pol = self.policy
        if pol.has_work() or pol.num_running or pol.num_waiting:
            self._fail(f"work left at the end: {pol.num_running} running, {pol.num_waiting} waiting")
        for req in self.requests.values():
            if req.status is Status.FINISHED:
                if req.num_output_tokens != self.expected_output(req):
                    self._fail(f"{req.id} finished with {req.num_output_tokens} tokens, expected "
                               f"{self.expected_output(req)}")
            elif req.status is Status.REJECTED:
                if not req.reject_reason:
                    self._fail(f"{req.id} rejected without a reason")
                if self.surely_fits(req) and not self.refused_as_overloaded(req):
                    self._fail(f"{req.id} (prompt {req.prompt_tokens}, max_tokens {req.max_tokens}) fits every "
                               f"limit but was rejected: {req.reject_reason}")
            else:
                self._fail(f"{req.id} ended {req.status.value}: neither finished nor rejected")
        if pol.kv_blocks_used() != 0:
            self._fail(f"{pol.kv_blocks_used()} GPU blocks still used at the end")
        if pol.cpu_blocks_used() != 0:
            self._fail(f"{pol.cpu_blocks_used()} CPU blocks still used at the end")
        if self.swapped_blocks:
            self._fail(f"swapped out and never back: {sorted(self.swapped_blocks)}")
        if self.swap_out_total != self.swap_in_total + self.swap_lost_to_rejection:
            self._fail(f"{self.swap_out_total} blocks swapped out, {self.swap_in_total} swapped in, "
                       f"{self.swap_lost_to_rejection} dropped with rejected requests")
        self.check_blocks()


def finished_now(emitted: list[Request], true_out: dict[str, int], max_model_len: int) -> list[Request]:
    """The engine's rule (sim.engine): done at the true length, at max_tokens or at max_model_len."""
    done = []
    for req in emitted:
        if (req.num_output_tokens >= true_out[req.id] or req.num_output_tokens >= req.max_tokens
                or req.num_tokens >= max_model_len):
            req.status = Status.FINISHED
            done.append(req)
    return done


def drive(policy, arrivals: list[tuple[int, Request, int]], limits: EngineLimits,
          max_steps: int = 100_000) -> InvariantChecker:
    """Run ``policy`` on ``(arrival step, Request, true output length)`` with every check on.

    One loop iteration is one engine step. Returns the checker (its ``steps`` is the step count).
    Raises :class:`InvariantError` on a broken invariant, a stuck policy or a run that does not
    end within ``max_steps`` (an endless preempt/readmit loop).
    """
    true_out = {req.id: out for _, req, out in arrivals}
    checker = InvariantChecker(policy, limits, true_out)
    pending = sorted(arrivals, key=lambda a: (a[0], a[1].seq))
    clock, k = 0, 0
    while True:
        while k < len(pending) and pending[k][0] <= clock:
            checker.add(pending[k][1])
            policy.add_request(pending[k][1])
            k += 1
        if not policy.has_work():
            if k == len(pending):
                break
            clock = pending[k][0]
            continue
        if checker.steps >= max_steps:
            raise InvariantError(f"{policy.name}: no end after {max_steps} steps "
                                 f"({policy.num_running} running, {policy.num_waiting} waiting)")
        plan = policy.schedule()
        checker.after_schedule(plan)
        if plan.is_empty:
            checker.steps += 1
            if plan.rejected or plan.preempted:
                continue  # memory was freed: schedule again at once (as sim.engine does)
            if k == len(pending) and policy.has_work():
                raise InvariantError(f"{policy.name} step {checker.steps}: stuck: work left, empty plan, "
                                     f"no arrival pending")
            if k < len(pending):
                clock = max(clock + 1, pending[k][0])
            continue
        emitted = emit_tokens(plan)
        finished = finished_now(emitted, true_out, limits.max_model_len)
        policy.finish_step(plan, finished)
        checker.after_step(plan, finished)
        clock += 1
    checker.at_end()
    return checker


class Checked:
    """A policy wrapped so that ``sim.engine`` drives it with every check on, one step at a time
    (the base class's ``decode_stretch``, which declines, turns the engine's fast-forward off)."""

    decode_stretch = Policy.decode_stretch

    def __init__(self, policy, checker: InvariantChecker):
        self._policy = policy
        self._checker = checker

    def __getattr__(self, name):
        return getattr(self._policy, name)

    def add_request(self, req: Request) -> None:
        self._checker.add(req)
        self._policy.add_request(req)

    def schedule(self) -> StepPlan:
        plan = self._policy.schedule()
        self._checker.after_schedule(plan)
        return plan

    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        self._policy.finish_step(plan, finished)
        self._checker.after_step(plan, finished)
