"""TensorRT-LLM's in-flight batching (TensorRT-LLM 1.2.1, PyTorch backend, the default ``PyExecutor``).

Release followed: **TensorRT-LLM v1.2.1** (tag ``376f7e1b``); the rules are in C++ and the
PyTorch executor binds them (``tensorrt_llm/_torch/pyexecutor/_util.py`` L855-860 builds
``BindCapacityScheduler`` and ``BindMicroBatchScheduler``). docs/trtllm.md cites each rule with its
file and line; in short, one call to :meth:`TrtllmPolicy.schedule` is one executor iteration:

1. **Active list.** Requests leave the waiting queue first come, first served
   (``SchedulerConfig.waiting_queue_policy`` = ``fcfs``, the only value) into the *active list*
   until it holds ``max_batch_size`` requests (``PyExecutor.max_num_active_requests``); the active
   list keeps arrival order, and a paused request keeps its place in it.
2. **Capacity scheduler** (``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``), which
   requests may run, by ``capacity_scheduler_policy``:

   - ``GUARANTEED_NO_EVICT`` (the default, ``llm_args.py`` L1467-1469): every request in
     generation runs, and its *remaining blocks to completion*
     (``ceil(min(prompt + max_new_tokens, max_seq_len) / tokens_per_block)`` minus the blocks it
     holds, ``kvCacheManager.cpp::getRemainingBlocksToCompletion`` L2267-2287) is taken from the
     free blocks (``NoEvictScheduledBlocksManager``, ``scheduledBlocksManager.cpp``); then the
     other requests (contexts, in active order) join while their own remaining blocks fit what is
     left, and the first that does not stops admission. Nothing is ever evicted.
   - ``MAX_UTILIZATION``: requests in active order, each needing only its *next step's* blocks
     (``getNeededBlocksOneStep``: a new context its whole prompt, a decode one block at a block
     boundary); when one does not fit, the *last started* request at or after it (a decode or a
     context past its first chunk) is paused (``schedulingRemoveSequence``) and the fit retried;
     with none to pause, scheduling stops. A paused request frees its KV, becomes a context again
     whose prompt is its prompt plus what it generated (``LlmRequest::pause``) and recomputes it
     later, from its place in the active list.
   - ``STATIC_BATCH``: ``GUARANTEED_NO_EVICT`` that admits new requests only when nothing is in
     generation (``GuaranteedNoEvictScheduler::impl<true>``).

   With ``enable_block_reuse``, a new context whose first not-yet-cached block another context
   scheduled in this step (or one mid-chunk) is contributing is skipped for this step, so that it
   reuses that block next step instead of computing it twice (``beneficialToSkip``).
3. **Micro-batch scheduler** (``microBatchScheduler.cpp::operator()``), over the fitting requests
   in the capacity scheduler's order (generation first, then contexts, under the no-evict
   policies): a decode costs one token, a context without chunking its whole length, and the
   first one that overflows ``max_num_tokens`` *stops the pass* (later requests wait a step); at
   most ``max_batch_size`` requests. With ``enable_chunked_prefill`` the contexts are collected
   and, if they do not all fit the tokens the decodes left, cut by ``context_chunking_policy``:
   ``FIRST_COME_FIRST_SERVED`` fills the rest in order, each cut chunk rounded down to a multiple
   of the chunk unit (``tokens_per_block``, ``py_executor_creator.py``); ``EQUAL_PROGRESS`` gives
   every context one unit per round while the budget lasts. A chunk of 0 waits. Context chunks and
   decodes share the step: the forward runs the contexts, then the decodes.
4. **KV** (``kvCacheManager.cpp``): blocks of ``tokens_per_block`` (32) tokens. A context's
   first chunk looks up reusable blocks of its prompt (``enable_block_reuse``, on by default) and
   starts after them (``LlmRequest::setPrepopulatedPromptLen``: at least one token is computed;
   a chunk that would end mid-block is cut back to the block boundary); finished requests leave
   their blocks cached, evicted least recently used first.

5. **The overlap scheduler** (``disable_overlap_scheduler`` False, ``TorchLlmArgs`` in
   ``llm_args.py``: on by default). ``PyExecutor._executor_loop_overlap`` (``py_executor.py``) runs
   each iteration as: fetch new requests (``_fetch_new_requests`` / ``_fetch_and_activate_new_requests``,
   up to ``max_num_active_requests`` minus the active ones), schedule step k + 1, launch its forward,
   and only then ``_process_previous_batch`` for step k (which waits for step k's tokens and runs
   ``_handle_responses``, emitting them and removing finished requests). So the fetch for step
   k + 1 happens as step k starts on the GPU: a request arriving while step k runs (a closed-loop
   client answering a token emitted at step k - 1's end, too) enters step k + 2, one step later
   than without the overlap; an executor with no active request blocks in its fetch and takes a
   request at once. cbsim keeps such a request out of the active list until one more step has
   been scheduled (:meth:`TrtllmPolicy._fetch`). The step the overlap scheduler also runs for a
   request that has just finished (scheduled before its last token was seen) is not modelled.

What a client sees when the engine is full: the request queues (waiting queue, then the active
list) until the capacity scheduler admits it; TensorRT-LLM has no HTTP 429 of its own.

Where cbsim differs, on purpose and without changing a decision the engine makes:

* KV blocks are taken per computed chunk from the shared paged KV manager
  (:class:`policies.kv.paged.PagedKVManager`), not for the whole prompt at the first chunk; the
  capacity checks count blocks as TensorRT-LLM does (the prompt blocks a started context has yet
  to take count as held by it, not free: ``_free_blocks``), so every admission and pause is the
  engine's.
* Reuse is of whole blocks, registered as they are computed (vLLM-style hashes): TensorRT-LLM
  also reuses a partly matching last block (``enable_partial_reuse``) and stores a context's
  blocks when its context phase ends, so a request arriving while another is mid-context may
  reuse that one's finished chunks a little earlier here.
* Where TensorRT-LLM would wait forever or raise, the request is rejected with a reason: a prompt
  of ``max_seq_len`` tokens or more (``default_max_tokens <= 0`` in ``base_worker.py``), a
  reservation larger than the whole pool, a context longer than ``max_num_tokens`` with chunking
  off (``TLLM_CHECK`` in the micro-batch scheduler), a paused context larger than the pool.

Speculative decoding (:meth:`TrtllmPolicy.enable_speculation`; the PyTorch backend's
``speculative_config``: ``Eagle3DecodingConfig``, ``MTPDecodingConfig``, ``NGramDecodingConfig``,
``DraftTargetDecodingConfig``, with ``max_draft_len`` = ``k``; EAGLE-1/2 heads run only on the
TensorRT engine backend, so ``eagle`` is refused):

* A context's forward also drafts (the one-model EAGLE-3/MTP workers run the draft layers in the
  same pass; the two-model drafters right after it), so from its first generation step every
  request verifies ``k`` drafts.
* **Micro-batch scheduler**: a generation request counts ``beamWidth + getNumDraftTokens()`` =
  ``1 + k`` tokens against ``max_num_tokens``, and the first one that overflows stops the pass as
  a decode does (``microBatchScheduler.cpp`` ``operator()``, the generation branch).
* **KV**: each generation step adds ``1 + k`` tokens to the sequence (``resource_manager.py``
  ``KVCacheManager.prepare_resources``: ``add_token`` once, then once per draft); after the step
  ``update_resources`` rewinds the rejected ones (``rewind_kv_cache(request, py_rewind_len)``,
  ``py_rewind_len = drafts - accepted`` in ``sampler.py``). ``getNeededBlocksOneStep`` sizes a
  generation step as ``min(1 + k, max_new_tokens - generated)`` tokens
  (``kvCacheManager.cpp``), so drafts never run past the request's reservation; cbsim cuts ``k``
  the same way. ``getRemainingBlocksToCompletion`` (GUARANTEED_NO_EVICT) counts prompt +
  ``max_new_tokens`` only, drafts excluded.

Where speculation differs here: rewound slots stay in the request's blocks until it ends or is
paused (TensorRT-LLM frees a block the rewind empties), so the capacity checks count the blocks a
generating request really holds; at most ``ceil(k / tokens_per_block)`` blocks per request, and the
next step writes over them. The one-model workers' ``num_extra_kv_tokens`` (``k - 1`` slots per
request, ``speculative/utils.py`` ``get_num_extra_kv_tokens``) are not reserved. No decode
fast-forward while speculating.

Attention data parallelism (``enable_attention_dp``; cbsim's ``hardware.data_parallel`` > 1 on an
MoE model, each rank one of these policies, stepping in lockstep: :mod:`sim.lockstep`). With
``attention_dp_enable_balance`` (``attention_dp_config.enable_balance``, off by default as in
``AttentionDpConfig``) the group applies :class:`AdpBalance` each iteration: a rank's scheduled
context requests wait until every rank has one (``PyExecutor._balance_adp_requests``), at most
``attention_dp_timeout_iters`` iterations, and once every rank has one they wait
``attention_dp_batching_wait_iters`` more; the ranks' contexts then run in the same iteration, so
the others' decodes do not each wait out one rank's prefill. :meth:`TrtllmPolicy.propose` and
:meth:`TrtllmPolicy.hold_contexts` are the two halves the group calls around :meth:`schedule`.

Batch waiting (``batch_wait_timeout_iters``, ``batch_wait_max_tokens_ratio``; off by default, as in
``TorchLlmArgs``): ``PyExecutor._schedule`` passes an iteration's scheduled context requests through
``_waiting_requests`` when the iteration also has generation requests and attention DP is off. The
contexts run only once the iteration's tokens (every scheduled context's whole token count plus one
per generation request, and its drafts) reach ``ratio × max_num_tokens``, or once they have been held
``batch_wait_timeout_iters`` iterations in a row; until then only the generation requests run and the
count grows by one. :meth:`TrtllmPolicy._waiting_requests` is that rule.

Not modelled: ``max_attention_window`` (cyclic KV of sliding windows), beam search, LoRA pages, pipeline-parallel micro-batches (``inflight_request_ids``), host KV offload, the
overlap scheduler's extra step for a finished request.

KV pool size: sim/hardware/trtllm_kv.py sizes it as TensorRT-LLM does, from
``free_gpu_memory_fraction`` of the memory left after weights and the profiling pass.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from policies.base import EngineLimits, Knob, Policy, Request, Status, StepPlan
from policies.kv.paged import PagedDecodeStretch, PagedKVManager

TRTLLM_RELEASE = "1.2.1"
CAPACITY_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH")
CHUNKING_POLICIES = ("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS")
WAITING_QUEUE_POLICIES = ("fcfs",)
# llm_args.py (BaseLlmArgs.max_batch_size, max_num_tokens)
TRTLLM_MAX_BATCH_SIZE = 2048
TRTLLM_MAX_NUM_TOKENS = 8192
# Request.policy_state: False a context, True in generation, HANDOFF a request handed over with its
# prompt's KV computed elsewhere (disaggregated serving: TensorRT-LLM's DISAGG_GENERATION_INIT),
# holding no blocks here until the capacity scheduler admits it
HANDOFF = "handoff"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class AdpBalance:
    """TensorRT-LLM's attention-DP balance (``attention_dp_config.enable_balance``), one per
    lockstep group: whether an iteration's scheduled context requests run.

    ``PyExecutor._schedule`` (tensorrt_llm/_torch/pyexecutor/py_executor.py) runs the capacity and
    micro-batch schedulers, then, with ``enable_attention_dp`` and ``enable_balance``,
    ``_balance_adp_requests``: every rank all-gathers (its scheduled contexts, its scheduled
    generation requests) and, the same on every rank,

    * every rank has a context and a free slot (generation requests < ``max_batch_size``): the
      wait counter resets; if every rank also has a generation request, the contexts wait
      ``batching_wait_iters`` iterations more (counted, then reset), otherwise they run;
    * otherwise the contexts are held and the wait counter counts this iteration; when it reaches
      ``timeout_iters``, or some rank has no generation request, it resets and the contexts run.

    So while the ranks decode, a context runs only when every rank has one (or the counter times
    out), and then on every rank in that iteration. The counter counts every iteration that lacks a
    context on some rank, those with no context anywhere too, so a lone context waits between 0 and
    ``timeout_iters - 1`` iterations. A rank with no active request counts one generation request:
    ``_pad_attention_dp_dummy_request`` gives it a dummy before ``_schedule`` runs.
    ``AttentionDpConfig`` (tensorrt_llm/llmapi/llm_args.py): ``enable_balance`` False,
    ``timeout_iters`` 50, ``batching_wait_iters`` 10; ``attention_dp_config`` itself defaults to
    None (balance off). NVIDIA/TensorRT-LLM PR #6061.
    """

    def __init__(self, timeout_iters: int, batching_wait_iters: int, max_batch_size: int) -> None:
        self.timeout_iters = timeout_iters
        self.batching_wait_iters = batching_wait_iters
        self.max_batch = max_batch_size
        self.waiting = 0  # adp_ctx_waiting_iters_count
        self.batching = 0  # adp_ctx_batching_wait_iters_count
        self.held = 0  # iterations whose contexts were held on some rank (a statistic)

    def release(self, counts: list[tuple[int, int]]) -> bool:
        """Whether this iteration's scheduled contexts run, from every rank's (contexts, generation
        requests); False holds them on every rank."""
        all_free = all(g < self.max_batch for _, g in counts)
        all_ctx = all(c > 0 for c, _ in counts)
        all_gen = all(g > 0 for _, g in counts)
        run = True
        if all_free and all_ctx:
            self.waiting = 0
            if all_gen:
                if self.batching < self.batching_wait_iters:
                    self.batching += 1
                    run = False
                else:
                    self.batching = 0
        else:
            self.waiting += 1
            run = False
            if self.waiting >= self.timeout_iters or not all_gen:
                self.waiting = 0
                run = True
        if not run and any(c for c, _ in counts):
            self.held += 1
        return run


class TrtllmPolicy(PagedDecodeStretch, Policy):
    name = "trtllm"
    summary = (
        f"TensorRT-LLM {TRTLLM_RELEASE} (PyTorch backend): active list of max_batch_size, capacity "
        "scheduler (GUARANTEED_NO_EVICT reserves KV to completion; MAX_UTILIZATION pauses the newest), "
        "micro-batch scheduler under max_num_tokens, chunked context, block reuse"
    )
    engine_defaults_source = (
        f"TensorRT-LLM {TRTLLM_RELEASE}'s own (tensorrt_llm/llmapi/llm_args.py): max_batch_size "
        f"{TRTLLM_MAX_BATCH_SIZE} / max_num_tokens {TRTLLM_MAX_NUM_TOKENS} on every device"
    )
    kv_sizing = "trtllm"  # sim/hardware/trtllm_kv.py sizes the pool (free_gpu_memory_fraction)
    finish_step_reads_plan = False  # it releases the finished requests and reads no plan
    KNOBS = {
        "capacity_scheduler_policy": Knob(
            "GUARANTEED_NO_EVICT",
            "GUARANTEED_NO_EVICT: admit only with KV reserved for prompt + max_tokens, never evict; "
            "MAX_UTILIZATION: admit on next-step blocks, pause the newest started request when short; "
            "STATIC_BATCH: no-evict, admitting only when nothing is generating",
            str,
        ),
        "enable_chunked_prefill": Knob(
            False,
            "split contexts into chunks to fill max_num_tokens (off by default in TensorRT-LLM's LLM API)",
            bool,
        ),
        "context_chunking_policy": Knob(
            "FIRST_COME_FIRST_SERVED",
            "with chunking: FIRST_COME_FIRST_SERVED fills the budget in order; EQUAL_PROGRESS gives "
            "every context one tokens_per_block unit per round",
            str,
        ),
        "waiting_queue_policy": Knob("fcfs", "order requests leave the waiting queue (fcfs, the only value)", str),
        "tokens_per_block": Knob(32, "tokens per KV block (kv_cache_config.tokens_per_block); also the chunk unit",
                                 int),
        "enable_block_reuse": Knob(True, "reuse cached KV blocks of identical prompt prefixes (on by default)",
                                   bool),
        "free_gpu_memory_fraction": Knob(
            0.9,
            "fraction of the memory left after weights and the profiling pass that the KV cache takes "
            "(kv_cache_config; read when the pool is sized)",
            float,
        ),
        "disable_overlap_scheduler": Knob(
            False,
            "False (TensorRT-LLM's default): the overlap scheduler fetches a step's new requests when the "
            "step before it starts, so a request arriving while step k runs enters step k + 2, one step "
            "later than without it (True); an idle engine takes a request at once",
            bool,
        ),
        "batch_wait_timeout_iters": Knob(
            0,
            "iterations an iteration's context requests may be held while generation requests run, "
            "to batch more contexts together (0 with batch_wait_max_tokens_ratio 0: off, the default)",
            int,
        ),
        "batch_wait_max_tokens_ratio": Knob(
            0.0,
            "held contexts run once the iteration's context tokens plus its generation requests reach "
            "this fraction of max_num_tokens (with batch_wait_timeout_iters; 0: off)",
            float,
        ),
        "attention_dp_enable_balance": Knob(
            False,
            "attention DP (hardware.data_parallel > 1 on an MoE model): hold a rank's scheduled context "
            "requests until every rank has one, so that the ranks prefill in the same iteration "
            "(attention_dp_config.enable_balance; off by default)",
            bool,
        ),
        "attention_dp_timeout_iters": Knob(
            50,
            "with balance: iterations a context waits for the other ranks' before it runs anyway "
            "(attention_dp_config.timeout_iters)",
            int,
        ),
        "attention_dp_batching_wait_iters": Knob(
            10,
            "with balance: iterations every rank's contexts wait, once all ranks have one, to gather more "
            "(attention_dp_config.batching_wait_iters)",
            int,
        ),
    }

    @classmethod
    def engine_defaults(cls, limits: EngineLimits, knobs: dict[str, Any]) -> tuple[int, int]:
        """TensorRT-LLM's ``max_batch_size`` / ``max_num_tokens`` (llm_args.py), on every device."""
        seqs = limits.max_num_seqs if limits.max_num_seqs is not None else TRTLLM_MAX_BATCH_SIZE
        tokens = limits.max_num_batched_tokens if limits.max_num_batched_tokens is not None else TRTLLM_MAX_NUM_TOKENS
        return seqs, tokens

    def __init__(self, limits: EngineLimits, **knobs: Any) -> None:
        super().__init__(limits, **knobs)
        k = self.knobs
        for key, allowed in (("capacity_scheduler_policy", CAPACITY_POLICIES),
                             ("context_chunking_policy", CHUNKING_POLICIES),
                             ("waiting_queue_policy", WAITING_QUEUE_POLICIES)):
            if k[key] not in allowed:
                raise ValueError(f"trtllm {key} must be one of {list(allowed)}, got {k[key]!r}")
        tpb = int(k["tokens_per_block"])
        if tpb < 1:
            raise ValueError(f"trtllm tokens_per_block must be >= 1, got {tpb}")
        if not 0.0 < float(k["free_gpu_memory_fraction"]) <= 1.0:
            raise ValueError(f"trtllm free_gpu_memory_fraction must be in (0, 1], got {k['free_gpu_memory_fraction']}")
        pool_tokens = limits.num_gpu_blocks * limits.block_size
        blocks = pool_tokens // tpb
        if blocks < 1:
            raise ValueError(f"trtllm: a KV pool of {pool_tokens} tokens holds no block of tokens_per_block {tpb}; "
                             f"lower tokens_per_block or give the pool more memory")
        self.chunked = bool(k["enable_chunked_prefill"])
        if self.chunked and limits.max_num_batched_tokens < tpb:
            raise ValueError(f"trtllm: max_num_tokens {limits.max_num_batched_tokens} is smaller than the chunk "
                             f"unit tokens_per_block {tpb}; a cut context chunk could never be scheduled")
        policy = k["capacity_scheduler_policy"]
        self.no_evict = policy != "MAX_UTILIZATION"
        self.static = policy == "STATIC_BATCH"
        self.equal_progress = k["context_chunking_policy"] == "EQUAL_PROGRESS"
        self.reuse = bool(k["enable_block_reuse"])
        self.B = tpb
        self.num_blocks = blocks
        self.max_batch = limits.max_num_seqs
        self.budget = limits.max_num_batched_tokens
        self.kv = PagedKVManager(blocks, tpb, limits.max_model_len, enable_caching=self.reuse)
        self.active: list[Request] = []  # arrival order; policy_state True: in generation
        self.queue: deque[Request] = deque()
        self._rejected: list[Request] = []
        self._hashes: dict[Request, Any] = {}  # block hashes of prompts (beneficialToSkip)
        self._started = 0  # active requests holding KV (num_computed_tokens > 0)
        self._stored_tokens = 0  # sum of num_computed_tokens over requests holding blocks
        self.balance = bool(k["attention_dp_enable_balance"])
        if self.balance:
            for key in ("attention_dp_timeout_iters", "attention_dp_batching_wait_iters"):
                if int(k[key]) < 0:  # AttentionDpConfig.validate_attention_dp_config
                    raise ValueError(f"trtllm {key} must be >= 0 when attention_dp_enable_balance is on, "
                                     f"got {k[key]}")
        self.wait_iters = int(k["batch_wait_timeout_iters"])
        self.wait_ratio = float(k["batch_wait_max_tokens_ratio"])
        if self.wait_iters < 0 or not 0.0 <= self.wait_ratio <= 1.0:  # TorchLlmArgs' validators
            raise ValueError(f"trtllm batch_wait_timeout_iters must be >= 0 and batch_wait_max_tokens_ratio in "
                             f"[0, 1], got {self.wait_iters} and {self.wait_ratio}")
        self.batch_waiting = self.wait_iters > 0 or self.wait_ratio > 0.0
        self._waited = 0  # batch_wait_iters_count
        self._proposed: tuple[StepPlan, list, list] | None = None  # propose(): the scheduler's output
        # the overlap scheduler (module doc, item 5): requests not yet fetched, with the step they may enter
        self.overlap = not bool(k["disable_overlap_scheduler"])
        self._steps = 0  # iterations run so far (non-empty plans; a lockstep rank's idle ones too)
        self._peers: tuple[TrtllmPolicy, ...] = (self,)  # the attention-DP ranks that fetch together
        self._in_flight = False  # a scheduled step has not finished yet
        self._unfetched: deque[tuple[int, Request]] = deque()

    # --- speculative decoding (see the module doc) ------------------------------------------------
    supports_speculation = True
    speculative_methods = ("ngram", "eagle3", "mtp", "draft")  # the PyTorch backend's decoding types

    def enable_speculation(self, num_speculative_tokens: int, num_lookahead_tokens: int = 0) -> None:
        """``max_draft_len`` drafts verified per generation request and step."""
        if num_speculative_tokens < 1:
            raise ValueError(f"trtllm max_draft_len must be >= 1, got {num_speculative_tokens}")
        self.num_speculative_tokens = int(num_speculative_tokens)

    def reject_drafts(self, plan: StepPlan, rejected: list[int]) -> None:
        for r, n in zip(plan.scheduled, rejected):
            if n:  # rewind_kv_cache: the positions are no longer computed
                r.num_computed_tokens -= n
                self._stored_tokens -= n

    def _drafts(self, r: Request) -> int:
        """Drafts of a generation request this step: ``k``, cut to what its reservation still
        holds (``min(1 + k, max_new_tokens - generated)`` tokens, ``getNeededBlocksOneStep``)."""
        d = self._total_tokens(r) - r.num_tokens
        k = self.num_speculative_tokens
        return k if d > k else (d if d > 0 else 0)

    def _held_blocks(self, r: Request) -> int:
        """Blocks a generating request really holds while speculating (rewound slots included)."""
        st = self.kv.request_states().get(r)
        return len(st.blocks) if st is not None else 0

    # --- requests in and out ---------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        lim, B = self.limits, self.B
        if req.prompt_tokens >= lim.max_model_len:
            self._reject(req, f"prompt of {req.prompt_tokens} tokens leaves no room for an output token within "
                              f"max_seq_len {lim.max_model_len}")
            return
        if not self.chunked and not req.num_computed_tokens and req.prompt_tokens > self.budget:
            self._reject(req, f"prompt of {req.prompt_tokens} tokens exceeds max_num_tokens {self.budget} and "
                              f"enable_chunked_prefill is off")
            return
        if self.no_evict and self._total_blocks(req) > self.num_blocks:
            self._reject(req, f"reserving prompt + max_tokens ({self._total_tokens(req)} tokens) needs "
                              f"{self._total_blocks(req)} KV blocks; the whole pool has {self.num_blocks}")
            return
        if _cdiv(req.prompt_tokens, B) > self.num_blocks:
            self._reject(req, f"prompt of {req.prompt_tokens} tokens needs {_cdiv(req.prompt_tokens, B)} KV blocks; "
                              f"the whole pool has {self.num_blocks}")
            return
        req.status = Status.WAITING
        req.policy_state = HANDOFF if req.num_computed_tokens else False
        if self.overlap and any(p._in_flight or p.active or p.queue for p in self._peers):
            # the overlap loop (py_executor.py _executor_loop_overlap) fetches the requests of step
            # k + 1 when step k starts on the GPU: one arriving while step k runs, or as it ends,
            # enters step k + 2 (the next step scheduled without it). Under attention DP the fetch
            # is the ranks' together (_fetch_new_requests sums the active requests of all ranks):
            # a request for an idle rank of a busy group waits for it too.
            self._unfetched.append((self._steps + 1, req))
            return
        self._enter(req)

    def join_lockstep(self, peers: list[Policy]) -> None:
        self._peers = tuple(peers)

    def idle_iteration(self) -> None:
        self._steps += 1  # a rank's dummy iteration counts: the fetch's step numbers are the group's

    def _enter(self, req: Request) -> None:
        if len(self.active) < self.max_batch:
            self.active.append(req)
        else:
            self.queue.append(req)

    def _fetch(self) -> None:
        """The overlap scheduler's fetch: requests whose step has come join the waiting queue. An
        idle executor (nothing started on any rank) blocks in its fetch until a request comes and
        then takes every request queued, every rank's under attention DP; the first rank to fetch
        in an iteration sees the group as it was when the iteration began."""
        if all(not p._started and not any(r.policy_state for r in p.active) for p in self._peers):
            for p in self._peers:
                while p._unfetched:
                    p._enter(p._unfetched.popleft()[1])
            return
        pending = self._unfetched
        while pending and pending[0][0] <= self._steps:
            self._enter(pending.popleft()[1])

    def _reject(self, req: Request, reason: str) -> None:
        req.status = Status.REJECTED
        req.reject_reason = reason
        self._rejected.append(req)

    def _drop(self, req: Request, reason: str) -> None:
        """Reject a request of the active list (it holds no KV)."""
        self.kv.release(req)
        self._hashes.pop(req, None)
        self.active.remove(req)
        self._reject(req, reason)

    def _refill(self) -> None:
        active, queue = self.active, self.queue
        while queue and len(active) < self.max_batch:
            active.append(queue.popleft())

    # --- block arithmetic (kvCacheManager.cpp) -----------------------------------------------------
    def _total_tokens(self, r: Request) -> int:
        return min(r.prompt_tokens + r.max_tokens, self.limits.max_model_len)

    def _total_blocks(self, r: Request) -> int:
        return _cdiv(self._total_tokens(r), self.B)

    def _held(self, r: Request) -> int:
        """Blocks the request holds as TensorRT-LLM counts them: a started context holds its whole
        prompt (``addSequence`` at its first chunk), anything else the blocks of its computed tokens."""
        c = r.num_computed_tokens
        if r.policy_state is HANDOFF:
            return 0
        if c and not r.policy_state:
            return _cdiv(r.num_tokens, self.B)
        if self.num_speculative_tokens and r.policy_state:
            return self._held_blocks(r)
        return _cdiv(c, self.B)

    def _free_blocks(self) -> int:
        """Free blocks as TensorRT-LLM counts them: here a started context takes its prompt's blocks
        chunk by chunk, so the ones it has yet to take are not free."""
        free = self.kv.num_free_blocks
        B = self.B
        for r in self.active:
            c = r.num_computed_tokens
            if c and not r.policy_state:
                free -= _cdiv(r.num_tokens, B) - _cdiv(c, B)
        return free

    def _remaining_to_completion(self, r: Request) -> int:
        """getRemainingBlocksToCompletion: blocks to completion minus the blocks it holds."""
        return self._total_blocks(r) - self._held(r)

    def _needed_one_step(self, r: Request) -> int:
        """getNeededBlocksOneStep: a new context its whole prompt, a started one nothing more, a
        decode one block when its next token starts one."""
        B = self.B
        c = r.num_computed_tokens
        if r.policy_state is HANDOFF:
            return _cdiv(c + 1, B)  # the transferred KV and its next token
        if r.policy_state:
            if self.num_speculative_tokens:  # 1 + drafts, into the blocks it really holds
                return max(_cdiv(c + 1 + self._drafts(r), B) - self._held_blocks(r), 0)
            return _cdiv(c + 1, B) - _cdiv(c, B)
        return 0 if c else _cdiv(r.num_tokens, B)

    # --- beneficialToSkip (capacityScheduler.cpp) ---------------------------------------------------
    def _new_context_block(self, r: Request) -> int | None:
        """The hash of the first full block of the request's prompt not in the cache (None: all cached)."""
        kv = self.kv
        rh = self._hashes.get(r)
        if rh is None:
            rh = self._hashes[r] = kv.hasher.new_request(r.prompt_runs, r.prompt_tokens, r.output_key)
        start = _cdiv(r.num_computed_tokens, self.B) if r.num_computed_tokens else 0
        for i in range(start, r.num_tokens // self.B):
            h = kv.hasher.hash_at(rh, i)
            if kv.pool.get_cached_block(h) is None:
                return h
        return None

    def _contributions(self) -> set[int]:
        """prefillWithChunkedContextsAlreadyExecuting: blocks contexts past their first chunk contribute."""
        out: set[int] = set()
        for r in self.active:
            if not r.policy_state and r.num_computed_tokens:
                h = self._new_context_block(r)
                if h is not None:
                    out.add(h)
        return out

    def _skip(self, r: Request, contributed: set[int]) -> bool:
        if r.policy_state or r.num_computed_tokens:
            return False  # only a context at its first chunk may be skipped (not a hand-off either)
        h = self._new_context_block(r)
        if h is None:
            return False
        if h in contributed:
            return True
        contributed.add(h)
        return False

    # --- capacity scheduler -------------------------------------------------------------------------
    def _capacity_no_evict(self) -> list[Request]:
        """GuaranteedNoEvictScheduler::impl (StaticBatchScheduler: impl<true>)."""
        avail = self._free_blocks()
        scheduled: list[Request] = []
        pending: list[Request] = []
        handoffs: list[Request] = []
        for r in self.active:
            if len(scheduled) >= self.max_batch:
                break
            if r.policy_state is True:
                scheduled.append(r)
                avail -= self._remaining_to_completion(r)
            elif r.policy_state is HANDOFF:
                handoffs.append(r)
            else:
                pending.append(r)
        if self.static and scheduled:
            return scheduled
        contributed = self._contributions() if self.reuse and not self.static else None
        for group in (handoffs, pending):  # pendingDisGenInitRequests first; a break ends one group
            for r in group:
                if r.policy_state is not HANDOFF and contributed is not None and self._skip(r, contributed):
                    continue
                if len(scheduled) >= self.max_batch:
                    break
                need = self._remaining_to_completion(r)
                if need > avail:
                    break
                scheduled.append(r)
                avail -= need
        return scheduled

    def _capacity_max_utilization(self, plan: StepPlan) -> list[Request]:
        """MaxUtilizationScheduler::operator(): greedy, pausing the last started request."""
        active = self.active
        free = self._free_blocks()
        needed = 0
        scheduled: list[Request] = []
        contributed = self._contributions() if self.reuse else None
        i, end = 0, len(active)
        while i < end:
            r = active[i]
            if contributed is not None and self._skip(r, contributed):
                i += 1
                continue
            need = self._needed_one_step(r)
            unstarted = r.policy_state is HANDOFF or not (r.policy_state or r.num_computed_tokens)
            if unstarted and need > self.num_blocks:
                self._drop(r, f"needs {need} KV blocks at {r.num_tokens} tokens (prompt + generated); the whole "
                              f"pool has {self.num_blocks}")
                end -= 1
                continue
            if len(scheduled) < self.max_batch and needed + need <= free:
                scheduled.append(r)
                needed += need
                i += 1
                continue
            j = end - 1
            while j >= i and (active[j].policy_state is HANDOFF
                              or not (active[j].policy_state or active[j].num_computed_tokens)):
                j -= 1
            if j < i:
                break
            self._pause(active[j], plan)
            free = self._free_blocks()
            end = j
        return scheduled

    def _pause(self, r: Request, plan: StepPlan) -> None:
        """LlmRequest::pause: KV freed, generated tokens appended to the prompt, a context again."""
        self.kv.free(r)
        self._stored_tokens -= r.num_computed_tokens
        self._started -= 1
        r.num_computed_tokens = 0
        r.policy_state = False
        r.status = Status.PREEMPTED
        r.num_preemptions += 1
        plan.preempted.append(r)
        if not self.chunked and r.num_tokens > self.budget:
            self._drop(r, f"paused at {r.num_tokens} tokens (prompt + generated), more than max_num_tokens "
                          f"{self.budget} with enable_chunked_prefill off")

    # --- micro-batch scheduler ----------------------------------------------------------------------
    def _micro_batch(self, fitting: list[Request]) -> tuple[list[tuple[Request, int]], list[Request]]:
        """MicroBatchScheduler::operator(): (contexts with their chunk sizes, decodes)."""
        budget = self.budget
        batch_tokens = 0
        count = 0
        contexts: list[tuple[Request, int]] = []
        chunked: list[Request] = []
        n_chunked = 0
        all_fit = True
        gens: list[Request] = []
        spec = self.num_speculative_tokens
        for r in fitting:
            if r.policy_state:
                n = 1 + self._drafts(r) if spec else 1  # beamWidth + getNumDraftTokens()
                if batch_tokens + n > budget:
                    break
                gens.append(r)
                batch_tokens += n
            elif not self.chunked:
                n = r.num_tokens  # getNumTokens: the whole context
                if batch_tokens + n > budget:
                    break
                contexts.append((r, n))
                batch_tokens += n
            else:
                remaining = r.num_tokens - r.num_computed_tokens
                if remaining > budget:  # mMaxContextLength = max_num_tokens
                    remaining = budget
                    all_fit = False
                chunked.append(r)
                n_chunked += remaining
            count += 1
            if count >= self.max_batch:
                break
        if chunked:
            capacity = budget - batch_tokens
            if n_chunked > capacity:
                all_fit = False
            rem = [r.num_tokens - r.num_computed_tokens for r in chunked]
            sizes = rem if all_fit else self._chunk_sizes(rem, capacity)
            contexts.extend((r, n) for r, n in zip(chunked, sizes) if n > 0)
        return contexts, gens

    def _chunk_sizes(self, rem: list[int], capacity: int) -> list[int]:
        """setCtxRequestsChunkSize: FIRST_COME_FIRST_SERVED or EQUAL_PROGRESS, in units of tokens_per_block."""
        unit, limit = self.B, self.budget
        if not self.equal_progress:
            sizes = []
            for left in rem:
                size = min(left, capacity, limit)
                if size != left:
                    size = size // unit * unit
                sizes.append(size)
                capacity -= size
            return sizes
        sizes = [0] * len(rem)
        total, progress = 0, True
        while total < capacity and progress:
            progress = False
            for idx, left in enumerate(rem):
                past = sizes[idx]
                actual = min(past + unit, left)
                inc = actual - past
                if total + inc > capacity or actual > limit:
                    continue
                sizes[idx] = actual
                total += inc
                progress = progress or inc > 0
        return sizes

    # --- attention DP: the ranks' balance (AdpBalance, run by sim.lockstep) ---------------------------
    def adp_balance(self) -> AdpBalance | None:
        """The balance rule a lockstep group of these ranks applies, None with balance off."""
        if not self.balance:
            return None
        k = self.knobs
        return AdpBalance(int(k["attention_dp_timeout_iters"]), int(k["attention_dp_batching_wait_iters"]),
                          self.max_batch)

    def propose(self) -> tuple[int, int]:
        """The capacity and micro-batch schedulers' output for this iteration, kept for
        :meth:`schedule`: (context requests, generation requests), what ``_balance_adp_requests``
        all-gathers. No KV is allocated for them yet (``prepare_resources`` runs after the balance);
        MAX_UTILIZATION's pauses have happened (its capacity pass frees the paused requests' KV),
        as in TensorRT-LLM, where the capacity scheduler runs before the balance too."""
        self._fetch()
        plan = StepPlan()
        fitting = self._capacity_no_evict() if self.no_evict else self._capacity_max_utilization(plan)
        contexts, gens = self._micro_batch(fitting)
        self._proposed = (plan, contexts, gens)
        return len(contexts), len(gens)

    def hold_contexts(self) -> None:
        """The balance holds this iteration's context requests: only the generation requests run
        (the group asks only the ranks that proposed)."""
        plan, _, gens = self._proposed
        self._proposed = (plan, [], gens)

    def _waiting_requests(self, contexts: list[tuple[Request, int]], gens: list[Request]) -> list[tuple[Request, int]]:
        """``PyExecutor._waiting_requests``: the contexts run once the iteration's tokens reach
        ``batch_wait_max_tokens_ratio × max_num_tokens`` or they have waited
        ``batch_wait_timeout_iters`` iterations; otherwise none runs and the count grows."""
        tokens = sum(r.num_tokens for r, _ in contexts) + sum(1 + self._drafts(r) for r in gens)
        if self._waited >= self.wait_iters or tokens >= self.wait_ratio * self.budget:
            self._waited = 0
            return contexts
        self._waited += 1
        return []

    # --- one iteration ------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        if self._proposed is None:  # no lockstep group's balance proposed this iteration
            self.propose()
        plan, contexts, gens = self._proposed
        self._proposed = None
        if self.batch_waiting and contexts and gens and len(self._peers) == 1:  # not under attention DP
            contexts = self._waiting_requests(contexts, gens)
        kv, B = self.kv, self.B
        for r, n in contexts:
            if r.num_computed_tokens == 0:  # first chunk: reuse, then allocate (add_sequence)
                hits, n_cached = kv.get_computed_blocks(r) if self.reuse else ([], 0)
                if n_cached and n_cached + n < r.num_tokens:  # setPrepopulatedPromptLen: end on a block
                    n = (n_cached + n) // B * B - n_cached
                n = min(n, r.num_tokens - n_cached)
                if kv.allocate_slots(r, n, n_cached, hits) is None:
                    raise AssertionError(f"{r.id}: a context the capacity scheduler admitted does not fit")
                if r.status is Status.WAITING:
                    plan.admitted.append(r)
                    if n_cached:
                        plan.prefix_hit_tokens[r.id] = n_cached
                r.num_computed_tokens = n_cached
                self._stored_tokens += n_cached
                self._started += 1
            elif kv.allocate_slots(r, n) is None:
                raise AssertionError(f"{r.id}: a context chunk the capacity scheduler admitted does not fit")
            r.status = Status.RUNNING
            c = r.num_computed_tokens
            plan.add(r, n, c)
            r.num_computed_tokens = c + n
            self._stored_tokens += n
            if c + n == r.num_tokens:
                r.policy_state = True  # context done: it samples its token and generates from now on
        spec = plan.spec_tokens = [0] * len(plan.scheduled) if self.num_speculative_tokens else None
        for r in gens:
            d = self._drafts(r) if spec is not None else 0
            if kv.allocate_slots(r, 1 + d) is None:
                raise AssertionError(f"{r.id}: a decode the capacity scheduler admitted does not fit")
            if r.policy_state is HANDOFF:  # admitted with its transferred KV: a decode from now on
                r.policy_state = True
                r.status = Status.RUNNING
                plan.admitted.append(r)
                self._started += 1
                self._stored_tokens += r.num_computed_tokens
            c = r.num_computed_tokens
            plan.add(r, 1 + d, c)
            r.num_computed_tokens = c + 1 + d
            self._stored_tokens += d
            if spec is not None:
                spec.append(d)
        self._stored_tokens += len(gens)
        if self._rejected:
            plan.rejected, self._rejected = self._rejected, []
            self._refill()
        if not plan.is_empty:
            self._steps += 1
            self._in_flight = True
        return plan

    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        self._in_flight = False
        if not finished:
            return
        for r in finished:  # batch order; with reuse the blocks stay cached (released to the free queue)
            self.kv.release(r)
            self._hashes.pop(r, None)
            self._stored_tokens -= r.num_computed_tokens
            self._started -= 1
            r.status = Status.FINISHED
        done = set(finished)
        self.active = [r for r in self.active if r not in done]
        self._refill()

    # --- statistics ---------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return self._started

    @property
    def num_waiting(self) -> int:
        return len(self.queue) + len(self.active) - self._started + len(self._unfetched)

    def has_work(self) -> bool:
        return bool(self.active or self.queue or self._rejected or self._unfetched)

    def kv_blocks_total(self) -> int:
        return self.num_blocks

    def kv_blocks_used(self) -> int:
        return self.kv.num_used_blocks

    def kv_tokens_reserved_and_used(self) -> tuple[int, int]:
        return self.kv.held_token_slots, self._stored_tokens

    def drain(self) -> list[Request]:
        out = self.active + list(self.queue) + [r for _, r in self._unfetched]
        self._unfetched.clear()
        for r in out:
            self.kv.release(r)
        self.active, self.queue = [], deque()
        self._hashes.clear()
        self._started = 0
        self._stored_tokens = 0
        self._proposed = None
        return out

    # --- pure-decode stretches (Policy.decode_stretch) ------------------------------------------------
    def decode_stretch(self) -> tuple[list[Request], int] | None:
        """Every started request is a decode one token away, and the next iterations until an
        arrival or a finish schedule exactly those: no request can join the active list (the
        waiting queue is empty or the list is full), every other active request is a context that
        has not started and (no-evict policies) the first of them does not fit the free blocks
        left after the decodes' reservations. That reservation arithmetic does not move while
        only decodes run: each decode's new block lowers the free blocks and its remaining blocks
        alike. Under MAX_UTILIZATION no unstarted context may wait (it could pause a decode), and
        the decodes' blocks must fit (decode_stretch_limit), which is also its fit check."""
        active = self.active
        if self.num_speculative_tokens or self._rejected or not active or (self.queue and len(active) < self.max_batch):
            return None
        if self._unfetched:  # a request the overlap scheduler fetches after some steps: step them
            return None
        gens: list[Request] = []
        first_pending = None
        context = 0
        for r in active:
            c = r.num_computed_tokens
            if r.policy_state is HANDOFF:
                return None
            if r.policy_state:
                if c != r.num_tokens - 1:
                    return None
                gens.append(r)
                context += c
            elif c or not self.no_evict:
                return None
            elif first_pending is None:
                first_pending = r
        if not gens or len(gens) > self.budget:
            return None
        if first_pending is not None and not self.static:
            avail = self.kv.num_free_blocks - sum(self._remaining_to_completion(r) for r in gens)
            if self._remaining_to_completion(first_pending) <= avail:
                return None
        return gens, context
