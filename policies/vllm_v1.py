"""vLLM V1's scheduler (vLLM 0.32.0, synchronous ``Scheduler``), step for step.

There is no prefill or decode phase in V1: each step lets every request's
``num_computed_tokens`` catch up with its ``num_tokens`` (prompt plus generated tokens) under a
token budget. One call to :meth:`VllmV1Policy.schedule` does what ``Scheduler.schedule()`` does
(reference/schedulers.md §1.3-1.6, with the 0.32 corrections):

1. **Running requests first, in list order.** Each gets ``num_tokens - num_computed_tokens``
   tokens (a decode is 1, an unfinished prompt is the rest of it), capped by
   ``long_prefill_token_threshold`` (only when more than one request is running or waiting),
   by the remaining budget and by ``max_model_len - num_computed_tokens - 1``. When its blocks
   do not fit, requests are preempted (recompute: all blocks freed, ``num_computed_tokens = 0``,
   back to the *front* of the waiting queue) until they do: ``running[-1]`` under FCFS, the
   worst ``(priority, arrival)`` running request under the priority policy (a victim already
   scheduled this step gives its tokens back). If the request had to preempt itself, the running
   pass stops there.
2. **Waiting requests, only if nothing was preempted in this step**, in queue order (FCFS: a
   deque; priority: lowest ``(priority, arrival)`` first) while the budget and ``max_num_seqs``
   allow. Each looks up the prefix cache, asks for slots with the full-sequence admission gate and
   the watermark, and the first one that does not fit stops admission (head-of-line blocking).
3. ``num_computed_tokens`` advances at schedule time for every scheduled request.

:meth:`VllmV1Policy.finish_step` frees finished requests one at a time in batch order, each one's
blocks tail first: with prefix caching this order is the eviction order.

Where vLLM would wait forever, this policy rejects instead (``Status.REJECTED`` with a reason, in
``StepPlan.rejected``): a prompt of ``max_model_len`` tokens or more (vLLM refuses longer ones at
``add_request``; one of exactly ``max_model_len`` could never be given its last token under the
cap above), a prompt needing more blocks than the whole pool, a lone running request that
cannot grow even with the whole pool free, and, with chunked prefill off, a prefill longer than
the whole token budget (vLLM refuses such a config: it requires
``max_num_batched_tokens >= max_model_len`` then). None of these happens in a run vLLM completes, so
rejection never changes a decision vLLM makes.

Asynchronous admission (knob ``async_admission``, off by default). With async scheduling vLLM's
``EngineCore`` steps with ``step_with_batch_queue`` over a batch queue of two
(``max_concurrent_batches`` is 2 when ``scheduler_config.async_scheduling``). Each call schedules
batch n + 1 and launches it behind batch n, then blocks on batch n's result and runs
``update_from_output``; only after it returns does ``run_busy_loop`` call ``_process_input_queue``,
where ``add_request`` hands new requests to the scheduler (``vllm/v1/engine/core.py``; read in
vLLM 0.11, whose call returns early while the queue has room, and in vllm-project/vllm main of
2026, the same order; the ``queue.Queue`` form of 0.10, where async scheduling came in, also). So
batch n + 1 was scheduled as batch n started on the GPU, and a request arriving while batch n runs
(or after it ended, before the next schedule) first runs in batch n + 2, one step later than the
synchronous ``step()`` (schedule, execute, update) runs it. An idle engine blocks in
``_process_input_queue`` and schedules a request at once; and when the batch behind the running
one is empty (its requests all end in the running one: the async scheduler skips a request whose
``max_tokens`` the step in flight reaches) the arrival runs in the next non-empty batch, right after.
The knob models this as :mod:`policies.trtllm` models TensorRT-LLM's overlap scheduler: a request
added while a step is in flight (a plan was scheduled and no ``schedule()`` came since) joins the
waiting queue once one more step has been scheduled without it; a ``schedule()`` that would be
empty without such requests takes them at once. Not modelled: batch n + 1 is built before batch n's
finishes free their slots and blocks. Fast-forward, exact: the step after the one a request
arrives in is a pure decode of the same batch whether or not it came, so a stretch whose last step
contains an arrival may take one step more (``admits_a_step_late``: the engine then sets
``arrivals_behind`` while the arrival comes, which puts its fetch one step back), and while such a
request waits a stretch is offered that ends where it is fetched (``decode_stretch_limit``: the one
step); none is offered when the next schedule fetches it (it may be admitted there). With the knob
off nothing changes.

Speculative decoding (:meth:`VllmV1Policy.enable_speculation`; vLLM ``vllm/v1/core/sched/scheduler.py``):
a request whose last scheduled step completed it (it sampled a token, so the drafter proposed
``k`` drafts for it: ``update_draft_token_ids`` ignores drafts of prefill chunks) asks for
``num_tokens_with_spec - num_computed_tokens = 1 + k`` tokens in Phase A; the long-prefill
threshold, the remaining token budget and ``max_model_len - 1 - num_computed_tokens`` cut that as
any request's tokens (so the drafts count against ``max_num_batched_tokens``), and the drafts that
survive the cuts are the step's scheduled spec tokens (``num_scheduled_spec_tokens = num_new_tokens
+ num_computed_tokens - num_tokens``, Phase A of ``schedule()``). Their KV slots are allocated up
front with ``num_lookahead_tokens`` more for EAGLE and draft models (``Scheduler.__init__``:
``num_lookahead_tokens = num_spec_tokens`` when ``use_eagle()`` or ``uses_draft_model()``; for a
waiting request only once it has computed tokens). After the step the engine reports how many
were rejected and ``num_computed_tokens`` steps back by that many (``update_from_output``:
``request.num_computed_tokens -= num_rejected``): their slots stay in the request's blocks and the
next step writes over them; blocks go back to the pool when the request ends or is preempted.
Pure-decode fast-forward is off while speculating (every step's emission depends on a draw).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from policies.base import EngineLimits, Knob, Policy, Request, Status, StepPlan
from policies.kv.paged import PagedDecodeStretch, PagedKVManager
from policies.vllm_defaults import VLLM_RELEASE, vllm_limits

SCHEDULING_POLICIES = ("fcfs", "priority")


class VllmV1Policy(PagedDecodeStretch, Policy):
    name = "vllm-v1"
    _keep_edges = True  # False: rebuild the edge calendar at every bulk step (tests compare both)
    # add_request only queues the request (or marks it rejected for the next schedule): it reads
    # nothing a decode step changes, so a stretch's last step may contain an arrival. With
    # async_admission it also reads the step count and the in-flight flag, which a stretch sets as
    # its steps would (advance_decodes): an arrival in its last step waits as it would stepped, and
    # one in the step before the last (admits_a_step_late) with arrivals_behind counted back
    stretch_past_arrivals = True
    finish_step_reads_plan = False  # it releases the finished requests and reads no plan
    summary = (
        f"vLLM V1 ({VLLM_RELEASE}): token budget, running requests first, chunked prefill, "
        "full-prompt admission gate, LIFO recompute preemption, paged KV with prefix caching"
    )
    engine_defaults_source = (
        f"vLLM {VLLM_RELEASE}'s own for its API server on this GPU (vllm/engine/arg_utils.py, "
        "get_batch_defaults): by GPU memory and name"
    )
    KNOBS = {
        "watermark": Knob(
            0.0,
            "fraction of the KV pool (null block included) kept free when admitting a request "
            "while others run",
            float,
        ),
        "long_prefill_token_threshold": Knob(
            0,
            "cap on one request's prefill chunk per step when more than one request is "
            "running or waiting (0 = no cap)",
            int,
        ),
        "scheduling_policy": Knob(
            "fcfs",
            "fcfs: arrival order, preempt the newest running request; priority: lower "
            "`priority` value first (ties by arrival), preempt the worst",
            str,
        ),
        "enable_prefix_caching": Knob(
            True,
            "reuse cached full KV blocks of identical prefixes (LRU eviction through the free queue); "
            "on by default, as in vLLM V1",
            bool,
        ),
        "scheduler_reserve_full_isl": Knob(
            True,
            "admit a waiting request only if its whole prompt (plus earlier outputs) fits the "
            "free blocks, not just its first chunk",
            bool,
        ),
        "enable_chunked_prefill": Knob(
            True,
            "split prompts across steps to fit the token budget; off: a prompt that does not "
            "fit the remaining budget waits",
            bool,
        ),
        "async_admission": Knob(
            False,
            "vLLM's async scheduling (batch queue of 2): a request arriving while a step runs enters "
            "the step after the next one, which was scheduled as the running one started; an idle "
            "engine takes it at once (off: it enters the next step, as synchronous vLLM does)",
            bool,
        ),
        "kv_offload": Knob(
            True,
            "use the KV tiers of engine.kv_offloading_size (vLLM's KV offloading); false: this entry "
            "keeps KV on the GPU only (compare both in one scenario)",
            bool,
        ),
    }

    @classmethod
    def engine_defaults(cls, limits: EngineLimits, knobs: dict[str, Any]) -> tuple[int, int]:
        """vLLM's own ``max_num_seqs`` / ``max_num_batched_tokens`` for the server on this device
        (:mod:`policies.vllm_defaults`), for whichever of the two the scenario left unset."""
        return vllm_limits(limits.max_num_seqs, limits.max_num_batched_tokens, limits.max_model_len,
                           limits.device, chunked_prefill=bool(knobs.get("enable_chunked_prefill", True)))

    def __init__(self, limits: EngineLimits, **knobs: Any) -> None:
        super().__init__(limits, **knobs)
        k = self.knobs
        if not 0.0 <= float(k["watermark"]) < 1.0:
            raise ValueError(f"vllm-v1 watermark must be in [0, 1), got {k['watermark']}")
        if int(k["long_prefill_token_threshold"]) < 0:
            raise ValueError(
                f"vllm-v1 long_prefill_token_threshold must be >= 0, got {k['long_prefill_token_threshold']}"
            )
        if k["scheduling_policy"] not in SCHEDULING_POLICIES:
            raise ValueError(
                f"vllm-v1 scheduling_policy must be one of {list(SCHEDULING_POLICIES)}, "
                f"got {k['scheduling_policy']!r}"
            )
        self._priority = k["scheduling_policy"] == "priority"
        self._threshold = int(k["long_prefill_token_threshold"])
        self._reserve_full_isl = bool(k["scheduler_reserve_full_isl"])
        self._chunked = bool(k["enable_chunked_prefill"])
        self.kv = PagedKVManager(
            limits.num_gpu_blocks,
            limits.block_size,
            limits.max_model_len,
            enable_caching=bool(k["enable_prefix_caching"]),
            watermark=float(k["watermark"]),
        )
        if limits.kv_offload is not None and k["kv_offload"]:  # KV offloading: --kv-offloading-size (policies.kv.tiers)
            if not self.kv.enable_caching:
                raise ValueError("vllm-v1 KV offloading needs enable_prefix_caching on (blocks are found by hash)")
            self.kv.tiers = limits.kv_offload.store(limits.block_size)
        self.running: list[Request] = []
        self._fifo: deque[Request] = deque()  # FCFS waiting queue
        self._heap: list[tuple] = []  # priority waiting queue
        self._pushes = 0
        self._rejected: list[Request] = []  # rejected since the last plan, reported by the next one
        self._stored_tokens = 0  # sum of num_computed_tokens over requests holding blocks
        # the last plan scheduled every running request and each will have emitted its token:
        # after that step every running request is one decode away (see decode_stretch)
        self._decode_ready = False
        # finish_step came after the last plan: the engine emitted its tokens (it calls
        # finish_step after emitting, as both engines and every replay here do)
        self._reported = True
        self._lookahead = 0  # KV slots allocated beyond a step's tokens (speculative decoding)
        # the edge calendar of bulk decode steps and stretches (see _bulk_decodes): one bucket of
        # (rank, request, KV state) per phase; None: to be rebuilt from the running list
        self._edges: list[list[tuple[int, Request, Any]]] | None = None
        self._tick = 0  # pure-decode steps taken since the calendar was built
        self._ranks = 0  # ranks given so far (a request's rank orders it as the running list does)
        self._bulk_run = 0  # bulk steps since the calendar was dropped (the first one scans the batch)
        # async admission (module doc): requests added while a step was in flight, with the step count
        # after which they may join the waiting queue
        self._async_admission = bool(k["async_admission"])
        self._steps = 0  # non-empty steps scheduled (stretch steps included)
        self._in_flight = False  # a non-empty plan was scheduled and no schedule() came since
        self._unfetched: deque[tuple[int, Request]] = deque()
        if self._async_admission:  # the scheduler behind the batch queue's fetch (off: schedule itself);
            self.schedule = self._schedule_admitting  # a stretch stops where a request added during a
            self.decode_stretch_limit = self._async_stretch_limit  # step is fetched
            self.admits_a_step_late = True

    # --- speculative decoding ---------------------------------------------------------------
    supports_speculation = True

    def enable_speculation(self, num_speculative_tokens: int, num_lookahead_tokens: int = 0) -> None:
        """Schedule ``num_speculative_tokens`` drafts for every request whose last step completed
        it, with ``num_lookahead_tokens`` extra KV slots for running requests (see the module doc)."""
        if num_speculative_tokens < 1 or num_lookahead_tokens < 0:
            raise ValueError(f"vllm-v1 num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.num_speculative_tokens = int(num_speculative_tokens)
        self._lookahead = int(num_lookahead_tokens)
        self._decode_ready = False

    def reject_drafts(self, plan: StepPlan, rejected: list[int]) -> None:
        for r, n in zip(plan.scheduled, rejected):
            if n:
                r.num_computed_tokens -= n
                self._stored_tokens -= n

    # --- waiting queue ----------------------------------------------------------------------
    def _push_waiting(self, req: Request, front: bool = False) -> None:
        if self._priority:  # "prepend" is a push: the heap decides
            self._pushes += 1
            heapq.heappush(self._heap, (req.priority, req.arrival_s, req.seq, self._pushes, req))
        elif front:
            self._fifo.appendleft(req)
        else:
            self._fifo.append(req)

    def _peek_waiting(self) -> Request | None:
        if self._priority:
            return self._heap[0][-1] if self._heap else None
        return self._fifo[0] if self._fifo else None

    def _pop_waiting(self) -> None:
        if self._priority:
            heapq.heappop(self._heap)
        else:
            self._fifo.popleft()

    def waiting_requests(self) -> list[Request]:
        """The waiting queue in the order it would be served."""
        if self._priority:
            return [e[-1] for e in sorted(self._heap)]
        return list(self._fifo)

    # --- engine protocol --------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        lim = self.limits
        if req.prompt_tokens >= lim.max_model_len:
            self._reject(
                req,
                f"prompt of {req.prompt_tokens} tokens leaves no room for an output token "
                f"within max_model_len {lim.max_model_len}",
            )
            return
        need = -(-req.prompt_tokens // lim.block_size)
        if need > lim.num_gpu_blocks:
            self._reject(
                req,
                f"prompt of {req.prompt_tokens} tokens needs {need} KV blocks; "
                f"the whole pool has {lim.num_gpu_blocks}",
            )
            return
        if not self._chunked and req.prompt_tokens > lim.max_num_batched_tokens:
            self._reject(
                req,
                f"prompt of {req.prompt_tokens} tokens exceeds max_num_batched_tokens "
                f"{lim.max_num_batched_tokens} and enable_chunked_prefill is off",
            )
            return
        req.status = Status.WAITING
        if self._in_flight and self._async_admission:
            # step_with_batch_queue scheduled the next step as this one started: the request is
            # added after this step's update_from_output and first scheduled in the step after next
            # (the engine may have applied a step more, in the same timeout: arrivals_behind)
            self._unfetched.append((self._steps + 1 - self.arrivals_behind, req))
            return
        self._push_waiting(req)

    def _fetch(self, every: bool) -> None:
        """Requests added while a step was in flight join the waiting queue once one more step has
        been scheduled (``every``: all of them, the engine has nothing else to schedule)."""
        pending = self._unfetched
        while pending and (every or pending[0][0] <= self._steps):
            self._push_waiting(pending.popleft()[1])

    def _reject(self, req: Request, reason: str) -> None:
        self.kv.release(req)
        req.status = Status.REJECTED
        req.reject_reason = reason
        self._rejected.append(req)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.policy_state = None  # its drafts are dropped (vLLM _preempt_request clears spec_token_ids)
        self._stored_tokens -= req.num_computed_tokens
        req.status = Status.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self._push_waiting(req, front=True)

    def _schedule_admitting(self) -> StepPlan:
        """``schedule`` with async admission (module doc): the requests whose step has come join
        first, then the class's scheduler (looked up on the class, so a patched one runs too)."""
        schedule = type(self).schedule
        if self._unfetched:
            self._fetch(False)
        plan = schedule(self)
        if plan.is_empty and self._unfetched and not plan.rejected and not plan.preempted:
            # the step scheduled behind the one that ended is empty: the arrivals run in the next one
            self._fetch(True)
            plan = schedule(self)
        self._in_flight = not plan.is_empty
        if self._in_flight:
            self._steps += 1
        return plan

    def schedule(self) -> StepPlan:
        lim, kv = self.limits, self.kv
        plan = StepPlan()
        if self._rejected:
            plan.rejected, self._rejected = self._rejected, []
        running = self.running
        max_model_len = lim.max_model_len
        token_budget = lim.max_num_batched_tokens
        n_waiting = len(self._heap) if self._priority else len(self._fifo)
        thr = self._threshold if len(running) + n_waiting > 1 else 0
        sched: list[Request] = []
        sched_n: list[int] = []
        preempted = plan.preempted

        # Phase A: running requests, in list order; all at once when each is one decode away
        bulk = self._bulk_decodes(token_budget) if self._decode_ready and self._reported else None
        self._reported = False
        spec_k, lookahead = self.num_speculative_tokens, self._lookahead
        if bulk is None:
            self._drop_edges()  # requests advance by other amounts than one token: rebuild
            i = 0
        else:
            i = len(running)
            sched = running[:]
            sched_n = [1] * i
            token_budget -= i
            # num_computed_tokens moves at schedule time (below): Phase B reads no running
            # request's count, so the bulk pass's requests move here
            for r in running:
                r.num_computed_tokens += 1
        while i < len(running) and token_budget > 0:
            r = running[i]
            computed = r.num_computed_tokens
            n = r.prompt_tokens + r.num_output_tokens - computed
            if spec_k and r.policy_state:  # drafts proposed after its last step: num_tokens_with_spec
                n += spec_k
            if 0 < thr < n:
                n = thr
            if n > token_budget:
                n = token_budget
            room = max_model_len - computed - 1
            if n > room:
                n = room
            if n <= 0:
                i += 1
                continue
            while True:
                blocks = kv.allocate_slots(r, n, num_lookahead_tokens=lookahead) if lookahead else \
                    kv.allocate_slots(r, n)
                if blocks is not None:
                    break
                if self._priority:
                    victim = max(running, key=_priority_key)  # max keeps the first of ties
                    vi = running.index(victim)
                    del running[vi]
                    if vi < i:
                        i -= 1
                        j = sched.index(victim) if victim in sched else -1
                        if j >= 0:  # already scheduled this step: give its tokens back
                            token_budget += sched_n[j]
                            del sched[j], sched_n[j]
                else:
                    victim = running.pop()
                if victim is r and not running:
                    # alone, with every other block free, and still does not fit: never will
                    self._stored_tokens -= r.num_computed_tokens
                    r.num_computed_tokens = 0
                    self._reject(
                        r,
                        f"needs more than the whole KV pool ({lim.num_gpu_blocks} blocks of "
                        f"{lim.block_size} tokens) at {r.num_tokens} tokens",
                    )
                    break
                self._preempt(victim)
                preempted.append(victim)
                if victim is r:
                    break
            if blocks is None:
                break
            sched.append(r)
            sched_n.append(n)
            token_budget -= n
            i += 1

        # Phase B: waiting requests, only if nothing was preempted
        if not preempted:
            while token_budget > 0:
                r = self._peek_waiting()
                if r is None or len(running) >= lim.max_num_seqs:
                    break
                lower: tuple[list[int], list[int]] | None = None
                if r.num_computed_tokens == 0:
                    hits, n_cached = kv.get_computed_blocks(r)
                    if kv.tiers is not None:
                        # the connector's external hit after the GPU's (get_num_new_matched_tokens)
                        lower = kv.tier_hits(r, len(hits))
                        if lower[1]:
                            n_cached += len(lower[1]) * lim.block_size
                        else:
                            lower = None
                else:
                    hits, n_cached = [], 0
                num_computed = r.num_computed_tokens + n_cached
                n = r.num_tokens - num_computed
                if 0 < thr < n:
                    n = thr
                if not self._chunked and n > token_budget:
                    if n > lim.max_num_batched_tokens:  # a resumed request that grew past the budget
                        self._pop_waiting()
                        self._reject(
                            r,
                            f"needs a {n}-token prefill, more than max_num_batched_tokens "
                            f"{lim.max_num_batched_tokens}, with enable_chunked_prefill off",
                        )
                        continue
                    break
                n = min(n, token_budget)
                blocks = kv.allocate_slots(
                    r,
                    n,
                    n_cached,
                    hits,
                    full_sequence_must_fit=self._reserve_full_isl,
                    has_scheduled_reqs=bool(running),
                    num_lookahead_tokens=lookahead if r.num_computed_tokens else 0,
                )
                if blocks is None:
                    break
                self._pop_waiting()
                running.append(r)
                if r.status is Status.WAITING:
                    plan.admitted.append(r)
                    if n_cached:
                        plan.prefix_hit_tokens[r.id] = n_cached
                r.status = Status.RUNNING
                r.num_computed_tokens = num_computed
                # KV it holds from the start: prefix hits, and tokens computed elsewhere (a KV
                # connector's external computed tokens: a request handed over with its prompt's
                # KV, sim.disaggregation); a new or preempted request brings none of its own
                self._stored_tokens += num_computed
                if lower is not None:
                    seconds = kv.tiers.load(*lower)
                    if plan.kv_loads is None:
                        plan.kv_loads = {}
                    plan.kv_loads[r.id] = (len(lower[1]) * lim.block_size, seconds)
                    if kv.tiers.async_load:
                        # vLLM's native connector loads between steps: the request waits for its
                        # KV (WAITING_FOR_REMOTE_KVS) and computes from the next step on
                        plan.kv_load_async = True
                        continue
                sched.append(r)
                sched_n.append(n)
                token_budget -= n

        if self._rejected:  # found during this step
            plan.rejected.extend(self._rejected)
            self._rejected = []
        # num_computed_tokens moves at schedule time, as in vLLM's _update_after_schedule
        ready = len(sched) == len(running)  # every running request is scheduled (sched ⊆ running)
        if bulk is None:
            context, rest = [], zip(sched, sched_n)
        else:
            context, nb = bulk, len(bulk)  # the bulk pass's requests have moved (Phase A)
            rest = zip(sched[nb:], sched_n[nb:]) if len(sched) > nb else ()
        if spec_k:
            spec = plan.spec_tokens = []
            for r, n in rest:
                c = r.num_computed_tokens
                context.append(c)
                c += n
                r.num_computed_tokens = c
                d = c - r.prompt_tokens - r.num_output_tokens
                # drafts scheduled for this step, and whether it completes (the drafter then
                # proposes for it: vLLM update_draft_token_ids skips prefill chunks)
                spec.append(d if d > 0 else 0)
                r.policy_state = d >= 0
            ready = False  # no pure-decode bulk pass or fast-forward while speculating
        for r, n in rest:
            c = r.num_computed_tokens
            context.append(c)
            c += n
            r.num_computed_tokens = c
            if c < r.prompt_tokens + r.num_output_tokens:
                ready = False  # still prefilling: it emits no token this step
        plan.scheduled, plan.num_new_tokens, plan.context = sched, sched_n, context
        if bulk is not None and not spec_k:
            plan.num_decodes = nb
        self._stored_tokens += sum(sched_n)
        self._decode_ready = ready
        if bulk is not None and self._edges is not None:
            if not ready or not self._keep_edges:
                self._drop_edges()
            elif len(sched) > nb:  # admitted this step, decode-ready from the next tick on
                self._enter(sched[nb:], self._tick)
        return plan

    def _bulk_decodes(self, token_budget: int) -> list[int] | None:
        """Phase A when every running request is one decode away and its block fits: the same
        allocate_slots calls, in the same order, that the request-by-request pass would make
        (only requests at a block boundary need one; the others' calls do nothing). Returns the
        requests' contexts, or None (nothing changed) to take the request-by-request pass.

        Which requests are at a boundary comes from the *edge calendar*: while steps are bulk
        steps and pure-decode stretches, every running request's context grows by one token a
        step, as the calendar's tick does, so ``(context - tick) mod block_size`` (its *phase*)
        stays the same. A request needs the KV manager only when its context is a multiple of
        the block size (the next token opens a block) or one short of it (the token fills a
        block, registered with caching): both at ticks its phase names. The calendar keeps the
        requests in one bucket per phase, in running order, and a step looks at the two buckets
        due (each entry is checked, so one whose block table reaches further just waits); no
        entry moves until it finishes. A step that advances requests otherwise (a chunked
        prefill, a preemption) drops the calendar: the next bulk step scans the batch and the
        one after it builds the calendar again from the running list."""
        running = self.running
        if not running or len(running) > token_budget:
            return None
        last = self.limits.max_model_len - 1  # a decode needs room for one token: context < last
        # every running request is one decode away (all its tokens computed but the last): the
        # last plan scheduled and completed each (_decode_ready) and the engine emitted their
        # tokens before its finish_step (schedule() checks both); room for one more token
        context = [r.num_computed_tokens for r in running]
        if max(context) >= last:
            return None
        edges = self._edges
        if edges is None:
            if not self._bulk_run:
                # a lone bulk step (after a chunked prefill, ...) scans the batch: building the
                # calendar pays only from the second bulk step in a row on
                kv = self.kv
                B = kv.block_size
                states = kv.request_states()
                sts = [states[r] for r in running]
                if kv.enable_caching:
                    # at the end of its block table (needs a block) or about to fill a block not yet registered
                    marked = [i for i, (st, c) in enumerate(zip(sts, context))
                              if c >= len(st.blocks) * B or (c + 1) // B > st.num_cached_blocks]
                else:
                    marked = [i for i, (st, c) in enumerate(zip(sts, context)) if c >= len(st.blocks) * B]
                if marked and not self._decode_edges([(i, running[i], sts[i]) for i in marked]):
                    return None  # someone may be preempted: the request-by-request pass decides
                self._bulk_run = 1
                return context
            edges = self._edges = [[] for _ in range(self.kv.block_size)]
            self._tick = self._ranks = 0
            self._enter(running, 0)
        tick = self._tick
        B = len(edges)
        grow = -tick % B  # the phase whose context opens a block at this tick
        due = self._due((grow, (grow - 1) % B) if self.kv.enable_caching and B > 1 else (grow,))
        if due and not self._decode_edges(due):
            self._drop_edges()  # someone may be preempted: the request-by-request pass decides
            return None
        self._tick = tick + 1
        return context

    def _drop_edges(self) -> None:
        self._edges = None
        self._bulk_run = 0

    def _enter(self, reqs: list[Request], tick: int) -> None:
        """Put decode-ready requests (in running order, after every one already in) into the
        calendar at ``tick``, each in the bucket of its phase (its context at that tick, less the
        tick, modulo the block size). An entry is ``(rank, request, its KV state)``."""
        states = self.kv.request_states()
        edges = self._edges
        B = len(edges)
        rank = self._ranks
        for r in reqs:
            edges[(r.num_computed_tokens - tick) % B].append((rank, r, states[r]))
            rank += 1
        self._ranks = rank

    def _due(self, phases) -> list[tuple[int, Request, Any]]:
        """The entries of these phases' buckets, in running order (finished requests left their
        bucket in finish_step)."""
        edges = self._edges
        due: list[tuple[int, Request, Any]] = []
        filled = 0
        for p in phases:
            bucket = edges[p]
            if bucket:
                due += bucket
                filled += 1
        if filled > 1:
            due.sort()  # by rank: each bucket is in running order, the merge is too
        return due

    def _decode_edges(self, due: list[tuple[int, Request, Any]]) -> bool:
        """The KV work of a bulk step for the requests that may be at an edge, in running order
        (each is checked: only those at an edge change): False (nothing changed) when their new
        blocks do not fit."""
        kv = self.kv
        B = kv.block_size
        caching = kv.enable_caching
        # with KV tiers a filled block is also written through to the CPU tier (own content too),
        # in running order: every request due goes through allocate_slots, as request by request
        count_fills = kv.tiers is None
        fills, edge, grow, grow_ctx = [], [], [], []
        for _, r, st in due:
            c = r.num_computed_tokens
            blocks = st.blocks
            if not blocks:
                raise AssertionError(f"{r.id}: in the edge calendar without blocks")
            if c >= len(blocks) * B:
                grow.append(st)  # needs a block
                grow_ctx.append(c)
                edge.append(r)
            elif caching and (c + 1) // B > st.num_cached_blocks:
                if st.num_cached_blocks >= st.shared and count_fills:
                    fills.append((st, (c + 1) // B))  # fills one of its own: registered by count
                else:
                    edge.append(r)  # fills a block that gets hashed and registered
        if len(grow) > kv.num_free_blocks:
            return False
        if edge:
            if len(grow) == len(edge) and kv.tiers is None and (
                    not caching or not kv.num_sharing or all(st.num_cached_blocks >= st.shared for st in grow)):
                # each needs one block and registers nothing but by count: one pop of the free queue
                # hands out the blocks those allocate_slots calls would, in the same order
                kv.append_decode_blocks(grow, grow_ctx)
            else:
                for r in edge:
                    if kv.allocate_slots(r, 1) is None:
                        raise AssertionError(f"{r.id}: a counted block did not fit")
        for st, full in fills:  # what allocate_slots' fast path does for them
            st.num_cached_blocks = full
        return True

    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        self._reported = True
        if not finished:
            return
        edges = self._edges
        if edges is not None:  # they leave the calendar: each from the bucket of its phase
            B, tick = len(edges), self._tick
            for r in finished:
                bucket = edges[(r.num_computed_tokens - tick) % B]
                for i, e in enumerate(bucket):
                    if e[1] is r:
                        del bucket[i]
                        break
                else:  # not where its phase says: the calendar is rebuilt
                    self._drop_edges()
                    break
        for r in finished:  # batch order, each request's blocks tail first
            self.kv.release(r)
            r.policy_state = None
            self._stored_tokens -= r.num_computed_tokens
            r.status = Status.FINISHED
        if len(finished) == 1:
            self.running.remove(finished[0])  # identity: requests do not define equality
        else:
            done = set(finished)  # hashed by identity
            self.running = [r for r in self.running if r not in done]

    # --- statistics -------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """The waiting queue and the requests added while a step was in flight (async admission)."""
        return (len(self._heap) if self._priority else len(self._fifo)) + len(self._unfetched)

    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0 or bool(self._rejected)

    @property
    def num_free_blocks(self) -> int:
        """vLLM's free-queue length: free blocks plus evictable cached ones."""
        return self.kv.num_free_blocks

    def kv_blocks_used(self) -> int:
        """Blocks held by at least one request (evictable cached blocks count as free)."""
        return self.kv.num_used_blocks

    def kv_tokens_reserved_and_used(self) -> tuple[int, int]:
        """(token slots in the block tables of requests, tokens computed into them).

        Both count a shared prefix block once per request holding it, so the difference is the
        unfilled tail of each request's last block.
        """
        return self.kv.held_token_slots, self._stored_tokens

    def drain(self) -> list[Request]:
        """Take out every request still held (running, then waiting) and free their blocks."""
        out = self.running + self.waiting_requests() + [r for _, r in self._unfetched]
        self._unfetched.clear()
        for r in out:
            self.kv.release(r)
        self.running = []
        self._fifo.clear()
        self._heap.clear()
        self._stored_tokens = 0
        self._decode_ready = False
        self._drop_edges()
        return out

    # --- pure-decode stretches (Policy.decode_stretch) --------------------------------------
    def advance_decodes(self, batch: list[Request], k: int) -> tuple[list[int], list[int], list[int]]:
        """The KV work of ``k`` pure-decode steps (:class:`PagedDecodeStretch`) for the requests
        of the calendar's buckets due inside the stretch (the others cross no block edge there),
        and the calendar's tick moved ``k`` on: every phase stays as it was."""
        self._steps += k  # async admission counts them: an arrival in the last one waits as stepped
        self._in_flight = True
        edges = self._edges
        if edges is None or batch is not self.running:
            if edges is not None:
                self._drop_edges()
            return PagedDecodeStretch.advance_decodes(self, batch, k)
        tick = self._tick
        self._tick = tick + k
        B = len(edges)
        kv = self.kv
        # the steps' ticks open blocks; with caching the tick after each also names the phase
        # that fills one in that step
        n = k + 1 if kv.enable_caching else k
        if n >= B:  # every phase has an edge inside the stretch: the due list is the batch
            return PagedDecodeStretch.advance_decodes(self, batch, k)
        if kv.tiers is None and not (kv.enable_caching and kv.num_sharing):
            # every block still to fill is its request's own: the due buckets' entries carry the
            # states and the running order (their ranks), handed over as they are (the phases
            # of the n < B ticks are distinct)
            stored0 = self._stored_tokens
            self._stored_tokens = stored0 + len(batch) * k
            return kv.advance_own_entries([edges[-t % B] for t in range(tick, tick + n)], k, self._ranks,
                                          batch, stored0)
        due = self._due([-t % B for t in range(tick, tick + n)])
        return PagedDecodeStretch.advance_decodes(self, batch, k, [e[1] for e in due])

    def decode_stretch(self) -> tuple[list[Request], int] | None:
        """After a step that scheduled every running request and completed each one's tokens,
        every running request is decode-ready (``num_computed_tokens == num_tokens - 1``) and
        the next schedule() is a pure decode: Phase A gives each exactly one token (the long
        prefill threshold cannot cut 1, ``max_model_len`` leaves room while it has not
        finished) as long as the budget covers the batch and its block fits; Phase B admits
        nobody when the waiting queue is empty, or when ``max_num_seqs`` or the token budget is
        used up. Nothing of this changes while only decodes happen, so it holds for every step
        until an arrival or a finish, as far as the free blocks last (decode_stretch_limit)."""
        running = self.running
        if not self._decode_ready or self._rejected or not running:
            return None
        unfetched = self._unfetched
        if unfetched and unfetched[0][0] <= self._steps:
            return None  # async admission: the next schedule fetches a request, which may be admitted
        b = len(running)
        lim = self.limits
        if b > lim.max_num_batched_tokens:
            return None
        # the requests Phase B would see: not those added during a step and not yet fetched
        if (self._heap if self._priority else self._fifo) and b < lim.max_num_seqs and \
                b < lim.max_num_batched_tokens:
            return None
        return running, self._stored_tokens

    def _async_stretch_limit(self, batch: list[Request], k: int) -> int:
        """``decode_stretch_limit`` with async admission: a stretch ends with the step after which
        the first request added during a step is fetched (one step: the decode scheduled while
        the step it arrived in ran), so the next schedule is where it may be admitted."""
        unfetched = self._unfetched
        if unfetched:
            due = unfetched[0][0] - self._steps  # >= 1: decode_stretch offers no stretch otherwise
            if due < k:
                k = due
        return PagedDecodeStretch.decode_stretch_limit(self, batch, k)


def _priority_key(r: Request) -> tuple[int, float]:
    return (r.priority, r.arrival_s)
