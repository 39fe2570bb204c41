"""Request-level runs: what a serving benchmark records, in one neutral format cbsim validates against.

Most real serving runs have no step log: a benchmark client (``vllm bench serve``, LLMServingSim's
bench, a load generator) records per request when it arrived, how long its prompt and output were,
and when its first and last tokens came; the server's config says how it was set up. That is
enough to predict the run (the simulator needs arrivals, lengths and engine limits) and to judge
the prediction (TTFT, TPOT, E2E, throughput). ``cbsim validate --against RUN --table DIR`` reads
this format, or any foreign format a reader turns into it (:mod:`sim.recorded.run_readers`
chooses the reader; :mod:`sim.recorded.llmservingsim_bench` reads LLMServingSim's bench folders).

Format ``cbsim-request-run`` (version 1): one JSON object ::

    {
      "format": "cbsim-request-run", "format_version": 1,
      "source": "vLLM 0.19.0 on 1x RTX 4090, bf16",        # a sentence: engine, device, dtype
      "engine": {"name": "vllm", "version": "0.19.0"},
      "model": "llama-3-8b",                               # anything sim.hardware.models.get_model takes
      "hardware": {"gpu": "rtx-4090", "tensor_parallel": 1, "gpu_memory_utilization": 0.9},
      "config": {"block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 2048,
                 "max_model_len": 32768, "num_gpu_blocks": 2587, "enable_prefix_caching": true,
                 "enable_chunked_prefill": true, "async_scheduling": true, "scheduling_policy": "fcfs"},
      "requests": [{"id": "r0", "arrival_s": 0.0, "prompt_tokens": 2358, "output_tokens": 531,
                    "max_tokens": 531, "first_token_s": 0.69, "last_token_s": 17.57,
                    "token_times_s": [...]}, ...]
    }

- Times are seconds on one clock (any origin; arrival is when the *engine* received the request,
  so TTFT excludes the client's network and tokenization). ``token_times_s`` is optional (every
  output token's time, first and last included); ``max_tokens`` defaults to ``output_tokens`` (a
  benchmark with ``ignore_eos`` or fixed output lengths).
- ``config``: the engine's settings. Keys left out take :data:`ENGINE_DEFAULTS` (vLLM V1's
  defaults); ``num_gpu_blocks`` is the *usable* block count (vLLM's ``num_gpu_blocks`` minus its
  null block); null means "compute it from memory" (``hardware.gpu`` and
  ``gpu_memory_utilization``, as cbsim does for any scenario). ``max_num_seqs`` and
  ``max_num_batched_tokens`` have no default: vLLM's depend on the GPU and entry point, so a run
  must record them.
- ``hardware.gpu``: a cbsim GPU id (``cbsim`` needs it for KV capacity, MFU and swap bandwidth;
  ``--gpu`` supplies it when the run does not).

:func:`read_request_run` validates it and returns a :class:`RequestRun`, with a note in
``assumed`` for every default it applied.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim import user_files

FORMAT = "cbsim-request-run"
FORMAT_VERSION = 1

# vLLM V1's defaults for what a run may leave unset (vllm/config/cache.py, scheduler.py; async
# scheduling on by default in current vLLM V1 for a single GPU worker)
ENGINE_DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "async_scheduling": True,
    "scheduling_policy": "fcfs",
}
HARDWARE_DEFAULTS: dict[str, Any] = {"tensor_parallel": 1, "gpu_memory_utilization": 0.9}
REQUIRED_CONFIG = ("max_num_seqs", "max_num_batched_tokens")


@dataclass(frozen=True, slots=True)
class RunRequest:
    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    first_token_s: float
    last_token_s: float
    token_times_s: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class RunConfig:
    """The engine's settings, every one resolved (defaults applied)."""

    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_gpu_blocks: int | None  # usable blocks; None: compute from memory
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    async_scheduling: bool
    scheduling_policy: str
    tensor_parallel: int
    gpu_memory_utilization: float


