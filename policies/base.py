"""The contract between an engine (simulated or real) and a scheduling policy.

A policy is the engine's brain without a clock: it owns the queues and its KV memory, and each
call to :meth:`Policy.schedule` returns one :class:`StepPlan` (which requests run this step and
how many tokens each computes). The engine then spends the step's time, emits one token for
every scheduled request whose prompt (plus earlier outputs) is fully computed, decides which
requests are done, and hands them back through :meth:`Policy.finish_step`.

Like vLLM's scheduler, a policy advances ``num_computed_tokens`` *when it schedules* a step, not
when the step completes. A policy never learns how many tokens a request will really generate:
:class:`Request` has ``max_tokens`` (the client's limit) but no ``output_tokens``.

Nothing here imports SimPy, torch or ``sim``: the simulator and calib's real engine drive the
same objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # recompute victim, back in the waiting queue
    SWAPPED = "swapped"  # blocks copied to the CPU pool, waiting to be swapped back in
    FINISHED = "finished"
    REJECTED = "rejected"


class Request:
    """What a scheduler knows about one request.

    Prompt content is described as *runs*: ``prompt_runs`` is a tuple of ``(key, length)``;
    token ``i`` of a run has the identity ``(key, i)``. Two prompts whose runs agree on their
    first ``t`` tokens share those ``t`` tokens, which is all prefix caching needs to know.
    Generated token ``j`` has the identity ``(output_key, j)``: unique per request unless two
    requests are exact duplicates (greedy decoding of identical prompts).

    ``shareable_tokens`` says how far the content may be shared: tokens from that position on are
    this request's own (no other request of the workload holds their keys), so a prefix cache
    need not hash or index them for others; only this request can hit them again, after a
    preemption. None (the default) claims nothing: every token may be shared. The simulator sets
    it from the whole workload (``sim.workload.sharing``); it changes no decision, only the work.
    """

    __slots__ = (
        "id",
        "arrival_s",
        "prompt_tokens",
        "max_tokens",
        "priority",
        "prompt_runs",
        "output_key",
        "num_output_tokens",
        "num_computed_tokens",
        "status",
        "num_preemptions",
        "num_swaps",
        "reject_reason",
        "refused",
        "seq",
        "policy_state",
        "shareable_tokens",
    )

    def __init__(
        self,
        id: str,
        arrival_s: float,
        prompt_tokens: int,
        max_tokens: int,
        priority: int = 0,
        prompt_runs: tuple[tuple[Any, int], ...] | None = None,
        output_key: Any = None,
        seq: int = 0,
        shareable_tokens: int | None = None,
    ) -> None:
        self.id = id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.priority = priority
        self.prompt_runs = prompt_runs if prompt_runs is not None else ((("req", id), prompt_tokens),)
        self.output_key = output_key if output_key is not None else ("out", id)
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.status = Status.WAITING
        self.num_preemptions = 0
        self.num_swaps = 0
        self.reject_reason: str | None = None
        # rejected because of the load at the time (TGI's HTTP 429), not because of the request
        # itself: verdicts count such a request as infinitely late (sim.metrics.summary)
        self.refused = False
        self.seq = seq  # arrival order, for stable tie-breaking
        self.policy_state: Any = None  # free slot for a policy's per-request bookkeeping
        self.shareable_tokens = shareable_tokens  # content from here on is this request's own

    @property
    def num_tokens(self) -> int:
        """Prompt plus the tokens generated so far (what a recompute must prefill again)."""
        return self.prompt_tokens + self.num_output_tokens

    def __repr__(self) -> str:
        return f"Request({self.id}, {self.status.value}, computed={self.num_computed_tokens}/{self.num_tokens})"


@dataclass(slots=True)
class StepPlan:
    """One step's decision. Lists of scheduled requests are in batch order."""

    scheduled: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    context: list[int] = field(default_factory=list)  # tokens already in KV before this step
    admitted: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    rejected: list[Request] = field(default_factory=list)
    swapped_out: list[Request] = field(default_factory=list)
    swapped_in: list[Request] = field(default_factory=list)
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    # static batching pays for padding: dummy tokens the batch still computes (prompts padded
    # to the longest, finished members' slots) and the context those dummies attend to
    padding_tokens: int = 0
    padding_context: int = 0
    prefix_hit_tokens: dict[str, int] = field(default_factory=dict)
    # speculative decoding (None when the policy does not speculate): per scheduled request, how
    # many of its ``num_new_tokens`` are draft tokens to verify (0 for prefill chunks). Their KV
    # slots are allocated and ``num_computed_tokens`` counts them until the engine reports the
    # rejected ones through ``Policy.reject_drafts``
    spec_tokens: list[int] | None = None
    # KV loaded from tiers below the GPU (policies.kv.tiers), per admitted request: (tokens,
    # seconds of copying); ``kv_load_async``: the copies overlap the step (vLLM's native
    # offloading) instead of adding to it (LMCache's synchronous load)
    kv_loads: dict[str, tuple[int, float]] | None = None
    kv_load_async: bool = False
    # SGLang's HiCache (policies.kv.hiradix): the loads run layer by layer beside the forward pass
    # of this many layers (0: not layer-wise); ``kv_store_s``: seconds of GPU-to-host copies the
    # step waits for (HiCache's write_back eviction)
    kv_load_layers: int = 0
    kv_store_s: float = 0.0
    # the first ``num_decodes`` scheduled requests are one-token decodes of requests that emitted
    # a token in the previous step (vllm-v1's bulk decode pass): each emits one token at the end
    # of this step, continuing its run, so the engine need not check them one condition at a time
    num_decodes: int = 0

    def add(self, req: Request, n: int, context: int) -> None:
        self.scheduled.append(req)
        self.num_new_tokens.append(n)
        self.context.append(context)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens) + self.padding_tokens

    @property
    def is_empty(self) -> bool:
        return (not self.scheduled and not self.swap_out_blocks and not self.swap_in_blocks and not self.kv_loads
                and not self.kv_store_s)


