"""Engine step logs: what a real serving engine did at every step and when, in neutral records.

Calibration from a step log (``cbsim calibrate --from-steplog``) and validation against a
recorded run (``cbsim validate --against``) need the same two things from a real engine's log:

- the steps: when each began and ended, and per request how many tokens it computed on top of
  how much context (plus who was preempted);
- the run: the engine config, and per request its arrival, prompt, ``max_tokens`` and the times
  its output tokens became available.

This module turns a log file into those records (:class:`StepLog`) so the fit and the validation
never see a file format. Each format is one small reader function registered in
:data:`READERS` with a test that recognises it; another engine's logs need only another reader.

Format ``vllm-json`` (``../shared/reference/vllm-cpu-runs/``; produced by a driver around vLLM's
``LLMEngine``, see docs/calibration.md, "Calibrate cbsim to your own vLLM"): one JSON object with

- ``model``: ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``vocab_size`` (and optionally
  ``dtype``, ``tie_word_embeddings``);
- ``config``: ``block_size``, ``num_blocks`` (vLLM's pool: usable = num_blocks − 1, block 0 is
  the null block), ``max_num_batched_tokens``, ``max_num_seqs``, ``max_model_len``, ``policy``
  (fcfs | priority), ``enable_prefix_caching`` (and optionally ``enable_chunked_prefill``,
  default true as in vLLM V1, and ``tensor_parallel_size``, default 1);
- ``requests[]``: ``id``, ``arrival_s``, ``prompt_tokens``, ``max_tokens``, ``token_times_s``
  (each output token's time: the end of the step that produced it), ``preemptions``;
- ``steps[]``: ``start_s``, ``end_s``, ``scheduled`` {id: tokens computed}, ``context`` {id: tokens
  in KV before the step}, ``preempted`` [ids];
- optional ``source`` (a sentence naming the engine, device, dtype), ``summary``, ``workload``.

Times are seconds from the run's start. The dtype comes from ``model.dtype``, else from the
``source`` sentence (fp32/bf16/fp16 or float32/bfloat16/float16), else it is an error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import CbsimError
from sim.user_files import Fields, read_json


@dataclass(frozen=True, slots=True)
class LoggedStep:
    """One engine step: its wall-clock span and, per request in batch order, (id, new tokens,
    context before the step)."""

    start_s: float
    end_s: float
    batch: tuple[tuple[str, int, int], ...]
    preempted: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n, _ in self.batch)

    @property
    def decode_contexts(self) -> list[int]:
        """Context of each decode (one new token on a non-empty context)."""
        return [c for _, n, c in self.batch if n == 1 and c > 0]

    @property
    def prefill_chunks(self) -> list[tuple[int, int]]:
        """(new tokens, context) of each entry that is not a decode."""
        return [(n, c) for _, n, c in self.batch if not (n == 1 and c > 0) and n > 0]


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    id: str
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    token_times_s: tuple[float, ...]
    preemptions: int | None = None

    @property
    def finished(self) -> bool:
        return len(self.token_times_s) >= self.max_tokens


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The recorded engine's settings, in cbsim's terms (``num_gpu_blocks``: usable blocks)."""

    block_size: int
    num_gpu_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    scheduling_policy: str = "fcfs"
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True
    tensor_parallel: int = 1