@dataclass
class RequestRun:
    path: Path
    format: str  # the format it was read from (cbsim-request-run, llmservingsim-bench, ...)
    source: str  # a sentence naming engine, device, dtype
    engine: dict[str, Any]
    model: Any  # what get_model takes
    gpu: str | None  # cbsim GPU id, when known
    config: RunConfig
    requests: list[RunRequest]
    assumed: list[str] = field(default_factory=list)  # the defaults applied, in words

    def to_dict(self) -> dict[str, Any]:
        """The run in format ``cbsim-request-run`` (what :func:`write_request_run` writes)."""
        c = self.config
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "source": self.source, "engine": self.engine,
            "model": self.model,
            "hardware": {"gpu": self.gpu, "tensor_parallel": c.tensor_parallel,
                         "gpu_memory_utilization": c.gpu_memory_utilization},
            "config": {k: getattr(c, k) for k in ("block_size", "max_num_seqs", "max_num_batched_tokens",
                                                  "max_model_len", "num_gpu_blocks", "enable_prefix_caching",
                                                  "enable_chunked_prefill", "async_scheduling",
                                                  "scheduling_policy")},
            "requests": [{"id": r.id, "arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
                          "output_tokens": r.output_tokens, "max_tokens": r.max_tokens,
                          "first_token_s": r.first_token_s, "last_token_s": r.last_token_s,
                          **({"token_times_s": list(r.token_times_s)} if r.token_times_s else {})}
                         for r in self.requests],
        }


def write_request_run(run: RequestRun, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(run.to_dict(), indent=1) + "\n", encoding="utf-8")
    return p


# ------------------------------------------------------------------------------------------------
# checked access
# ------------------------------------------------------------------------------------------------
class Fields(user_files.Fields):
    """:class:`sim.user_files.Fields` plus the positive integers run files are full of."""

    def positive(self, obj: Any, key: str, where: str, default: Any = ...) -> int:
        return self.get(obj, key, where, int, default, minimum=1)


def resolve_config(f: Fields, config: dict[str, Any], hardware: dict[str, Any], requests: list[RunRequest],
                   assumed: list[str], where: str = "config") -> RunConfig:
    """Apply :data:`ENGINE_DEFAULTS` to a run's config (noting each default in ``assumed``)."""
    values: dict[str, Any] = {}
    for key, default in ENGINE_DEFAULTS.items():
        kind = type(default)
        got = f.get(config, key, where, kind, None)
        if got is None:
            assumed.append(f"{key} = {default!r} (vLLM V1's default; the run left it unset)")
            got = default
        values[key] = got
    if values["scheduling_policy"] not in ("fcfs", "priority"):
        raise f.fail(f"{where}.scheduling_policy", f"expected fcfs or priority, got {values['scheduling_policy']!r}")
    for key in REQUIRED_CONFIG:
        if config.get(key) is None:
            raise f.fail(f"{where}.{key}", "is missing: vLLM's default depends on the GPU and the entry point, so "
                                           "record the value the engine ran with")
        values[key] = f.positive(config, key, where)
    mml = f.positive(config, "max_model_len", where, None)
    if mml is None:
        longest = max(r.prompt_tokens + r.max_tokens for r in requests)
        mml = 1 << (longest - 1).bit_length()
        assumed.append(f"max_model_len = {mml} (unset: the model's own context length is not known here; the "
                       f"smallest power of two holding the longest request, {longest} tokens)")
    values["max_model_len"] = mml
    values["num_gpu_blocks"] = f.positive(config, "num_gpu_blocks", where, None)
    if values["num_gpu_blocks"] is None:
        assumed.append("num_gpu_blocks computed from GPU memory (the run did not record it)")
    tp = f.positive(hardware, "tensor_parallel", "hardware", None)
    if tp is None:
        tp = HARDWARE_DEFAULTS["tensor_parallel"]
    util = f.get(hardware, "gpu_memory_utilization", "hardware", float, None)
    if util is None:
        util = HARDWARE_DEFAULTS["gpu_memory_utilization"]
        if values["num_gpu_blocks"] is None:
            assumed.append(f"gpu_memory_utilization = {util} (vLLM's default)")
    if not 0 < util <= 1:
        raise f.fail("hardware.gpu_memory_utilization", f"must be in (0, 1], got {util}")
    return RunConfig(tensor_parallel=tp, gpu_memory_utilization=util, **values)


