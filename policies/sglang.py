"""SGLang's scheduler (sglang 0.5.23, ``srt/managers/scheduler.py`` and ``schedule_policy.py``), step for step.

Release followed: **sglang 0.5.23** (reference/schedulers.md §7; "L" numbers below are that
release's lines as cited there; details the spec leaves open were settled from
sgl-project/sglang's ``schedule_policy.py``, ``mem_cache/prefill_budget.py`` and
``managers/schedule_batch.py``). One call to :meth:`SglangPolicy.schedule` is one iteration of
``event_loop_normal`` (L2026):

1. **Prefill first** (``get_next_batch_to_run`` L3894). If a prefill batch can be formed it runs
   and the decode batch waits this iteration; otherwise the running batch decodes one token each.
   With ``enable_mixed_chunk`` the running decodes ride along in the prefill batch
   (``mix_with_running``) when their next token fits (``check_decode_mem``, L4393-4440).
2. **Admission** (``_get_new_batch_prefill_raw`` L4079, ``PrefillAdder`` L607): nothing while
   ``batch_is_full`` (set when ``max_running_requests`` is reached or memory said NO_TOKEN, and
   cleared only when the running batch shrinks) unless a chunked request is in flight. The
   waiting queue is ordered by ``schedule_policy`` (§7.4), then requests are added in order under
   three budgets: ``rem_input_tokens`` (``max_prefill_tokens``), ``rem_chunk_tokens``
   (``chunked_prefill_size``; a prompt longer than what is left is cut to it and becomes the one
   *chunked request*, continued first in the next prefill batch) and memory:
   ``remaining_total = free + evictable - total_offset`` where ``total_offset`` starts at
   ``Σ_running min(max_new - generated, 4096) × new_token_ratio`` (``prefill_budget.py``) and
   grows by ``ceil_page(extend) + page + max_new`` per admitted request. A request is admitted
   only if ``extend + max_new + page < remaining_total``; the first that is not ends admission.
3. **new_token_ratio** (``new_token_ratio_tracker.py``): starts at
   ``min(0.7 × schedule_conservativeness, 1)``, falls by ``(init - min) / 600`` per decode step to
   ``min = init × 0.14``, is reset to ``init`` when the engine goes idle, and is recomputed on
   retraction.
4. **Retraction** (``update_running_batch`` L4459, ``retract_decode`` schedule_batch.py L3451):
   when the next decode's tokens do not fit even after evicting the radix tree, requests are
   retracted from the end of the running batch sorted by ``(generated, -prompt)`` descending (the
   fewest generated tokens first; among ties the longest prompt), at least one, until the rest
   fit. Each gives back its KV without inserting it in the tree (the prompt part already there
   stays cached), ``remaining × 20`` tokens are evicted, its progress is reset (generated tokens
   kept, to be prefilled again) and it is appended to the waiting queue. Then
   ``new_token_ratio = min(1, (Σ generated + 20 × remaining) / (Σ max_new + 1))``.
5. **Radix cache** (:class:`policies.kv.radix.RadixCache`): a new request matches its longest
   cached prefix (at most ``len - 1`` tokens), locks it while running; after its prefill its
   computed tokens are inserted (``cache_unfinished_req``), after it finishes its prompt and
   output (``cache_finished_req``); finished and retracted requests leave their prefix evictable.
6. **HiCache** (``enable_hierarchical_cache``, :class:`policies.kv.hiradix.HiRadixCache`): the tree
   keeps evicted nodes' copies in a host pool (``hicache_ratio`` × the GPU pool, or
   ``hicache_size`` GB per rank), written by ``hicache_write_policy``; a waiting request's match
   continues into host-only nodes, and ``add_one_req`` loads them back after its memory check
   (``init_load_back``, all or nothing), so the request computes only what neither tier holds.
   The load runs layer by layer beside the batch's forward pass (the step lasts
   ``max(h + c/L, h/L + c)``); write-back copies an eviction waited for are added to the step.

The KV pool is ``engine.num_gpu_blocks × engine.block_size`` tokens, managed in pages of
``page_size`` tokens (SGLang's default 1); unset, cbsim sizes it as SGLang does, by
``mem_fraction_static`` (:mod:`sim.hardware.engine_memory`). Engine settings used: ``max_num_seqs``
is the default of ``max_running_requests`` and, unset, SGLang's own
(:meth:`SglangPolicy.engine_defaults`: ``min(clamp(pool / context × 512, 2048, 4096), pool // 2)``,
about 4,096 for Llama-3-8B on an H200); ``max_num_batched_tokens`` is the default of
``chunked_prefill_size`` and, unset, SGLang's by GPU memory (:func:`sglang_chunk_default`: 8192 on
H100/H200); ``max_model_len`` the context length. SGLang has no per-step token budget (prefill batches are capped by the two prefill
budgets, decode batches by ``max_running_requests``), so ``token_budget`` is None.

What limits the running batch, read again in **sglang 0.5.6.post2** (the release of the H200
Llama-3.1-8B rows of AIConfigurator's corpus, docs/accuracy-corpus.md; wheel from PyPI,
``sglang/srt/...``), where all three rules are the ones this module implements:

* request slots: ``max_running_requests = min(pool // 2, req_to_token_pool.size)`` when unset
  (``managers/tp_worker.py`` L292-300), the slot pool ``max_num_reqs = min(max(int(pool /
  context_len × 512), 2048), 4096)`` (``model_executor/model_runner.py`` L1672-1681), admission
  stopping at it (``managers/scheduler.py`` ``get_num_allocatable_reqs`` L1722-1726, L1795-1797);
  :func:`sglang_running_cap`, at least 2,048 wherever the pool holds 4,096 tokens;
* the KV pool, by ``mem_fraction_static`` (``server_args.py`` L813-890: chunk 8192,
  ``cuda_graph_max_bs`` 256 below TP 4 and 512 from it, at least 10 GiB reserved; ``rest =
  available − total × (1 − fraction)`` over the cell size, ``model_runner.py`` L1438-1443):
  :mod:`sim.hardware.engine_memory`;
* the admission reservation: a request needs ``extend + min(max_new - generated, 4096)`` below
  ``free + evictable`` less ``Σ_running min(max_new - generated, 4096) × new_token_ratio`` and what
  the batch already took (``managers/schedule_policy.py`` L354-401, L439-452, L570-600), the ratio
  0.7 falling by ``(0.7 - 0.098) / 600`` per decode (``scheduler.py`` L497-509, L1950-1953,
  ``environ.py`` L177-181). 0.5.6.post2 adds no page to the need or to the reservation (0.5.23
  adds one page per request: with ``page_size`` 1, one token).

7. **Receiving** (``scheduler_recv_interval``, ``--scheduler-recv-interval``; :meth:`SglangPolicy._receive`):
   a request sent to the server reaches the waiting queue when the scheduler polls its socket,
   which it does every iteration by default and, above 1, once the weights of the batches it ran
   since its last poll (a decode 1, a prefill or mixed batch 1000, no batch 1) reach the interval:
   a request sent during a run of decodes waits for up to that many decode steps. InferenceMAX's
   B200 DeepSeek-R1 script sets 30 from 16 clients (10 below).

Where cbsim differs, on purpose (none of it changes a run SGLang completes): SGLang aborts a prompt
within 5 tokens of the context length or the pool (``max_req_input_len``); cbsim rejects only
prompts of ``max_model_len`` tokens or more, or larger than the pool, and admits a request alone
in an idle engine if its prompt fits (SGLang's clip of ``max_new_tokens`` to the pool would make
it admissible there). A lone running request whose next token cannot fit is rejected with a
reason (SGLang aborts it, or raises in older releases). ``random`` ordering uses a fixed seed.
cbsim's requests carry no ``ignore_eos``, so every running request reserves its remaining decodes
at ``new_token_ratio``, as 0.5.6.post2 does for all; 0.5.23 reserves them in full (ratio 1) for
``ignore_eos`` requests (``schedule_policy.py`` ``_get_running_request_total_token_offset``), and
both releases take ``add_one_req_ignore_eos``'s whole-future check for them when the radix cache
is disabled; neither is modelled.
Speculative decoding (:meth:`SglangPolicy.enable_speculation`; SGLang's EAGLE worker, chains only:
``--speculative-eagle-topk 1``, ``--speculative-num-steps k``, ``--speculative-num-draft-tokens k + 1``;
every ``--speculative-algorithm``: EAGLE, EAGLE3, NEXTN/MTP, STANDALONE (a draft model), NGRAM):

* ``server_args.py`` ``_handle_speculative_decoding`` turns ``enable_mixed_chunk`` off (and the
  overlap scheduler, not modelled anyway) and sets ``max_running_requests`` to 48 when it is unset
  (``sim.speculative.setup`` applies the 48 when neither the knob nor ``engine.max_num_seqs`` is given).
* Prefill batches carry no drafts: the draft model extends over the prompt in the same iteration
  (``forward_draft_extend``) and proposes the first ``k`` drafts, so every request of the running
  batch verifies ``k`` drafts in each decode batch: ``num_draft_tokens = k + 1`` tokens per request
  in the target's verify pass (``EagleVerifyInput``), cut only by the context length.
* Memory: the decode check asks for ``decode_mem_cache_buf_multiplier = num_draft_tokens +
  topk · num_steps`` (``scheduler.py`` ``init_memory_pool_and_cache``; ``num_draft_tokens + 1``
  for NGRAM, whose steps and top-k are unset) times the next decode's new pages
  (``check_decode_mem(buf_multiplier)``), which covers the verify slots and the draft steps' slots
  (those are taken and given back within the iteration, ``alloc_token_slots(..., backup_state=True)``
  and ``restore_state`` in ``eagle_worker.py`` ``draft``); retraction aims at the same need. The
  verify pass allocates ``k + 1`` slots per request (``prepare_for_verify``) and frees the rejected
  ones after it (``verify``: ``token_to_kv_pool_allocator.free`` of the evicted slots), so a request
  holds the pages of its accepted tokens only.

No decode fast-forward while speculating (every step's emission depends on a draw).

Not modelled: priority scheduling and its preemption, HiCache's storage tier (L3), tree drafting
(``--speculative-eagle-topk > 1``), overlap scheduling, data parallelism, LoRA, grammar queues.
"""