@dataclass(frozen=True, slots=True)
class Device:
    """The accelerator as an engine sees it when it picks its own defaults (vLLM reads the device
    name and total memory at start-up: ``EngineArgs.get_batch_defaults``)."""

    name: str = ""  # as the driver names it, e.g. "NVIDIA A100-SXM4-80GB"
    memory_bytes: int = 0  # total device memory
    kind: str = "gpu"  # gpu | cpu
    world_size: int = 1  # GPUs of one replica (tensor x pipeline parallel)


# what every policy gets when the scenario leaves engine.max_num_seqs / max_num_batched_tokens
# unset and the policy's engine has no hardware-dependent defaults of its own
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Engine-wide settings every policy reads (scenario key ``engine`` plus the KV pool size).

    ``max_num_seqs`` / ``max_num_batched_tokens`` may be None: "the engine's own default". Then
    :meth:`Policy.resolve_limits` (called by ``policies.registry.make_policy``) fills them in for
    the policy being built, from ``device`` (vllm-v1 picks them as vLLM does for that GPU)."""

    block_size: int = 16
    num_gpu_blocks: int = 1000  # usable blocks (the null block is not counted)
    num_cpu_blocks: int = 0  # swap pool
    max_num_seqs: int | None = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int = 8192
    device: Device | None = None
    kv_offload: object | None = None  # policies.kv.tiers.OffloadConfig: KV tiers below the GPU
    kv_host_link: object | None = None  # policies.kv.hiradix.HostLink: GPU <-> host copies (SGLang's HiCache)


@dataclass(frozen=True, slots=True)
class Knob:
    """One documented policy setting, with the engine's own default."""

    default: Any
    help: str
    type: type = int