def check_requests(f: Fields, requests: list[RunRequest]) -> None:
    if not requests:
        raise f.fail("requests", "is empty; a run needs its requests")
    seen = set()
    for i, r in enumerate(requests):
        where = f"requests[{i}]"
        if r.id in seen:
            raise f.fail(f"{where}.id", f"{r.id!r} appears twice; ids must be unique")
        seen.add(r.id)
        if r.max_tokens < r.output_tokens:
            raise f.fail(f"{where}.max_tokens", f"is {r.max_tokens}, below output_tokens {r.output_tokens}")
        if not r.arrival_s <= r.first_token_s <= r.last_token_s:
            raise f.fail(where, f"times must satisfy arrival_s <= first_token_s <= last_token_s, got "
                                f"{r.arrival_s}, {r.first_token_s}, {r.last_token_s}")


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------
def is_request_run(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT


def read_request_run_file(p: Path) -> RequestRun:
    """Read a ``cbsim-request-run`` JSON file."""
    return read_request_run_json(user_files.read_json(p, "cbsim request-level run"), p)


def looks_like_request_run(p: Path) -> bool:
    """A file whose first 4 kB declare ``"format": "cbsim-request-run"``."""
    if not p.is_file():
        return False
    try:
        with p.open(encoding="utf-8") as fh:
            head = fh.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    return f'"format": "{FORMAT}"' in head or f'"format":"{FORMAT}"' in head


def read_request_run_json(data: dict, path: Path) -> RequestRun:
    f = Fields(path)
    version = f.get(data, "format_version", "", int)
    if version != FORMAT_VERSION:
        raise f.fail("format_version", f"is {version}; this cbsim reads version {FORMAT_VERSION}")
    requests = []
    for i, r in enumerate(f.get(data, "requests", "", list)):
        where = f"requests[{i}]"
        out = f.positive(r, "output_tokens", where)
        times = f.get(r, "token_times_s", where, list, None)
        if times is not None:
            for j, t in enumerate(times):
                if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
                    raise f.fail(f"{where}.token_times_s[{j}]", f"expected a number, got {t!r:.40}")
            if len(times) != out:
                raise f.fail(f"{where}.token_times_s", f"has {len(times)} times but output_tokens is {out}")
        first = f.get(r, "first_token_s", where, float, None)
        last = f.get(r, "last_token_s", where, float, None)
        if times:
            first = float(times[0]) if first is None else first
            last = float(times[-1]) if last is None else last
        if first is None or last is None:
            raise f.fail(where, "needs first_token_s and last_token_s (or token_times_s)")
        requests.append(RunRequest(
            id=str(f.get(r, "id", where, (str, int))), arrival_s=f.get(r, "arrival_s", where, float),
            prompt_tokens=f.positive(r, "prompt_tokens", where), output_tokens=out,
            max_tokens=f.positive(r, "max_tokens", where, out), first_token_s=first, last_token_s=last,
            token_times_s=tuple(float(t) for t in times) if times else None))
    check_requests(f, requests)
    hardware = f.get(data, "hardware", "", dict, {})
    assumed: list[str] = []
    config = resolve_config(f, f.get(data, "config", "", dict), hardware, requests, assumed)
    model = data.get("model")
    if model is None:
        raise f.fail("model", "required key is missing (a cbsim model id, ORG/NAME, or an inline spec)")
    gpu = f.get(hardware, "gpu", "hardware", str, None)
    return RequestRun(path, FORMAT, f.get(data, "source", "", str, "a recorded serving run"),
                      f.get(data, "engine", "", dict, {}), model, gpu, config, requests, assumed)
