"""TGI v3's router (huggingface/text-generation-inference v3.3.7, ``backends/v3/src``), step for step.

Release followed: **TGI v3.3.7** (commit ``db931fcf``; reference/schedulers.md §6, whose line
numbers are cited below; ``queue.rs``, ``backend.rs``, ``radix.rs`` and ``block_allocator.rs``
settled what the spec leaves open). TGI's scheduler is the Rust router; the Python server only
runs the batches it is sent. One call to :meth:`TgiPolicy.schedule` is one forward pass:

1. **Admission** (``queue.rs::State::next_batch``, §6.2): requests leave the queue strictly FIFO.
   Each gets its KV for ``prompt + max_new_tokens - 1`` tokens *reserved up front* (the radix
   trie's cached prefix plus new blocks for the rest, evicting cached leaves when short); the
   first that does not fit stops admission. Its uncached prompt part (at least one token) counts
   against the prefill budget ``max_batch_prefill_tokens`` (rounded up to whole blocks); with
   prefill chunking the request that overflows it is cut to exactly fill it, without chunking it
   waits. There is **no preemption**: a reservation lasts until the request finishes.
2. **When a prefill may run** (``backend.rs::batching_task`` L129-293, §6.3): with nothing
   running, the next batch is prefilled alone. While a batch runs, after every decode the router
   asks the queue for more: without chunking only if at least
   ``floor(batch_size × waiting_served_ratio)`` requests can be admitted, unless
   ``max_waiting_tokens`` decode steps have passed since the last admission (then any number);
   the new prefill runs alone (the running batch is paused for that forward) and a decode of
   everything follows. With chunking (TGI's default for flash models) the ratio and the wait are
   ignored: the new prefill is fused with the running batch in one forward, its budget is
   ``max_batch_prefill_tokens - current_tokens`` (the running batch's decodes plus the next chunk
   of a partly prefilled request), and a decode forward follows.
3. **Prefix cache** (``radix.rs``): prompts only, inserted when a request finishes (its blocks
   then hold them); a new request matches whole blocks of its prompt (if all of it matches, the
   last token is computed again); eviction takes the least recently used unreferenced leaf, cut
   from its tail by just what is needed.
4. **429** (router ``max_concurrent_requests``, default 128): a request arriving while that many
   are queued or running is refused (``Overloaded``, HTTP 429): rejected with that reason.
   Validation (HTTP 422) refuses a prompt of ``max_model_len`` tokens or more,
   ``prompt + max_tokens > max_model_len`` (TGI's ``max_total_tokens``) and, without chunking, a
   prompt longer than ``max_batch_prefill_tokens`` (the launcher requires ``max_input_tokens`` to
   fit it); a reservation larger than the whole pool could never be admitted and is rejected too.

The pool is ``max_batch_total_tokens`` tokens (TGI infers it at warm-up from free memory: null
means the engine's KV pool, ``num_gpu_blocks × block_size``) in blocks of ``block_size`` tokens
(1 with TGI's default flashinfer attention). TGI has no per-step token budget for decodes, so
``token_budget`` is None.

Unset, the pool is sized as TGI's warm-up sizes it (:mod:`sim.hardware.engine_memory`), and
``engine.max_num_seqs`` defaults to ``max_concurrent_requests`` (128): TGI has no running cap of its
own (``max_batch_size`` unset), and queued plus running requests never exceed that number, so the
two bound the same batch.

Where cbsim differs, on purpose: ``max_batch_size`` (unset in TGI) defaults to
``engine.max_num_seqs`` and bounds the running batch in both modes (TGI ignores it when chunking);
a chunked request's later chunks take ``max_batch_prefill_tokens`` minus the decodes (at least one
token), TGI's server-side continuation; an allocation made and given back unused within
``next_batch`` (a request pushed back to the queue) does not insert its never-computed prompt into
the trie, as TGI's ``BlockAllocation::drop`` would. Not modelled: speculation, sliding windows,
padded (non-paged) models, client disconnects.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from policies.base import EngineLimits, Knob, Policy, Request, Status, StepPlan
from policies.kv.radix import HeldSlotsView, RadixCache, RadixNode, request_tokens


class _Alloc:
    """A request's reservation: ``prefix`` tokens of cached prompt (trie, locked at ``node``) and
    ``private`` token slots of new blocks."""

    __slots__ = ("node", "prefix", "private")

    def __init__(self, node: RadixNode, prefix: int, private: int) -> None:
        self.node = node
        self.prefix = prefix
        self.private = private


class TgiPolicy(Policy):
    name = "tgi"
    summary = (
        "TGI v3 router: FIFO admission with KV reserved for prompt + max_new_tokens, no "
        "preemption, waiting_served_ratio / max_waiting_tokens or fused chunked prefill, radix "
        "prefix cache, 429 past max_concurrent_requests"
    )
    uses_token_budget = False
    kv_sizing = "tgi"  # sim/hardware/engine_memory.py sizes the pool
    engine_defaults_source = (
        "TGI's own: no running cap but max_concurrent_requests (128), pool from the warm-up "
        "(free memory × 0.9 after weights and one max_batch_prefill_tokens prefill)"
    )
    KNOBS = {
        "max_batch_prefill_tokens": Knob(4096, "prompt tokens one prefill may compute (rounded up "
                                               "to whole blocks)", int),
        "max_batch_total_tokens": Knob(None, "KV token slots of the pool (null: the engine's KV pool, "
                                             "which cbsim sizes as TGI's warm-up does unless "
                                             "engine.num_gpu_blocks pins it)", int),
        "waiting_served_ratio": Knob(0.3, "without chunking: a prefill interrupts the running batch "
                                          "only if at least this × batch size requests can join "
                                          "(TGI's launcher default; the bare router uses 1.2)", float),
        "max_waiting_tokens": Knob(20, "without chunking: after this many decode steps since the "
                                       "last admission, any number of requests may join", int),
        "max_batch_size": Knob(None, "requests in the running batch at most (null: "
                                     "engine.max_num_seqs; TGI leaves it unset)", int),
        "max_concurrent_requests": Knob(128, "queued + running requests at most; more are refused "
                                             "with HTTP 429", int),
        "prefill_chunking": Knob(True, "fuse new prefills (chunked to the budget) with the running "
                                       "batch (TGI's default for flash models)", bool),
        "prefix_caching": Knob(True, "radix prefix cache of prompts", bool),
        "block_size": Knob(1, "tokens per KV block (1 with flashinfer, TGI's default attention)", int),
    }

    @classmethod
    def engine_defaults(cls, limits: EngineLimits, knobs: dict[str, Any]) -> tuple[int, int]:
        """``max_num_seqs``: ``max_concurrent_requests`` (TGI's only bound on a batch's size besides
        memory); ``max_num_batched_tokens``: cbsim's 8192 (TGI budgets prefills by
        ``max_batch_prefill_tokens`` instead)."""
        seqs = limits.max_num_seqs
        if seqs is None:
            seqs = int(knobs.get("max_concurrent_requests") or 128)
        tokens = limits.max_num_batched_tokens
        return seqs, tokens if tokens is not None else 8192

    def __init__(self, limits: EngineLimits, **knobs: Any) -> None:
        super().__init__(limits, **knobs)
        k = self.knobs
        for key in ("max_batch_prefill_tokens", "max_concurrent_requests", "block_size"):
            if int(k[key]) < 1:
                raise ValueError(f"tgi {key} must be >= 1, got {k[key]}")
        if int(k["max_waiting_tokens"]) < 0:
            raise ValueError(f"tgi max_waiting_tokens must be >= 0, got {k['max_waiting_tokens']}")
        if not float(k["waiting_served_ratio"]) >= 0.0:
            raise ValueError(f"tgi waiting_served_ratio must be >= 0, got {k['waiting_served_ratio']}")
        for key in ("max_batch_total_tokens", "max_batch_size"):
            if k[key] is not None and int(k[key]) < 1:
                raise ValueError(f"tgi {key} must be >= 1, got {k[key]}")
        self.block = int(k["block_size"])
        total = k["max_batch_total_tokens"]
        total = limits.num_gpu_blocks * limits.block_size if total is None else int(total)
        self.cache = RadixCache(total, self.block, evict_mode="truncate", enabled=bool(k["prefix_caching"]))
        self.max_prefill = int(k["max_batch_prefill_tokens"])
        self.ratio = float(k["waiting_served_ratio"])
        self.max_waiting_tokens = int(k["max_waiting_tokens"])
        self.max_batch = limits.max_num_seqs if k["max_batch_size"] is None else int(k["max_batch_size"])
        self.max_concurrent = int(k["max_concurrent_requests"])
        self.chunking = bool(k["prefill_chunking"])
        self.queue: deque[Request] = deque()
        self.running: list[Request] = []
        self.partial: Request | None = None  # the one request whose prompt is still being chunked
        self.waiting_tokens = 0
        self._after_admission = False  # backend.rs: a decode follows every admission's prefill
        self._allocs: dict[Request, _Alloc] = {}
        self._rejected: list[Request] = []
        self.admission_hits: dict[str, int] = {}
        self.cached_tokens = 0
        self.num_429 = 0
        self.blocks = HeldSlotsView(self)

    # --- engine protocol ---------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        lim = self.limits
        if len(self.queue) + len(self.running) >= self.max_concurrent:
            self.num_429 += 1
            self._reject(req, f"429 Too Many Requests: {self.max_concurrent} requests already queued "
                              f"or running (max_concurrent_requests)", refused=True)
            return
        if req.prompt_tokens >= lim.max_model_len:
            self._reject(req, f"422: prompt of {req.prompt_tokens} tokens must be shorter than "
                              f"max_model_len {lim.max_model_len} (TGI's max_input_tokens)")
            return
        if req.prompt_tokens + req.max_tokens > lim.max_model_len:
            self._reject(req, f"422: prompt {req.prompt_tokens} + max_tokens {req.max_tokens} exceeds "
                              f"max_model_len {lim.max_model_len} (TGI's max_total_tokens)")
            return
        budget = self.cache.ceil_page(self.max_prefill)
        if not self.chunking and req.prompt_tokens > budget:
            self._reject(req, f"422: prompt of {req.prompt_tokens} tokens exceeds max_batch_prefill_tokens "
                              f"{self.max_prefill} and prefill_chunking is off (TGI requires "
                              f"max_input_tokens <= max_batch_prefill_tokens then)")
            return
        need = self.cache.ceil_page(self._reserved_tokens(req))
        if need > self.cache.capacity:
            self._reject(req, f"reserving prompt + max_tokens needs {need} KV token slots; the whole "
                              f"pool has {self.cache.capacity}")
            return
        req.status = Status.WAITING
        self.queue.append(req)

    def _reject(self, req: Request, reason: str, refused: bool = False) -> None:
        """``refused``: turned away for the load (429), not for the request itself (422)."""
        req.status = Status.REJECTED
        req.reject_reason = reason
        req.refused = refused
        self._rejected.append(req)

    @staticmethod
    def _reserved_tokens(req: Request) -> int:
        """``input_length + max_new_tokens + speculate - 1`` (queue.rs; no speculation)."""
        return req.prompt_tokens + req.max_tokens - 1

    def has_work(self) -> bool:
        return bool(self.running or self.queue or self._rejected)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        if self._rejected:
            plan.rejected, self._rejected = self._rejected, []
        self.admission_hits = {}
        if self._after_admission:
            self._after_admission = False
            self._forward(plan, [])
            self.waiting_tokens += 1
        elif not self.running:
            new = self.next_batch(None, self.max_batch, self.max_prefill)
            if new:
                self._forward(plan, new)
                self.waiting_tokens = 1
        else:
            bs = len(self.running)
            max_size = self.max_batch - bs
            if self.chunking:
                min_size = None
                budget = max(self.max_prefill - self.current_tokens(), 0)
            else:
                min_size = None if self.waiting_tokens >= self.max_waiting_tokens else int(bs * self.ratio)
                budget = self.max_prefill
            new = self.next_batch(min_size, max_size, budget)
            if new:
                if self.chunking:
                    self._forward(plan, new)
                else:
                    self._forward(plan, new, paused=True)
                self.waiting_tokens = 1
                self._after_admission = True
            else:
                self._forward(plan, [])
                self.waiting_tokens += 1
        return plan

    def current_tokens(self) -> int:
        """Tokens the running batch computes in its next forward: one per decode plus the next
        chunk of a partly prefilled request."""
        decodes = len(self.running) - (1 if self.partial is not None else 0)
        return decodes + (self._next_chunk(decodes) if self.partial is not None else 0)

    def _next_chunk(self, decodes: int) -> int:
        left = self.partial.prompt_tokens - self.partial.num_computed_tokens
        return min(left, max(self.max_prefill - decodes, 1))

    # --- queue.rs::next_batch ------------------------------------------------------------------
    def next_batch(self, min_size: int | None, max_size: int | None,
                   prefill_budget: int) -> list[tuple[Request, int, int]] | None:
        """Admit from the queue; returns ``(request, prefix, tokens to prefill now)`` or None."""
        if not self.queue or (min_size is not None and len(self.queue) < min_size):
            return None
        if max_size is not None and max_size <= 0:
            return None
        B = self.block
        budget = -(-prefill_budget // B) * B
        prefill_tokens = 0
        batch: list[tuple[Request, int, int]] = []
        while self.queue:
            req = self.queue.popleft()
            alloc = self._allocate(req)
            if alloc is None:
                self.queue.appendleft(req)
                break
            prefix = alloc.prefix - 1 if alloc.prefix == req.prompt_tokens else alloc.prefix
            postfix = req.prompt_tokens - prefix
            if prefill_tokens + postfix > budget:
                chunk = budget - prefill_tokens if self.chunking else 0
                if chunk > 0:
                    batch.append((req, prefix, chunk))
                else:
                    self._give_back(req)
                    self.queue.appendleft(req)
                break
            prefill_tokens += postfix
            batch.append((req, prefix, postfix))
            if max_size is not None and len(batch) == max_size:
                break
        if not batch:
            return None
        if min_size is not None and len(batch) < min_size:
            for req, _, _ in reversed(batch):
                self._give_back(req)
                self.queue.appendleft(req)
            return None
        return batch

    def _allocate(self, req: Request) -> _Alloc | None:
        """``RadixAllocator::allocate``: match the prompt, pin the match, new blocks for the rest."""
        cache = self.cache
        prefix, node = cache.match_prefix(request_tokens(req, req.prompt_tokens), req.prompt_tokens)
        cache.inc_lock(node)  # pinned even if the allocation fails below
        private = cache.ceil_page(self._reserved_tokens(req) - prefix)
        if not cache.alloc(private):
            cache.dec_lock(node)
            return None
        alloc = self._allocs[req] = _Alloc(node, prefix, private)
        return alloc

    def _give_back(self, req: Request) -> None:
        """An allocation dropped unused inside next_batch (cbsim: nothing is inserted)."""
        alloc = self._allocs.pop(req)
        self.cache.free_private(alloc.private)
        self.cache.dec_lock(alloc.node)

    def _free(self, req: Request) -> None:
        """``RadixAllocator::free`` at the end of a request: its prompt blocks join the trie."""
        alloc = self._allocs.pop(req)
        cache = self.cache
        private = alloc.private
        aligned = cache.floor_page(req.prompt_tokens)
        if cache.enabled and aligned > alloc.prefix:
            cache.insert(request_tokens(req, aligned), aligned, alloc.prefix)
            private -= aligned - alloc.prefix
        cache.free_private(private)
        cache.dec_lock(alloc.node)

    # --- one forward ---------------------------------------------------------------------------
    def _forward(self, plan: StepPlan, new: list[tuple[Request, int, int]], paused: bool = False) -> None:
        """The running batch's decodes and chunk continuation (unless ``paused``), then the new
        requests' prefills."""
        if not paused:
            decodes = [r for r in self.running if r is not self.partial]
            for r in decodes:
                plan.add(r, 1, r.num_computed_tokens)
                r.num_computed_tokens += 1
            if self.partial is not None:
                r = self.partial
                n = self._next_chunk(len(decodes))
                plan.add(r, n, r.num_computed_tokens)
                r.num_computed_tokens += n
                if r.num_computed_tokens >= r.prompt_tokens:
                    self.partial = None
        for req, prefix, n in new:
            req.status = Status.RUNNING
            req.num_computed_tokens = prefix
            plan.admitted.append(req)
            self.admission_hits[req.id] = prefix
            self.cached_tokens += prefix
            if prefix:
                plan.prefix_hit_tokens[req.id] = prefix
            plan.add(req, n, prefix)
            req.num_computed_tokens += n
            self.running.append(req)
            if req.num_computed_tokens < req.prompt_tokens:
                self.partial = req

    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        if not finished:
            return
        for r in finished:
            self._free(r)
            r.status = Status.FINISHED
        done = {id(r) for r in finished}
        self.running = [r for r in self.running if id(r) not in done]
        if not self.running:
            self._after_admission = False  # the batch is gone: the router waits for the queue

    # --- statistics ------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.queue)

    @property
    def max_slots(self) -> int:
        return self.max_batch

    def slots_held(self, req: Request) -> int:
        a = self._allocs.get(req)
        return a.prefix + a.private if a else 0

    def kv_blocks_total(self) -> int:
        return self.cache.capacity // self.block

    def kv_tokens_total(self) -> int:
        return self.cache.capacity

    def kv_blocks_used(self) -> int:
        """Blocks reserved by running requests (their pinned cached prefixes and new blocks)."""
        return (self.cache.protected_size + self.cache.private) // self.block

    def kv_tokens_reserved_and_used(self) -> tuple[int, int]:
        """(slots reserved for prompt + max_tokens, tokens computed): the reservation's waste."""
        held = sum(a.prefix + a.private for a in self._allocs.values())
        return held, sum(r.num_computed_tokens for r in self.running)

    def drain(self) -> list[Request]:
        out = self.running + list(self.queue)
        for r in list(self._allocs):
            self._give_back(r)
        self.running, self.partial = [], None
        self.queue.clear()
        return out

    def check_invariants(self) -> None:
        self.cache.check_invariants()
        assert set(self._allocs) == set(self.running), "reservations and the running batch differ"
        assert sum(a.private for a in self._allocs.values()) == self.cache.private, "private slots"
        for r in self.running:
            assert self.slots_held(r) >= self._reserved_tokens(r), f"{r.id}: reservation shrank"