class Policy:
    """Base class of all scheduling policies.

    Subclasses set ``name``, ``summary`` and ``KNOBS`` and implement ``add_request``,
    ``schedule``, ``finish_step`` and the KV statistics.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    KNOBS: ClassVar[dict[str, Knob]] = {}
    uses_token_budget: ClassVar[bool] = True
    # whose arithmetic sizes the KV pool when the scenario does not pin it: "vllm"
    # (sim/hardware/kv_capacity.py), "trtllm" (sim/hardware/trtllm_kv.py), "sglang"
    # (mem_fraction_static) or "tgi" (its warm-up): sim/hardware/engine_memory.py
    kv_sizing: ClassVar[str] = "vllm"
    # where max_num_seqs / max_num_batched_tokens come from when the scenario leaves them unset
    engine_defaults_source: ClassVar[str] = (
        f"fixed: {DEFAULT_MAX_NUM_SEQS} / {DEFAULT_MAX_NUM_BATCHED_TOKENS} on every device"
    )

    def __init__(self, limits: EngineLimits, **knobs: Any) -> None:
        unknown = set(knobs) - set(self.KNOBS)
        if unknown:
            raise ValueError(
                f"policy {self.name!r} has no setting(s) {sorted(unknown)}; "
                f"its settings are {sorted(self.KNOBS)}"
            )
        if limits.max_num_seqs is None or limits.max_num_batched_tokens is None:
            raise ValueError(
                f"policy {self.name!r}: max_num_seqs / max_num_batched_tokens are unset; build the "
                "policy with policies.registry.make_policy, which fills in the engine's own defaults"
            )
        self.limits = limits
        self.knobs = {k: knobs.get(k, knob.default) for k, knob in self.KNOBS.items()}

    @classmethod
    def engine_defaults(cls, limits: EngineLimits, knobs: dict[str, Any]) -> tuple[int, int]:
        """``(max_num_seqs, max_num_batched_tokens)`` for these limits, where a None means "this
        engine's own default": here a fixed 256 / 8192 for every device. Policies whose engine
        picks its defaults by hardware (``vllm-v1``) override this."""
        seqs = limits.max_num_seqs if limits.max_num_seqs is not None else DEFAULT_MAX_NUM_SEQS
        tokens = (limits.max_num_batched_tokens if limits.max_num_batched_tokens is not None
                  else DEFAULT_MAX_NUM_BATCHED_TOKENS)
        return seqs, tokens

    @classmethod
    def resolve_limits(cls, limits: EngineLimits, knobs: dict[str, Any] | None = None) -> EngineLimits:
        """``limits`` with unset (None) engine limits replaced by :meth:`engine_defaults`."""
        if limits.max_num_seqs is not None and limits.max_num_batched_tokens is not None:
            return limits
        merged = {k: knob.default for k, knob in cls.KNOBS.items()}
        merged.update(knobs or {})
        seqs, tokens = cls.engine_defaults(limits, merged)
        return replace(limits, max_num_seqs=seqs, max_num_batched_tokens=tokens)

    # --- driven by the engine -------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        raise NotImplementedError

    def schedule(self) -> StepPlan:
        raise NotImplementedError

    def finish_step(self, plan: StepPlan, finished: list[Request]) -> None:
        """Release what ``finished`` (in batch order) held; called after tokens are emitted."""
        raise NotImplementedError

    # --- what the engine and metrics read -------------------------------------------------
    @property
    def num_running(self) -> int:
        raise NotImplementedError

    @property
    def num_waiting(self) -> int:
        raise NotImplementedError

    @property
    def max_slots(self) -> int:
        """The denominator of slot utilization (the most requests it runs at once)."""
        return self.limits.max_num_seqs

    def kv_tokens_total(self) -> int:
        """The KV pool in tokens (the same unit for every policy, whatever its block or page)."""
        return self.kv_blocks_total() * self.limits.block_size

    @property
    def token_budget(self) -> int | None:
        """Tokens one step may compute (the denominator of token-budget utilization); None for
        policies without a budget."""
        return self.limits.max_num_batched_tokens if self.uses_token_budget else None

    def has_work(self) -> bool:
        return self.num_running > 0 or self.num_waiting > 0

    # --- attention data parallelism (optional) -----------------------------------------------
    # Ranks of one MoE model step together (sim.lockstep.LockstepGroup). A policy whose engine
    # decides per iteration, over all ranks, whether the ranks' context requests run returns that
    # rule here (an object with ``release(counts) -> bool``); the group then asks each rank with
    # work to ``propose()`` its (contexts, generations) and, when the rule says no, to
    # ``hold_contexts()`` before it schedules.
    def adp_balance(self):
        """The group's context-balance rule, None when the engine has none (every policy but
        TensorRT-LLM's with ``attention_dp_enable_balance``)."""
        return None

    def join_lockstep(self, peers: list[Policy]) -> None:
        """Told once by the group: every rank's policy, this one included. An engine whose ranks
        share a decision (TensorRT-LLM fetches new requests for all ranks at once) reads them."""

    def idle_iteration(self) -> None:
        """The group ran an iteration in which this rank scheduled nothing (its dummy forward)."""

    # --- speculative decoding (optional) ----------------------------------------------------
    # A policy that can schedule draft tokens sets ``supports_speculation``. The engine turns it
    # on once (``enable_speculation``); from then on a plan's ``spec_tokens`` says how many draft
    # tokens each scheduled request verifies, and after the step the engine (which alone knows
    # how many were accepted) hands the rejected counts back through ``reject_drafts`` before it
    # emits the accepted tokens plus one.
    supports_speculation: ClassVar[bool] = False
    # the drafters the engine ships (the scenario's ``speculative.method`` values it accepts)
    speculative_methods: ClassVar[tuple[str, ...]] = ("ngram", "eagle", "eagle3", "mtp", "draft")
    num_speculative_tokens: int = 0

    def enable_speculation(self, num_speculative_tokens: int, num_lookahead_tokens: int = 0) -> None:
        raise ValueError(f"policy {self.name!r} does not model speculative decoding")

    def reject_drafts(self, plan: StepPlan, rejected: list[int]) -> None:
        """``rejected[i]`` of the draft tokens of ``plan.scheduled[i]`` were rejected by the
        verification: their positions are no longer computed (vLLM V1 ``update_from_output``)."""
        raise NotImplementedError

    def kv_blocks_used(self) -> int:
        raise NotImplementedError

    def kv_blocks_total(self) -> int:
        return self.limits.num_gpu_blocks

    def kv_tokens_reserved_and_used(self) -> tuple[int, int]:
        """(token slots reserved in KV memory, tokens actually stored) for the waste metric."""
        raise NotImplementedError

    def cpu_blocks_used(self) -> int:
        return 0

    def drain(self) -> list[Request]:
        """Every request still held (running, waiting, swapped), for end-of-run accounting."""
        raise NotImplementedError

    # --- fast-forward through pure-decode stretches (optional) ----------------------------
    # Between arrivals and finishes a busy engine mostly repeats one step: every running request
    # computes one token and emits it. A policy that can prove this of its next steps lets the
    # engine apply many of them at once; the result must be exactly what that many rounds of
    # ``schedule()``, ``emit_tokens()`` and ``finish_step(plan, [])`` would have produced.
    # Policies that do not implement these step normally.

    # True: ``add_request`` reads nothing that pure-decode steps or their finishes change (it only
    # queues the request or marks it for rejection at the next schedule), so the engine may
    # deliver an arrival that falls inside a stretch's last step after applying the whole stretch,
    # finishes included (sim.engine: a stretch's steps are still all scheduled before it)
    stretch_past_arrivals = False
    # True: a request ``add_request`` receives while a step is in flight first runs in the step
    # after next, and the step after the one it arrives in is the same pure decode as without it
    # (vllm-v1's async_admission). After a stretch whose last step contains an arrival the engine
    # may then apply that next step in the same timeout, with ``arrivals_behind`` set to 1 until
    # it ends: the arrivals come that many steps before the last one applied
    admits_a_step_late = False
    arrivals_behind = 0
    # False: ``finish_step`` reads nothing of its plan, so after a stretch the engine passes an
    # empty one instead of building the last step's (the batch, its tokens and contexts)
    finish_step_reads_plan = True

    def decode_stretch(self) -> tuple[list[Request], int] | None:
        """``(batch, context)`` if the next step is certain to be a *pure decode* and so is every
        following one for as long as no request arrives or finishes and KV memory lasts: every
        running request (``batch``, in batch order) is scheduled for exactly one token with a
        non-empty context and emits it; nothing is admitted, preempted, rejected or swapped, and
        the waiting queue is left as it is. ``context`` is the sum of ``num_computed_tokens``
        over the batch. None otherwise (the default). ``batch`` may be the policy's own list:
        the engine does not mutate it (and reads it before any finish_step)."""
        return None

    def decode_stretch_limit(self, batch: list[Request], k: int) -> int:
        """How many of the next ``k`` pure-decode steps fit KV memory (no step would preempt)."""
        return 0

    def advance_decodes(self, batch: list[Request], k: int) -> tuple[list[int], list[int], list[int]]:
        """Apply ``k <= decode_stretch_limit(batch, k)`` pure-decode steps to the policy's state,
        token emission included (``num_computed_tokens`` and ``num_output_tokens`` of every
        request in ``batch`` grow by ``k``), in exactly the order ``k`` single steps would (block
        allocations and prefix-cache registrations alike). The engine guarantees that no request
        of ``batch`` finishes before the last of these steps and that nothing arrives before it
        ends; requests that finish in the last step are then ended by the usual
        ``finish_step(plan_of_the_last_step, finished)``. Returns, per step, what a single step's
        record would read after it (before that last finish_step): ``kv_blocks_used()`` and the
        two figures of ``kv_tokens_reserved_and_used()``."""
        raise NotImplementedError


def emit_tokens(plan: StepPlan) -> list[Request]:
    """Apply a finished step: each scheduled request whose prompt (plus earlier outputs, after a
    recompute) is fully computed samples one token. Returns those requests in batch order.

    A request still mid-prefill gets no token (vLLM discards its sampled token).
    """
    emitted = []
    for req in plan.scheduled:
        out = req.num_output_tokens
        if req.num_computed_tokens >= req.prompt_tokens + out:  # prompt and outputs all computed
            req.num_output_tokens = out + 1
            emitted.append(req)
    return emitted