@dataclass
class StepLog:
    path: Path
    format: str
    engine: str  # a sentence naming the engine (the log's source)
    device: str  # "cpu", "cuda", or what the log says
    model: dict[str, Any]  # a ModelSpec as a dict (sim.hardware.models.get_model accepts it)
    config: EngineConfig
    requests: list[LoggedRequest]
    steps: list[LoggedStep]
    summary: dict[str, Any] | None = None

    def busy_gaps(self) -> list[float | None]:
        """Per step, the time from its end to the next step's start when the engine still had work
        (a request arrived and not yet finished at the step's end), else None (idle, or last)."""
        arrivals = sorted(r.arrival_s for r in self.requests)
        finishes = sorted(r.token_times_s[-1] if r.finished and r.token_times_s else math.inf
                          for r in self.requests)
        from bisect import bisect_right

        gaps: list[float | None] = []
        for i, step in enumerate(self.steps):
            if i + 1 == len(self.steps):
                gaps.append(None)
                continue
            t = step.end_s
            in_system = bisect_right(arrivals, t) - bisect_right(finishes, t)
            gaps.append(self.steps[i + 1].start_s - t if in_system > 0 else None)
        return gaps


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------
def read_steplog(path: str | Path) -> StepLog:
    """Read a step log in any known format (see :data:`READERS`)."""
    p = Path(path)
    data = read_json(p, "step log", "give a recorded run (one JSON object, e.g. "
                                    "../shared/reference/vllm-cpu-runs/fit.json; format: sim/recorded/steplog.py)")
    for recognises, reader in READERS.values():
        if recognises(data):
            return reader(data, p)
    raise CbsimError(f"{p}: not a step log cbsim can read; known formats: {', '.join(READERS)} "
                     f"(a JSON object with model, config, requests and steps: see sim/recorded/steplog.py)")


def _is_vllm_json(data: Any) -> bool:
    return isinstance(data, dict) and {"config", "requests", "steps"} <= set(data)


class _Fields(Fields):
    """Typed access to the log's fields (:class:`sim.user_files.Fields`): errors name the file and key."""


_DTYPE_WORDS = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
                "fp16": "fp16", "float16": "fp16", "half": "fp16"}


def _vllm_model(f: _Fields, data: dict, source: str) -> dict[str, Any]:
    m = f.get(data, "model", "", dict)
    dtype = m.get("dtype")
    if dtype is None:
        found = re.findall(r"\b(fp32|float32|bf16|bfloat16|fp16|float16)\b", source.lower())
        if len(set(_DTYPE_WORDS[w] for w in found)) != 1:
            raise f.fail("model.dtype", "missing, and the source sentence does not name one dtype; add "
                                        "model.dtype (fp32, bf16 or fp16)")
        dtype = found[0]
    if str(dtype).lower().removeprefix("torch.") not in _DTYPE_WORDS:
        raise f.fail("model.dtype", f"unknown dtype {dtype!r}; use fp32, bf16 or fp16")
    spec = {
        "num_layers": f.get(m, "num_hidden_layers", "model", int),
        "hidden_size": f.get(m, "hidden_size", "model", int),
        "num_heads": f.get(m, "num_attention_heads", "model", int),
        "num_kv_heads": f.get(m, "num_key_value_heads", "model", int, None),
        "head_dim": f.get(m, "head_dim", "model", int, None),
        "intermediate_size": f.get(m, "intermediate_size", "model", int),
        "vocab_size": f.get(m, "vocab_size", "model", int),
        "dtype": _DTYPE_WORDS[str(dtype).lower().removeprefix("torch.")],
        "tied_embeddings": bool(m.get("tie_word_embeddings", False)),
    }
    return model_spec_dict(spec)


def model_spec_dict(spec: dict[str, Any]) -> dict[str, Any]:
    """A full ModelSpec dict, named after the registry model with the same dimensions if any."""
    from sim.hardware.models import MODELS, get_model

    model = get_model({"name": "steplog-model", **spec})
    for known in MODELS.values():
        same = all(getattr(known, k) == getattr(model, k) for k in model.to_dict() if k != "name")
        if same:
            return known.to_dict()
    return model.to_dict()