from __future__ import annotations

import random
from typing import Any

from policies.base import EngineLimits, Knob, Policy, Request, Status, StepPlan
from policies.kv.hiradix import HiRadixCache, host_pool_tokens
from policies.kv.radix import HeldSlotsView, RadixCache, RadixNode, request_tokens
from policies.sglang_queue import SCHEDULE_POLICIES, order_waiting_queue

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
MIB = 1 << 20


def sglang_chunk_default(device) -> int:
    """``chunked_prefill_size`` as SGLang picks it by GPU memory in MiB
    (``server_args.py`` ``_handle_gpu_memory_settings``; reference/schedulers.md §7.1): under 20 GiB
    2048, under 35 GiB 2048, under 60 GiB 4096, under 160 GiB (H100, H200) 8192, else 16384; 4096
    when the memory is unknown (a CPU)."""
    if device is None or device.kind != "gpu" or not device.memory_bytes:
        return 4096
    mib = device.memory_bytes / MIB
    for bound, chunk in ((20 * 1024, 2048), (35 * 1024, 2048), (60 * 1024, 4096), (160 * 1024, 8192)):
        if mib < bound:
            return chunk
    return 16384


def sglang_running_cap(pool_tokens: int, context_len: int) -> int:
    """SGLang's ``max_running_requests`` when unset (``resolve_max_num_reqs``,
    mem_cache/kv_cache_configurator.py L3119): ``min(clamp(int(pool / context × 512), 2048, 4096),
    pool // 2)``, at least 1."""
    per_context = int(pool_tokens / context_len * 512)
    return max(1, min(max(2048, min(per_context, 4096)), pool_tokens // 2))
CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"  # AddReqResult


class _ReqKV:
    """A request's share of the pool: ``cached`` tokens of locked tree prefix (up to ``node``)
    and ``alloc`` token slots in all (``alloc - cached`` of them private)."""

    __slots__ = ("node", "cached", "alloc", "match", "match_node", "host", "host_node")

    def __init__(self, root: RadixNode) -> None:
        self.node = root
        self.cached = 0
        self.alloc = 0
        self.match = 0  # the last radix match while waiting (init_next_round_input)
        self.match_node = root
        self.host = 0  # HiCache: tokens of host-only nodes after the GPU match (host_hit_length)
        self.host_node = root  # and the last of them (last_host_node)


class SglangPolicy(Policy):
    name = "sglang"
    summary = (
        "SGLang 0.5.23: prefill batches first, PrefillAdder admission under max_prefill_tokens, "
        "chunked_prefill_size and a new_token_ratio estimate of future decodes, retraction when "
        "decodes run out of memory, RadixAttention prefix cache"
    )
    uses_token_budget = False
    kv_sizing = "sglang"  # sim/hardware/engine_memory.py sizes the pool
    engine_defaults_source = (
        "SGLang's own: chunked_prefill_size by GPU memory (8192 on H100/H200), max_running_requests "
        "from the KV pool and context length (about 4096 on an H200), pool by mem_fraction_static"
    )
    KNOBS = {
        "schedule_policy": Knob("fcfs", "waiting-queue order: fcfs, lpm (longest cached prefix first; "
                                        "fcfs above 128 waiting), dfs-weight, lof (longest max_tokens "
                                        "first), random", str),
        "chunked_prefill_size": Knob(None, "tokens of prompt per prefill batch; longer prompts are "
                                           "chunked (null: engine.max_num_batched_tokens; <= 0: no "
                                           "chunking)", int),
        "max_prefill_tokens": Knob(16384, "prompt tokens one prefill batch may admit (the first "
                                          "request may exceed it when chunking is off)", int),
        "max_running_requests": Knob(None, "requests in the running batch at most (null: "
                                           "engine.max_num_seqs, else SGLang's own from the pool)", int),
        "mem_fraction_static": Knob(None, "(weights + KV pool) / GPU memory (null: SGLang's default "
                                          "by GPU memory, 0.906 on an H200); sizes the pool when "
                                          "engine.num_gpu_blocks is unset", float),
        "schedule_conservativeness": Knob(1.0, "scales the initial new_token_ratio (0.7 × this, "
                                               "at most 1)", float),
        "enable_mixed_chunk": Knob(False, "run the decodes inside prefill batches instead of "
                                          "pausing them", bool),
        "disable_radix_cache": Knob(False, "no prefix cache (SGLang's ChunkCache); cache-aware "
                                           "orders fall back to fcfs", bool),
        "page_size": Knob(1, "tokens per KV page; prefixes are matched and cached in whole pages", int),
        "enable_hierarchical_cache": Knob(False, "HiCache: radix nodes evicted from the GPU keep a copy in "
                                                 "host memory and are loaded back, layer by layer with the "
                                                 "forward pass (policies/kv/hiradix.py)", bool),
        "hicache_ratio": Knob(2.0, "host pool = this × the GPU pool's tokens (used when hicache_size is 0); "
                                   "must give more than the GPU pool", float),
        "hicache_size": Knob(0.0, "GB (1e9 bytes) of host memory per TP rank for HiCache; 0: hicache_ratio", float),
        "hicache_write_policy": Knob("write_through", "write_through (to host on insertion), "
                                                      "write_through_selective (on the second hit) or "
                                                      "write_back (on eviction from the GPU, the step waits)", str),
        "init_new_token_ratio": Knob(0.7, "SGLANG_INIT_NEW_TOKEN_RATIO", float),
        "min_new_token_ratio_factor": Knob(0.14, "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR: floor = "
                                                 "initial ratio × this", float),
        "new_token_ratio_decay_steps": Knob(600, "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: decode steps "
                                                 "from the initial ratio to the floor", int),
        "scheduler_recv_interval": Knob(1, "--scheduler-recv-interval: the scheduler takes new requests "
                                           "in only once its iterations' weights (a decode 1, a prefill "
                                           "or mixed batch 1000, an idle one 1) reach this; 1: every "
                                           "iteration (SGLang's default)", int),
        "retract_decode_steps": Knob(20, "SGLANG_RETRACT_DECODE_STEPS: decode tokens reserved per "
                                         "remaining request after a retraction", int),
    }

    @classmethod
    def engine_defaults(cls, limits: EngineLimits, knobs: dict[str, Any]) -> tuple[int, int]:
        """SGLang's own: ``max_num_batched_tokens`` (the chunk) by GPU memory, ``max_num_seqs``
        (the running cap) from the pool ``num_gpu_blocks × block_size`` and ``max_model_len``."""
        chunk = knobs.get("chunked_prefill_size")
        tokens = limits.max_num_batched_tokens
        if tokens is None:
            tokens = int(chunk) if chunk is not None and int(chunk) > 0 else sglang_chunk_default(limits.device)
        seqs = limits.max_num_seqs
        if seqs is None:
            mrr = knobs.get("max_running_requests")
            seqs = int(mrr) if mrr is not None else sglang_running_cap(
                limits.num_gpu_blocks * limits.block_size, limits.max_model_len)
        return seqs, tokens

    def __init__(self, limits: EngineLimits, **knobs: Any) -> None:
        super().__init__(limits, **knobs)
        k = self.knobs
        if k["mem_fraction_static"] is not None and not 0.0 < float(k["mem_fraction_static"]) <= 1.0:
            raise ValueError(f"sglang mem_fraction_static must be in (0, 1], got {k['mem_fraction_static']}")
        if k["schedule_policy"] not in SCHEDULE_POLICIES:
            raise ValueError(f"sglang schedule_policy must be one of {list(SCHEDULE_POLICIES)}, "
                             f"got {k['schedule_policy']!r}")
        for key in ("max_prefill_tokens", "page_size", "new_token_ratio_decay_steps"):
            if int(k[key]) < 1:
                raise ValueError(f"sglang {key} must be >= 1, got {k[key]}")
        if k["max_running_requests"] is not None and int(k["max_running_requests"]) < 1:
            raise ValueError(f"sglang max_running_requests must be >= 1, got {k['max_running_requests']}")
        if not 0.0 < float(k["schedule_conservativeness"]):
            raise ValueError(f"sglang schedule_conservativeness must be > 0, got {k['schedule_conservativeness']}")
        if int(k["scheduler_recv_interval"]) < 1:
            raise ValueError(f"sglang scheduler_recv_interval must be >= 1, got {k['scheduler_recv_interval']}")
        if int(k["retract_decode_steps"]) < 0:
            raise ValueError(f"sglang retract_decode_steps must be >= 0, got {k['retract_decode_steps']}")
        chunk = k["chunked_prefill_size"]
        chunk = limits.max_num_batched_tokens if chunk is None else int(chunk)
        self.page = int(k["page_size"])
        self.chunk_size: int | None = chunk if chunk > 0 else None
        self.max_prefill_tokens = int(k["max_prefill_tokens"])
        mrr = k["max_running_requests"]
        self.max_running = limits.max_num_seqs if mrr is None else int(mrr)
        self.mixed = bool(k["enable_mixed_chunk"])
        self.retract_steps = int(k["retract_decode_steps"])
        self.init_ratio = min(float(k["init_new_token_ratio"]) * float(k["schedule_conservativeness"]), 1.0)
        self.min_ratio = self.init_ratio * float(k["min_new_token_ratio_factor"])
        self.ratio_decay = (self.init_ratio - self.min_ratio) / int(k["new_token_ratio_decay_steps"])
        self.new_token_ratio = self.init_ratio
        self.host_link = None
        if k["enable_hierarchical_cache"]:
            self.cache = self._hicache(limits, k)
        else:
            self.cache = RadixCache(limits.num_gpu_blocks * limits.block_size, self.page,
                                    enabled=not k["disable_radix_cache"])
        self._loads: dict[str, int] = {}  # host tokens loaded back per request admitted this step
        # cache-aware orders become fcfs without a tree (_validate_and_adjust_policy)
        self.schedule_policy = k["schedule_policy"]
        if not self.cache.enabled and self.schedule_policy in ("lpm", "dfs-weight"):
            self.schedule_policy = "fcfs"
        self.rng = random.Random(0)
        self.waiting: list[Request] = []
        # sent, not yet received by the scheduler (--scheduler-recv-interval > 1; :meth:`_receive`)
        self.recv_interval = int(k["scheduler_recv_interval"])
        self.inbox: list[Request] = []
        self._recv_counter = 0
        self._last_kind: str | None = None  # the batch the last iteration ran: prefill, decode or None
        self.running: list[Request] = []  # running_batch.reqs that are still alive, in batch order
        self.zombies: list[Request] = []  # finished in a decode step, not yet filtered out of it
        self.chunked: Request | None = None
        self.batch_is_full = False
        self._state: dict[Request, _ReqKV] = {}
        self._rejected: list[Request] = []
        self._last: tuple[str, list[Request], list[Request]] | None = None  # kind, prefills, decodes
        # the last step was a pure decode batch: each request of the next one emitted in it
        # (StepPlan.num_decodes: the engine then counts their tokens in bulk)
        self._decoded_last = False
        self.cached_tokens = 0  # Σ radix hits over admissions (SGLang's cached_tokens)
        self.prefill_tokens = 0  # Σ prompt (and re-prefilled) tokens computed
        self.num_retractions = 0
        self.admission_hits: dict[str, int] = {}  # radix hits of this step's admissions
        self.blocks = HeldSlotsView(self)
        self.spec_buf = 1  # decode_mem_cache_buf_multiplier (1 without speculation)

    # --- speculative decoding (see the module doc) ------------------------------------------------
    supports_speculation = True

    def enable_speculation(self, num_speculative_tokens: int, num_lookahead_tokens: int = 0) -> None:
        """Verify ``num_speculative_tokens`` drafts per running request in every decode batch;
        ``num_lookahead_tokens`` > 0 marks a model drafter (EAGLE, MTP, STANDALONE: ``topk · num_steps``
        draft slots in the memory check), 0 the n-gram one."""
        k = int(num_speculative_tokens)
        if k < 1 or num_lookahead_tokens < 0:
            raise ValueError(f"sglang speculative_num_steps must be >= 1, got {num_speculative_tokens}")
        self.num_speculative_tokens = k
        self.spec_buf = (k + 1) + (k if num_lookahead_tokens else 1)
        self.mixed = False  # _handle_speculative_decoding: mixed chunked prefill is disabled

    def reject_drafts(self, plan: StepPlan, rejected: list[int]) -> None:
        """After the verify pass: the rejected drafts' slots go back to the pool (whole pages)."""
        cache = self.cache
        for r, n in zip(plan.scheduled, rejected):
            if n:
                r.num_computed_tokens -= n
                st = self._state[r]
                keep = cache.ceil_page(r.num_computed_tokens)
                if keep < st.alloc:
                    cache.free_private(st.alloc - keep)
                    st.alloc = keep

    def _hicache(self, limits: EngineLimits, k: dict) -> HiRadixCache:
        """SGLang's HiRadixCache (``--enable-hierarchical-cache``) over the GPU pool."""
        if k["disable_radix_cache"]:
            raise ValueError("sglang enable_hierarchical_cache needs the radix cache; drop disable_radix_cache")
        link = limits.kv_host_link
        if link is None:
            raise ValueError("sglang enable_hierarchical_cache needs the host link of the deployment "
                             "(EngineLimits.kv_host_link)")
        ratio, size = float(k["hicache_ratio"]), float(k["hicache_size"])
        if not ratio > 0 or size < 0:
            raise ValueError(f"sglang hicache_ratio must be > 0 and hicache_size >= 0, got {ratio} and {size}")
        device = limits.num_gpu_blocks * limits.block_size
        host = host_pool_tokens(device - device % self.page, self.page, ratio, size, link.rank_token_bytes)
        self.host_link = link
        return HiRadixCache(device, host, self.page, str(k["hicache_write_policy"]), token_bytes=link.token_bytes)

    @property
    def tier_store(self):
        """The host tier for the summary's ``kv_tiers`` (None without HiCache)."""
        return self.cache if self.host_link is not None else None

    # --- helpers -----------------------------------------------------------------------------
    def _st(self, req: Request) -> _ReqKV:
        st = self._state.get(req)
        if st is None:
            st = self._state[req] = _ReqKV(self.cache.root)
        return st

    def max_new_tokens(self, req: Request) -> int:
        """``sampling_params.max_new_tokens`` as SGLang clips it on arrival (``handle_generate_request``):
        at most ``max_req_len - prompt - 1`` with ``max_req_len = min(context_len - 1, pool - 1)``.
        It drives the estimates only; cbsim's engine ends the request (max_tokens, max_model_len)."""
        max_req_len = min(self.limits.max_model_len - 1, self.cache.capacity - 1)
        return max(min(req.max_tokens, max_req_len - req.prompt_tokens - 1), 0)

    def _remaining_new(self, req: Request) -> int:
        return min(max(self.max_new_tokens(req) - req.num_output_tokens, 0), CLIP_MAX_NEW_TOKENS)

    def slots_held(self, req: Request) -> int:
        st = self._state.get(req)
        return st.alloc if st else 0

    def _release(self, req: Request, insert: bool) -> None:
        """Give back a request's KV: ``cache_finished_req`` (insert) or retraction/abort (no insert)."""
        st = self._state.pop(req, None)
        if st is None:
            return
        cache = self.cache
        if insert and cache.enabled:
            # tokens with KV (the last sampled token has none; accepted drafts past a stop are
            # not the request's tokens: SGLang trims its output at the stop)
            n = min(req.num_computed_tokens, req.num_tokens)
            aligned = cache.floor_page(n)
            if aligned > st.cached:
                cache.insert(request_tokens(req, aligned), aligned, st.cached)
                st.cached = aligned  # alloc is unchanged: cached + private
        cache.free_private(st.alloc - st.cached)
        cache.dec_lock(st.node)

    def _cache_unfinished(self, req: Request, chunked: bool = False) -> None:
        """``cache_unfinished_req``: the computed tokens join the tree and the lock moves to them
        (``chunked``: the chunked request's partial prefix, which HiCache does not count as a hit)."""
        cache = self.cache
        if not cache.enabled:
            return
        st = self._state[req]
        aligned = cache.floor_page(req.num_computed_tokens)
        if aligned <= st.cached:
            return
        seq = request_tokens(req, aligned)
        if self.host_link is not None:
            cache.insert(seq, aligned, st.cached, chunked=chunked)
        else:
            cache.insert(seq, aligned, st.cached)
        matched, node = cache.match_prefix(seq, aligned)
        assert matched == aligned, (matched, aligned)
        cache.dec_lock(st.node)
        cache.inc_lock(node)
        st.node, st.cached = node, aligned  # alloc is unchanged: cached + private

    # --- engine protocol ---------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        lim = self.limits
        if req.prompt_tokens >= lim.max_model_len:
            self._reject(req, f"prompt of {req.prompt_tokens} tokens leaves no room for an output token "
                              f"within max_model_len {lim.max_model_len}")
            return
        if self.cache.ceil_page(req.prompt_tokens) > self.cache.capacity:
            self._reject(req, f"prompt of {req.prompt_tokens} tokens needs more than the whole KV pool "
                              f"({self.cache.capacity} token slots)")
            return
        req.status = Status.WAITING
        (self.inbox if self.recv_interval > 1 else self.waiting).append(req)

    def _receive(self, idle: bool = False) -> None:
        """``recv_requests`` behind ``SchedulerRecvSkipper`` (sglang ``managers/
        scheduler_recv_skipper.py``): each iteration adds the weight of the batch the last one ran
        (``SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_*``: DECODE and TARGET_VERIFY 1, no batch 1, any
        other mode, a prefill or a mixed batch, 1000) and polls the tokenizer's socket only when the
        sum reaches ``--scheduler-recv-interval``, then starts over. So during a run of decodes a
        request sent to the server waits up to that many decode steps before it can be admitted,
        while after a prefill the next iteration polls. ``idle``: the iteration found nothing to
        run; SGLang's loop then spins through idle iterations (weight 1 each, microseconds apart)
        until it polls, so the inbox is taken at once."""
        self._recv_counter += 1 if self._last_kind != "prefill" else 1000
        if self._recv_counter >= self.recv_interval or idle:
            self._recv_counter = 0
            if self.inbox:
                self.waiting.extend(self.inbox)
                self.inbox.clear()

    def _reject(self, req: Request, reason: str) -> None:
        req.status = Status.REJECTED
        req.reject_reason = reason
        self._rejected.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.chunked or self._rejected or self.inbox)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        if self._rejected:
            plan.rejected, self._rejected = self._rejected, []
        self.admission_hits: dict[str, int] = {}
        if self.num_speculative_tokens:
            plan.spec_tokens = []  # filled by a verify batch; a prefill batch verifies no drafts
        if self.recv_interval > 1:
            self._receive()
        for _ in range(2):  # an iteration that ran nothing is idle; SGLang's loop tries again at once
            if not self._prefill(plan):
                self._decode(plan)
            if plan.scheduled:
                break
            self._idle()
            if self.recv_interval > 1:
                self._receive(idle=True)
        if self.recv_interval > 1:
            self._last_kind = self._last[0] if plan.scheduled and self._last is not None else None
        if plan.spec_tokens is not None and len(plan.spec_tokens) != len(plan.scheduled):
            plan.spec_tokens = [0] * len(plan.scheduled)
        if self._rejected:
            plan.rejected.extend(self._rejected)
            self._rejected = []
        if self.host_link is not None:
            self._hicache_traffic(plan)
        return plan

    def _hicache_traffic(self, plan: StepPlan) -> None:
        """This step's HiCache copies on the plan: the loads back (layer by layer beside the
        forward pass, ``cache_controller.py`` ``LayerDoneCounter``) and the write-back copies an
        eviction waited for."""
        link = self.host_link
        if self._loads:
            plan.kv_loads = {rid: (n, link.seconds(n)) for rid, n in self._loads.items()}
            plan.kv_load_layers = link.layers
            self._loads = {}
        written = self.cache.take_write_back()
        if written:
            plan.kv_store_s = link.seconds(written)

    def _idle(self) -> None:
        """``self_check_during_idle``: the ratio starts over; a drained batch is not full."""
        if not self.running and not self.chunked:
            self.new_token_ratio = self.init_ratio
            self.zombies.clear()
            self.batch_is_full = False

    # --- prefill (get_new_batch_prefill) -------------------------------------------------------
    def _prefill(self, plan: StepPlan) -> bool:
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return False
        running_bs = len(self.running) + len(self.zombies)
        if self.max_running - running_bs <= 0 and self.chunked is None:
            self.batch_is_full = True
            return False
        cache = self.cache
        self._order_waiting()
        mixed_tokens = running_bs if self.mixed else 0
        adder = _Adder(self, mixed_tokens)
        can_run: list[tuple[Request, int, int]] = []  # (request, prefix, extend)
        new_chunked: Request | None = None
        if self.chunked is not None:
            req = new_chunked = self.chunked
            cand = req.num_tokens - req.num_computed_tokens
            # cbsim: never more than memory holds (SGLang would raise out of memory)
            room = cache.floor_page(cache.available_and_evictable)
            rem = min(adder.available_chunk_tokens(), room)
            truncated = cand > rem
            n = min(cand, rem)
            if truncated and self.page > 1:
                n = max(cache.floor_page(req.num_computed_tokens + n) - req.num_computed_tokens, 0)
            if n > 0:
                can_run.append((req, req.num_computed_tokens, n))
                adder.reserve(n, 0 if truncated else self._remaining_new(req))
                if not truncated:
                    new_chunked = None
        for req in self.waiting:
            if len(can_run) >= self.max_running - running_bs:
                self.batch_is_full = True
            if self.batch_is_full:
                break
            st = self._st(req)
            res, extend = adder.add_one_req(req, st, lone=not can_run and running_bs == 0)
            if res == "added" or res == "chunked":
                can_run.append((req, st.match, extend))
                if res == "chunked":
                    new_chunked = req
                res = adder.budget_state()
            if res != CONTINUE:
                if res == NO_TOKEN:
                    self.batch_is_full = True
                break
        if not can_run:
            self.chunked = new_chunked
            return False
        # allocate the batch's new KV (alloc_token_slots: evict when short)
        need = sum(cache.ceil_page(p + n) - self._state[r].alloc for r, p, n in can_run)
        if not cache.alloc(need):
            raise AssertionError(f"sglang: {need} token slots admitted but not allocatable "
                                 f"(free {cache.free}, evictable {cache.evictable_size})")
        admitted = {id(r) for r, _, _ in can_run}
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        prefills = []
        for req, prefix, n in can_run:
            st = self._state[req]
            st.alloc = cache.ceil_page(prefix + n)
            if req.status in (Status.WAITING, Status.PREEMPTED):
                if req.status is Status.WAITING:
                    plan.admitted.append(req)
                    if prefix:
                        plan.prefix_hit_tokens[req.id] = prefix
                self.cached_tokens += prefix
                self.admission_hits[req.id] = prefix
                req.status = Status.RUNNING
                req.num_computed_tokens = prefix
            plan.add(req, n, req.num_computed_tokens)
            req.num_computed_tokens += n
            self.prefill_tokens += n
            prefills.append(req)
        self.chunked = new_chunked
        decodes: list[Request] = []
        if self.mixed and (self.running or self.zombies):
            self.zombies.clear()  # running_batch.filter_batch()
            if self.running and self._decode_fits(self.running):
                decodes = self._run_decodes(plan)
        self._last = ("prefill", prefills, decodes)
        return True

    def _order_waiting(self) -> None:
        order_waiting_queue(self.schedule_policy, self.waiting, self, self.rng)

    def init_next_round_input(self, req: Request) -> None:
        """Radix match of a waiting request: its cached prefix, at most ``len - 1`` tokens."""
        st = self._st(req)
        if self.host_link is not None:
            st.match, st.match_node, st.host, st.host_node = self.cache.match_tiers(request_tokens(req),
                                                                                   req.num_tokens - 1)
            return
        st.match, st.match_node = self.cache.match_prefix(request_tokens(req), req.num_tokens - 1)

    # --- decode (update_running_batch) ------------------------------------------------------------
    def _decode_need(self, reqs: list[Request]) -> int:
        p = self.page
        if p == 1:  # every decode takes a new one-token page
            return len(reqs)
        return p * [r.num_computed_tokens % p for r in reqs].count(0)

    def _decode_fits(self, reqs: list[Request]) -> bool:
        """``check_decode_mem``: evict for the next decode's new pages (times the speculative
        buffer multiplier), then see if they fit."""
        need = self._decode_need(reqs) * self.spec_buf
        if self.num_speculative_tokens and self.page > 1:
            # cbsim: at least the verify's own pages (SGLang counts requests at a page boundary
            # only, which k + 1 tokens can cross without being at one)
            need = max(need, sum(g[3] - g[1].alloc for g in self._verify_growth(reqs) if g[3] > g[1].alloc))
        cache = self.cache
        if cache.free < need:
            cache.evict(need)
        return cache.free >= need

    def _decode(self, plan: StepPlan) -> None:
        initial = len(self.running) + len(self.zombies)
        self.zombies.clear()
        if not self.running:
            if initial:
                self.batch_is_full = False
            return
        if not self._decode_fits(self.running):
            self._retract(plan)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        if len(self.running) < initial:
            self.batch_is_full = False
        if self.running:
            self._run_decodes(plan)
            self._last = ("decode", [], list(self.running))

    def _run_decodes(self, plan: StepPlan) -> list[Request]:
        """``prepare_for_decode``: one slot (a new page at a page boundary) for each request."""
        cache, p = self.cache, self.page
        if self.num_speculative_tokens:
            return self._run_verify(plan)
        running = self.running
        need = self._decode_need(running)
        if not cache.alloc(need):
            raise AssertionError("sglang: a checked decode did not fit")
        if self._decoded_last and not plan.scheduled:
            plan.num_decodes = len(running)  # every one of them decoded in the last step
        # plan.add for each request, its three lists extended at once (the batch's hot loop)
        state = self._state
        context = []
        for r in running:
            c = r.num_computed_tokens
            if c % p == 0:
                state[r].alloc += p
            context.append(c)
            r.num_computed_tokens = c + 1
        plan.scheduled.extend(running)
        plan.num_new_tokens.extend([1] * len(running))
        plan.context.extend(context)
        return list(running)

    def _run_verify(self, plan: StepPlan) -> list[Request]:
        """A speculative decode batch: each request verifies its drafts, ``k + 1`` slots each
        (``prepare_for_verify``), fewer only at the context length."""
        cache, spec = self.cache, plan.spec_tokens
        grow = self._verify_growth(self.running)
        need = sum(max(a - st.alloc, 0) for _r, st, _d, a in grow)
        if not cache.alloc(need):
            raise AssertionError("sglang: a checked verify batch did not fit")
        for r, st, d, a in grow:
            if a > st.alloc:
                st.alloc = a
            plan.add(r, 1 + d, r.num_computed_tokens)
            spec.append(d)
            r.num_computed_tokens += 1 + d
        return list(self.running)

    def _verify_growth(self, reqs: list[Request]) -> list[tuple[Request, _ReqKV, int, int]]:
        """(request, its KV, drafts, slots it holds after the verify's allocation) per request."""
        cache, k, max_len = self.cache, self.num_speculative_tokens, self.limits.max_model_len
        out = []
        for r in reqs:
            d = min(k, max_len - 1 - r.num_tokens)
            d = d if d > 0 else 0
            out.append((r, self._state[r], d, cache.ceil_page(r.num_computed_tokens + 1 + d)))
        return out

    def _retract(self, plan: StepPlan) -> None:
        running = self.running
        order = sorted(range(len(running)), key=lambda i: (running[i].num_output_tokens,
                                                           -running[i].prompt_tokens), reverse=True)
        cache = self.cache
        first = True
        while first or not self._decode_fits([running[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            req = running[order.pop()]
            self._release(req, insert=False)
            n = len(order) * self.retract_steps
            if cache.free < n:
                cache.evict(n)
            req.status = Status.PREEMPTED
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            self.num_retractions += 1
            plan.preempted.append(req)
            self.waiting.append(req)
        keep = [running[i] for i in order]
        if len(keep) == 1 and not self._decode_fits(keep):
            req = keep.pop()
            self._release(req, insert=False)
            self._reject(req, f"needs more than the whole KV pool ({cache.capacity} token slots) "
                              f"at {req.num_tokens} tokens")
        self.running = keep
        total_out = sum(r.num_output_tokens for r in keep)
        total_max = sum(self.max_new_tokens(r) for r in keep)
        self.new_token_ratio = min(1.0, (total_out + self.retract_steps * len(keep)) / (total_max + 1))

    # --- after the step ----------------------------------------------------------------------------
    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        done = {id(r) for r in finished}
        last = self._last
        self._last = None
        self._decoded_last = last is not None and last[0] == "decode" and not plan.spec_tokens
        for r in finished:
            self._release(r, insert=True)
            r.status = Status.FINISHED
        if last is None:
            return
        kind, prefills, decodes = last
        if kind == "decode":
            if done:
                self.running = [r for r in self.running if id(r) not in done]
                self.zombies.extend(finished)  # still in running_batch.reqs until the next decode
        else:
            # process_batch_result_prefill: unfinished prompts join the tree; the chunked request
            # is cached at the start of the next iteration (same effect: nothing runs in between)
            for r in prefills:
                if id(r) not in done and r is not self.chunked:
                    self._cache_unfinished(r)
            if self.chunked is not None:
                self._cache_unfinished(self.chunked, chunked=True)
            merged = [r for r in prefills if id(r) not in done and r is not self.chunked]
            if decodes:  # a mixed batch became the running batch: prefills first, then decodes
                self.running = merged + [r for r in decodes if id(r) not in done]
            else:
                self.running = self.running + merged
            if done:
                self.batch_is_full = False
        if not self.running and not self.waiting and self.chunked is None:
            self._idle()

    # --- statistics ------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked is not None else 0)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.inbox)

    @property
    def max_slots(self) -> int:
        return self.max_running

    def kv_blocks_total(self) -> int:
        """Pages of the pool (of ``page_size`` tokens)."""
        return self.cache.capacity // self.page

    def kv_tokens_total(self) -> int:
        return self.cache.capacity

    def kv_blocks_used(self) -> int:
        """Pages held by running requests: locked tree nodes plus their private pages (evictable
        cached pages count as free, as SGLang's ``available + evictable``)."""
        return (self.cache.protected_size + self.cache.private) // self.page

    def kv_tokens_reserved_and_used(self) -> tuple[int, int]:
        running = Status.RUNNING
        held = stored = 0
        for r, st in self._state.items():
            if r.status is running:
                held += st.alloc
                stored += r.num_computed_tokens
        return held, stored

    def drain(self) -> list[Request]:
        out = self.running + ([self.chunked] if self.chunked else []) + self.waiting + self.inbox
        for r in list(self._state):
            if r.status is Status.RUNNING:
                self._release(r, insert=False)
        self._state.clear()
        self.running, self.waiting, self.zombies, self.chunked = [], [], [], None
        self.inbox = []
        return out

    def check_invariants(self) -> None:
        """Pool, tree and per-request holdings agree (tests call this after every step)."""
        cache = self.cache
        cache.check_invariants()
        private = 0
        for r, st in self._state.items():
            if r.status is Status.RUNNING:
                assert st.alloc >= r.num_computed_tokens, f"{r.id}: {st.alloc} slots < {r.num_computed_tokens}"
                assert st.alloc % self.page == 0 and st.cached <= st.alloc, f"{r.id}: {st.cached}/{st.alloc}"
                private += st.alloc - st.cached
            else:
                assert st.alloc == 0, f"{r.id} ({r.status.value}) holds {st.alloc} slots"
        assert private == cache.private, f"requests hold {private} private slots, the pool counts {cache.private}"


class _Adder:
    """``PrefillAdder`` with ``PrefillBudget`` (schedule_policy.py L607, mem_cache/prefill_budget.py)."""

    def __init__(self, pol: SglangPolicy, mixed_tokens: int) -> None:
        self.pol = pol
        self.cache = pol.cache
        self.rem_input = pol.max_prefill_tokens - mixed_tokens
        self.rem_chunk = None if pol.chunk_size is None else pol.chunk_size - mixed_tokens
        ratio = pol.new_token_ratio
        self.total_offset = mixed_tokens + sum(
            min(pol.max_new_tokens(r) - r.num_output_tokens, CLIP_MAX_NEW_TOKENS) * ratio
            for r in pol.running + pol.zombies)
        self.current_offset = mixed_tokens

    @property
    def remaining_total(self) -> float:
        return self.cache.available_and_evictable - self.total_offset

    @property
    def remaining_current(self) -> float:
        return self.cache.available_and_evictable - self.current_offset

    def budget_state(self) -> str:
        if not (self.remaining_total > 0 and self.remaining_current > 0):
            return NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return OTHER
        return CONTINUE

    def available_chunk_tokens(self) -> int:
        """The chunked request's next chunk: what the chunk budget and memory allow, and always
        some progress (its KV is released only when it completes)."""
        limit = self.rem_chunk if self.rem_chunk is not None else 1 << 62
        available = min(limit, int(self.remaining_total))
        return available if available > 0 else max(limit, 1)

    def reserve(self, extend: int, max_new: int) -> None:
        cache = self.cache
        paged = cache.ceil_page(extend)
        immediate = paged + cache.page_size
        self.total_offset += immediate + max_new
        self.current_offset += immediate
        self.rem_input -= paged
        if self.rem_chunk is not None:
            self.rem_chunk -= paged

    def add_one_req(self, req: Request, st: _ReqKV, lone: bool) -> tuple[str, int]:
        pol, cache = self.pol, self.cache
        pol.init_next_round_input(req)
        prefix = st.match
        extend = req.num_tokens - prefix
        max_new = pol._remaining_new(req)
        total = extend + max_new + cache.page_size
        pin = st.match_node
        cache.inc_lock(pin)  # the temporary pin: its own prefix is not evictable
        try:
            if not total < self.remaining_total:
                # cbsim: a request alone in an idle engine is admitted if its prompt fits
                if not (lone and cache.ceil_page(extend) <= cache.available_and_evictable):
                    return NO_TOKEN, 0
            if st.host:  # HiCache: load the host-only nodes back (init_load_back), all or nothing
                loaded = cache.load_back(st.host_node)
                if loaded:
                    pol._loads[req.id] = pol._loads.get(req.id, 0) + loaded
                    st.match, st.match_node = prefix + loaded, st.host_node
                    prefix, extend = st.match, req.num_tokens - st.match
                st.host, st.host_node = 0, cache.root
            if self.rem_chunk is None:
                if self._has_admitted and cache.ceil_page(extend) >= self.rem_input:
                    return OTHER, 0
                chunked = False
            else:
                chunked = cache.ceil_page(extend) > self.rem_chunk
                if chunked:
                    extend = cache.floor_page(self.rem_chunk)
                    extend = cache.floor_page(prefix + extend) - prefix
                    if extend <= 0:
                        return OTHER, 0
                    max_new = 0
        finally:
            cache.dec_lock(pin)
        cache.inc_lock(st.match_node)  # _req_inc_lock_ref: held while the request runs
        st.node, st.cached, st.alloc = st.match_node, prefix, prefix
        self._has_admitted = True
        self.reserve(extend, max_new)
        return ("chunked" if chunked else "added"), extend

    _has_admitted = False
