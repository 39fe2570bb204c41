"""Replay a golden step log recorded from vLLM's own scheduler and compare every decision.

A golden log (``reference/oracle/*.json``, format in its README) holds a scheduler config, the
requests with their arrival steps, and what vLLM 0.32's V1 ``Scheduler`` did at every step. This
module drives :class:`policies.vllm_v1.VllmV1Policy` through the same steps, with no clock and no
SimPy: add the requests that have arrived, ``schedule()``, emit one token per request whose
prompt is fully computed, finish the requests that reached ``max_tokens`` (the logs were recorded
with ``ignore_eos``) or ``max_model_len``, ``finish_step()``. When nothing is running or waiting
the step number jumps to the next arrival, as in the logs.

Each step is compared on: the scheduled tokens per request in batch order, the preempted,
finished and admitted requests, the prefix-cache hits of admitted requests, the free blocks (free
queue length, evictable cached blocks included), and the running and waiting counts. The first
step that differs ends the replay: everything after it would differ for that reason.

Prompt content for prefix caching follows the log's semantics: requests with the same
``prefix_group`` share their first ``prefix_len`` prompt tokens, all other prompt tokens are
unique, a ``duplicate_of`` request has the same prompt as the request it names (followed to the
original), and every generated token has the same id (so exact duplicates share output blocks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.base import EngineLimits, Request, emit_tokens
from policies.vllm_v1 import VllmV1Policy
from sim.errors import CbsimError, nearest
from sim.user_files import Fields, read_json, short

# golden config key -> where it goes (EngineLimits field or policy knob)
_LIMIT_KEYS = {
    "block_size": "block_size",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_num_seqs": "max_num_seqs",
    "max_model_len": "max_model_len",
}
_KNOB_ALIASES = {"policy": "scheduling_policy"}
_OUTPUT_KEY = "generated"  # every generated token has the same id in the logs


@dataclass(frozen=True)
class StepRecord:
    """One step's decisions, in the golden log's terms."""

    step: int
    scheduled: tuple[tuple[str, int], ...]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    admitted: tuple[str, ...]
    prefix_hit_tokens: tuple[tuple[str, int], ...]
    free_blocks: int
    num_running: int
    num_waiting: int

    FIELDS = (
        "step",
        "scheduled",
        "preempted",
        "finished",
        "admitted",
        "prefix_hit_tokens",
        "free_blocks",
        "num_running",
        "num_waiting",
    )

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepRecord:
        return cls(
            step=int(d["step"]),
            scheduled=tuple((str(k), int(v)) for k, v in d["scheduled"].items()),
            preempted=tuple(sorted(d.get("preempted", []))),
            finished=tuple(sorted(d.get("finished", []))),
            admitted=tuple(sorted(d.get("admitted", []))),
            prefix_hit_tokens=tuple(
                sorted((str(k), int(v)) for k, v in d.get("prefix_hit_tokens", {}).items())
            ),
            free_blocks=int(d["free_blocks"]),
            num_running=int(d["num_running"]),
            num_waiting=int(d["num_waiting"]),
        )

    def differences(self, other: StepRecord) -> list[str]:
        return [f for f in self.FIELDS if getattr(self, f) != getattr(other, f)]

    def describe(self, fields: list[str] | None = None) -> str:
        parts = []
        for f in fields or self.FIELDS:
            v = getattr(self, f)
            if f in ("scheduled", "prefix_hit_tokens"):
                v = "{" + ", ".join(f"{k}: {n}" for k, n in v) + "}"
            elif isinstance(v, tuple):
                v = "[" + ", ".join(v) + "]"
            parts.append(f"{f}={v}")
        return " ".join(parts)


@dataclass(frozen=True)
class Divergence:
    """The first step where the policy and vLLM disagree (``ours`` is None if we ran out of steps)."""

    index: int  # position in the log's step list
    expected: StepRecord | None
    ours: StepRecord | None

    @property
    def step(self) -> int:
        return (self.expected or self.ours).step

    @property
    def fields(self) -> list[str]:
        if self.expected is None or self.ours is None:
            return list(StepRecord.FIELDS)
        return self.expected.differences(self.ours)

    def describe(self) -> str:
        if self.ours is None:
            return f"step {self.step}: vLLM still had this step, we had finished every request"
        if self.expected is None:
            return f"step {self.step}: vLLM had finished every request, we still ran a step"
        fields = self.fields
        return (
            f"step {self.step}: differs in {', '.join(fields)}\n"
            f"  vLLM: {self.expected.describe(fields)}\n"
            f"  ours: {self.ours.describe(fields)}"
        )


@dataclass
class ConformanceResult:
    name: str
    path: Path
    matched: int  # steps that agree, from the first one up to the first divergence
    total: int  # steps in the golden log
    divergence: Divergence | None = None
    ours: list[StepRecord] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.divergence is None and self.matched == self.total

    def summary(self) -> str:
        return f"{self.name}: matched {self.matched}/{self.total} steps"


@dataclass(frozen=True)
class GoldenLog:
    name: str
    path: Path
    limits: EngineLimits
    knobs: dict[str, Any]
    requests: list[dict[str, Any]]
    steps: list[StepRecord]


def load_golden(path: str | Path) -> GoldenLog:
    """Read and check a golden step log; errors name the file, the field and the fix.

    Every field the replay reads is checked here (kind and range), so a malformed log is one
    :class:`CbsimError` before anything runs, never a crash inside the replay."""
    from sim.hardware.kv_capacity import MAX_KV_BLOCKS

    path = Path(path)
    if not path.is_file() and not path.is_dir():
        raise CbsimError(
            f"{path}: no such file (pass golden step logs such as reference/oracle/v1_ample.json)"
        )
    data = read_json(path, "golden step log", "a golden log is one JSON object with config, requests and steps "
                                              "(format: reference/oracle/README.md)")
    f = Fields(path)
    if not isinstance(data, dict):
        raise f.fail("", f"expected a JSON object with config, requests and steps, got {short(data)}")
    for key in ("config", "requests", "steps"):
        if key not in data:
            raise CbsimError(
                f"{path}: missing top-level field {key!r}; a golden log has config, requests and steps"
            )
    cfg = dict(f.items(data["config"], "config"))
    if "num_blocks" not in cfg:
        raise CbsimError(f"{path}: config has no 'num_blocks' (the KV pool size including the null block)")
    num_blocks = f.check(cfg.pop("num_blocks"), "config.num_blocks", int, minimum=2)
    if num_blocks > MAX_KV_BLOCKS + 1:
        raise f.fail("config.num_blocks", f"must be <= {MAX_KV_BLOCKS + 1:,} (the blocks cbsim simulates), "
                                          f"got {num_blocks:,}")
    limit_kw = {"num_gpu_blocks": num_blocks - 1}
    knob_kw: dict[str, Any] = {}
    for key, value in cfg.items():
        if key in _LIMIT_KEYS:
            limit_kw[_LIMIT_KEYS[key]] = f.check(value, f"config.{key}", int, minimum=1)
            continue
        knob = _KNOB_ALIASES.get(key, key)
        if knob not in VllmV1Policy.KNOBS:
            known = sorted([*_LIMIT_KEYS, *_KNOB_ALIASES, *VllmV1Policy.KNOBS, "num_blocks"])
            raise CbsimError(
                f"{path}: config key {key!r} is not a vllm-v1 setting{nearest(key, known)}; known keys: {known}"
            )
        knob_kw[knob] = value
    try:
        limits = EngineLimits(**limit_kw)
        VllmV1Policy(limits, **knob_kw)  # validate the knobs now, with the file's name
    except (TypeError, ValueError) as exc:
        raise CbsimError(f"{path}: bad config: {exc}") from exc
    requests = f.entries(data["requests"], "requests", dict)
    ids: set[Any] = set()
    for i, r in enumerate(requests):
        where = f"requests[{i}]"
        for key in ("id", "arrival_step", "prompt_tokens", "max_tokens"):
            if key not in r:
                raise CbsimError(f"{path}: requests[{i}] has no {key!r}")
        rid = f.get(r, "id", where, (str, int))
        if rid in ids:
            raise f.fail(f"{where}.id", f"{rid!r} is the id of an earlier request; ids must be distinct")
        ids.add(rid)
        f.get(r, "arrival_step", where, int, minimum=0)
        f.get(r, "prompt_tokens", where, int, minimum=1)
        f.get(r, "max_tokens", where, int, minimum=1)
        f.get(r, "priority", where, int, 0)
        prompt = f.get(r, "prompt_tokens", where, int)
        if f.get(r, "prefix_len", where, int, 0, minimum=0) > prompt:
            raise f.fail(f"{where}.prefix_len", f"is {r['prefix_len']}, longer than the prompt ({prompt} tokens)")
        f.get(r, "prefix_group", where, (str, int), None)
        f.get(r, "duplicate_of", where, (str, int), None)
    steps = [_step_record(f, s, f"steps[{i}]") for i, s in enumerate(f.entries(data["steps"], "steps", dict))]
    name = f.get(data, "name", "", str, path.stem)
    return GoldenLog(name, path, limits, knob_kw, requests, steps)


def _step_record(f, d: dict[str, Any], where: str) -> StepRecord:
    """One step of the log, every field checked (``f``: :class:`sim.user_files.Fields`)."""
    def ids(key: str) -> tuple:
        return tuple(sorted(str(x) for x in f.entries(f.get(d, key, where, list, []), f"{where}.{key}", (str, int))))

    def counts(key: str, default: Any = ...) -> tuple:
        got = f.get(d, key, where, dict, default)
        return tuple((str(k), f.check(v, f"{where}.{key}.{k}", int, minimum=0)) for k, v in got.items())

    return StepRecord(
        step=f.get(d, "step", where, int, minimum=0),
        scheduled=counts("scheduled"),
        preempted=ids("preempted"),
        finished=ids("finished"),
        admitted=ids("admitted"),
        prefix_hit_tokens=tuple(sorted(counts("prefix_hit_tokens", {}))),
        free_blocks=f.get(d, "free_blocks", where, int),
        num_running=f.get(d, "num_running", where, int),
        num_waiting=f.get(d, "num_waiting", where, int),
    )


def _prompt_runs(spec: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> tuple[tuple[Any, int], ...]:
    seen = {spec["id"]}
    while spec.get("duplicate_of") is not None:  # a duplicate of a duplicate has the original's ids
        spec = by_id[spec["duplicate_of"]]
        if spec["id"] in seen:
            raise CbsimError(f"request {spec['id']}: duplicate_of forms a cycle")
        seen.add(spec["id"])
    n = int(spec["prompt_tokens"])
    shared = int(spec.get("prefix_len") or 0) if spec.get("prefix_group") is not None else 0
    runs = []
    if shared:
        runs.append((("group", spec["prefix_group"]), shared))
    if n - shared:
        runs.append((("prompt", spec["id"]), n - shared))
    return tuple(runs)


def build_requests(log: GoldenLog) -> list[Request]:
    """The log's requests as policy requests, in log order (``seq`` = position, as vLLM's id order)."""
    by_id = {r["id"]: r for r in log.requests}
    out = []
    for seq, spec in enumerate(log.requests):
        if spec.get("duplicate_of") is not None and spec["duplicate_of"] not in by_id:
            raise CbsimError(
                f"{log.path}: request {spec['id']} is a duplicate_of unknown {spec['duplicate_of']!r}"
            )
        out.append(
            Request(
                id=str(spec["id"]),
                arrival_s=float(spec["arrival_step"]),
                prompt_tokens=int(spec["prompt_tokens"]),
                max_tokens=int(spec["max_tokens"]),
                priority=int(spec.get("priority", 0) or 0),
                prompt_runs=_prompt_runs(spec, by_id),
                output_key=_OUTPUT_KEY,
                seq=seq,
            )
        )
    return out


def replay(log: GoldenLog, max_steps: int | None = None) -> list[StepRecord]:
    """Drive a fresh vllm-v1 policy through the log's workload; one record per non-idle step."""
    policy = VllmV1Policy(log.limits, **log.knobs)
    reqs = build_requests(log)
    arrivals = sorted(range(len(reqs)), key=lambda i: (log.requests[i]["arrival_step"], i))
    max_model_len = log.limits.max_model_len
    limit = max_steps if max_steps is not None else 10 * (len(log.steps) + 1) + 1000
    records: list[StepRecord] = []
    nxt = 0
    step = 0
    while len(records) < limit:
        while nxt < len(arrivals) and log.requests[arrivals[nxt]]["arrival_step"] <= step:
            policy.add_request(reqs[arrivals[nxt]])
            nxt += 1
        if not policy.has_work():
            if nxt >= len(arrivals):
                break
            step = int(log.requests[arrivals[nxt]]["arrival_step"])  # idle gap: jump
            continue
        plan = policy.schedule()
        emitted = emit_tokens(plan)
        finished = [
            r for r in emitted if r.num_output_tokens >= r.max_tokens or r.num_tokens >= max_model_len
        ]
        policy.finish_step(plan, finished)
        records.append(
            StepRecord(
                step=step,
                scheduled=tuple((r.id, n) for r, n in zip(plan.scheduled, plan.num_new_tokens)),
                preempted=tuple(sorted(r.id for r in plan.preempted)),
                finished=tuple(sorted(r.id for r in finished)),
                admitted=tuple(sorted(r.id for r in plan.admitted)),
                prefix_hit_tokens=tuple(sorted(plan.prefix_hit_tokens.items())),
                free_blocks=policy.num_free_blocks,
                num_running=policy.num_running,
                num_waiting=policy.num_waiting,
            )
        )
        step += 1
    return records


def check_log(path: str | Path) -> ConformanceResult:
    """Replay one golden log and compare it step by step with what vLLM did."""
    log = load_golden(path)
    ours = replay(log, max_steps=len(log.steps) + 1)
    matched = 0
    divergence = None
    for i in range(max(len(log.steps), len(ours))):
        exp = log.steps[i] if i < len(log.steps) else None
        got = ours[i] if i < len(ours) else None
        if exp is None or got is None or exp != got:
            divergence = Divergence(i, exp, got)
            break
        matched += 1
    return ConformanceResult(log.name, log.path, matched, len(log.steps), divergence, ours)