def read_vllm_json(data: dict, path: Path) -> StepLog:
    f = _Fields(path)
    source = f.get(data, "source", "", str, "")
    model = _vllm_model(f, data, source)
    c = f.get(data, "config", "", dict)
    num_blocks = f.get(c, "num_blocks", "config", int, minimum=2)
    policy = f.get(c, "policy", "config", str, "fcfs")
    if policy not in ("fcfs", "priority"):
        raise f.fail("config.policy", f"expected fcfs or priority, got {policy!r}")
    config = EngineConfig(
        block_size=f.get(c, "block_size", "config", int, minimum=1),
        num_gpu_blocks=num_blocks - 1,
        max_num_batched_tokens=f.get(c, "max_num_batched_tokens", "config", int, minimum=1),
        max_num_seqs=f.get(c, "max_num_seqs", "config", int, minimum=1),
        max_model_len=f.get(c, "max_model_len", "config", int, minimum=1),
        scheduling_policy=policy,
        enable_prefix_caching=f.get(c, "enable_prefix_caching", "config", bool, False),
        enable_chunked_prefill=f.get(c, "enable_chunked_prefill", "config", bool, True),
        tensor_parallel=f.get(c, "tensor_parallel_size", "config", int, 1, minimum=1),
    )
    if "usable_blocks" in c and c["usable_blocks"] != config.num_gpu_blocks:
        raise f.fail("config.usable_blocks", f"is {c['usable_blocks']} but num_blocks − 1 is "
                                             f"{config.num_gpu_blocks}; they must agree")
    requests = []
    for i, r in enumerate(f.get(data, "requests", "", list)):
        where = f"requests[{i}]"
        times = f.get(r, "token_times_s", where, list)
        for j, t in enumerate(times):
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
                raise f.fail(f"{where}.token_times_s[{j}]", f"expected a number, got {t!r}")
        requests.append(LoggedRequest(
            id=str(f.get(r, "id", where, (str, int))),
            arrival_s=f.get(r, "arrival_s", where, float, minimum=0),
            prompt_tokens=f.get(r, "prompt_tokens", where, int, minimum=1),
            max_tokens=f.get(r, "max_tokens", where, int, minimum=1),
            token_times_s=tuple(float(t) for t in times),
            preemptions=f.get(r, "preemptions", where, int, None, minimum=0),
        ))
    if not requests:
        raise f.fail("requests", "is empty; a step log needs the run's requests")
    ids = {r.id for r in requests}
    steps = []
    prev_end = -math.inf
    for i, s in enumerate(f.get(data, "steps", "", list)):
        where = f"steps[{i}]"
        start, end = f.get(s, "start_s", where, float), f.get(s, "end_s", where, float)
        if end < start:
            raise f.fail(where, f"end_s {end} is before start_s {start}")
        if start < prev_end:
            raise f.fail(where, f"start_s {start} is before the previous step's end_s {prev_end}; steps must "
                                f"be in time order and not overlap")
        prev_end = end
        scheduled = f.get(s, "scheduled", where, dict)
        context = f.get(s, "context", where, dict)
        batch = []
        for rid in scheduled:
            if rid not in ids:
                raise f.fail(f"{where}.scheduled", f"request {rid!r} is not in requests[]")
            if rid not in context:
                raise f.fail(f"{where}.context", f"has no entry for scheduled request {rid!r}")
            batch.append((rid, f.get(scheduled, rid, f"{where}.scheduled", int, minimum=0),
                          f.get(context, rid, f"{where}.context", int, minimum=0)))
        preempted = tuple(str(x) for x in f.get(s, "preempted", where, list, []))
        steps.append(LoggedStep(start, end, tuple(batch), preempted))
    if not steps:
        raise f.fail("steps", "is empty; a step log needs the engine's steps")
    device = "cpu" if re.search(r"\bcpu\b", source.lower()) else ("cuda" if "cuda" in source.lower() else "unknown")
    summary = data.get("summary") if isinstance(data.get("summary"), dict) else None
    return StepLog(path, "vllm-json", source or "vLLM", device, model, config, requests, steps, summary)


# format name -> (does this JSON look like it?, reader)
READERS: dict[str, tuple[Callable[[Any], bool], Callable[[Any, Path], StepLog]]] = {
    "vllm-json": (_is_vllm_json, read_vllm_json),
}
