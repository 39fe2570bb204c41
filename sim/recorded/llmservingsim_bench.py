"""LLMServingSim bench folders as request-level runs (:mod:`sim.recorded.request_run`).

LLMServingSim (casys-kaist/LLMServingSim, MIT) publishes real vLLM serving runs next to its
simulator's predictions, one folder per run::

    RUN/vllm/requests.jsonl   one JSON object per request: request_id, input_toks, output_toks,
                              arrival_time (client clock), queued_ts, scheduled_ts, first_token_ts,
                              last_token_ts (engine clock, seconds)
    RUN/vllm/meta.json        vllm_version, engine_kwargs (what the run set), and sometimes kv_cache
                              (num_gpu_blocks, block_size, gpu_memory_utilization,
                              enable_prefix_caching), hardware (device_name, total memory) and
                              resolved_config (vLLM's whole resolved configuration)

How they map (``../shared/reference/gpu-runs/README.md`` documents the two runs we hold):

- arrival = ``queued_ts`` (when the engine received the request, the clock TTFT is measured
  from), first and last token times from the same clock; ``output_toks`` is both the output
  length and ``max_tokens`` (every request generated exactly its ``output_toks``).
- engine settings: ``resolved_config`` first (what vLLM actually ran with: ``scheduler_config``
  for async scheduling, chunked prefill and policy, ``cache_config`` for block size and prefix
  caching, ``model_config.max_model_len``), then ``kv_cache``, then ``engine_kwargs``; what none
  of them sets takes vLLM V1's defaults (:data:`sim.recorded.request_run.ENGINE_DEFAULTS`).
- ``num_gpu_blocks``: vLLM's pool includes its null block, so the usable count is one less.
- the GPU: ``hardware.device_name`` matched against cbsim's GPU descriptions, else ``--gpu``.
- the model: ``engine_kwargs.model`` through :func:`sim.hardware.models.get_model`, else
  :data:`KNOWN_MODELS` (HF ids of the same shape as a cbsim model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sim.errors import CbsimError
from sim.recorded.request_run import Fields, RequestRun, RunRequest, check_requests, resolve_config
from sim.user_files import read_json, read_text

FORMAT = "llmservingsim-bench"

# HF ids -> cbsim model ids with the same shape (Llama 3.1 differs from Llama 3 only in RoPE
# scaling and context length, which change neither memory per token nor any kernel's shape)
KNOWN_MODELS = {
    "meta-llama/Llama-3.1-8B": "llama-3-8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3-8b",
    "meta-llama/Meta-Llama-3.1-8B": "llama-3-8b",
    "meta-llama/Meta-Llama-3-8B": "llama-3-8b",
    "meta-llama/Meta-Llama-3-8B-Instruct": "llama-3-8b",
    "meta-llama/Llama-3.1-70B": "llama-3-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3-70b",
    "meta-llama/Meta-Llama-3-70B": "llama-3-70b",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "mistralai/Mistral-7B-v0.1": "mistral-7b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
}
DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
          "float32": "fp32", "fp32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def bench_dir(path: Path) -> Path | None:
    """The ``vllm/`` folder of a bench run given the run folder or that folder itself."""
    for p in (path / "vllm", path):
        if p.is_dir() and (p / "requests.jsonl").is_file():
            return p
    return None


def is_bench_folder(path: Path) -> bool:
    return path.is_dir() and bench_dir(path) is not None


def resolve_model_name(name: Any, where: str) -> Any:
    """A model id cbsim resolves for an HF name (see :data:`KNOWN_MODELS`)."""
    from sim.hardware.models import get_model

    try:
        get_model(name)
        return name
    except CbsimError:
        if name in KNOWN_MODELS:
            return KNOWN_MODELS[name]
        raise CbsimError(f"{where}: model {name!r} is not one cbsim can resolve offline; add its config.json to the "
                         f"local Hugging Face cache or write the run in the cbsim-request-run format with an inline "
                         f"model spec") from None


def gpu_from_device_name(name: str | None) -> str | None:
    """The cbsim GPU id whose description starts with the device's reported name."""
    if not name:
        return None
    from sim.hardware.gpus import GPUS

    matches = [g.name for g in GPUS.values() if g.description.lower().startswith(name.lower().strip())]
    return matches[0] if len(matches) == 1 else None


def read_bench(path: str | Path) -> RequestRun:
    root = Path(path)
    folder = bench_dir(root)
    if folder is None:
        raise CbsimError(f"{root}: not an LLMServingSim bench folder (no vllm/requests.jsonl)")
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        raise CbsimError(f"{folder}: no meta.json beside requests.jsonl; it holds the engine's settings")
    f = Fields(meta_path)
    meta = read_json(meta_path, "LLMServingSim bench meta.json")
    if not isinstance(meta, dict):
        raise CbsimError(f"{meta_path}: must hold a JSON object (vllm_version, engine_kwargs, ...)")
    requests = _requests(folder / "requests.jsonl")
    kwargs = f.get(meta, "engine_kwargs", "", dict)
    kv = f.get(meta, "kv_cache", "", dict, {})
    resolved = f.get(meta, "resolved_config", "", dict, {})
    sched = resolved.get("scheduler_config") if isinstance(resolved.get("scheduler_config"), dict) else {}
    cache = resolved.get("cache_config") if isinstance(resolved.get("cache_config"), dict) else {}
    model_cfg = resolved.get("model_config") if isinstance(resolved.get("model_config"), dict) else {}
    parallel = resolved.get("parallel_config") if isinstance(resolved.get("parallel_config"), dict) else {}

    def first(*pairs):
        for obj, key in pairs:
            if isinstance(obj, dict) and obj.get(key) is not None:
                return obj[key]
        return None

    blocks = first((cache, "num_gpu_blocks"), (kv, "num_gpu_blocks"))
    config = {
        "block_size": first((cache, "block_size"), (kv, "block_size"), (kwargs, "block_size")),
        "max_num_seqs": first((sched, "max_num_seqs"), (kwargs, "max_num_seqs")),
        "max_num_batched_tokens": first((sched, "max_num_batched_tokens"), (kwargs, "max_num_batched_tokens")),
        "max_model_len": first((model_cfg, "max_model_len"), (kwargs, "max_model_len")),
        "num_gpu_blocks": blocks - 1 if isinstance(blocks, int) and blocks > 1 else None,
        "enable_prefix_caching": first((cache, "enable_prefix_caching"), (kv, "enable_prefix_caching"),
                                       (kwargs, "enable_prefix_caching")),
        "enable_chunked_prefill": first((sched, "enable_chunked_prefill"), (kwargs, "enable_chunked_prefill")),
        "async_scheduling": first((sched, "async_scheduling"), (kwargs, "async_scheduling")),
        "scheduling_policy": first((sched, "policy"), (kwargs, "scheduling_policy")),
    }
    hardware = {
        "tensor_parallel": first((parallel, "tensor_parallel_size"), (kwargs, "tensor_parallel_size")),
        "gpu_memory_utilization": first((cache, "gpu_memory_utilization"), (kv, "gpu_memory_utilization"),
                                        (kwargs, "gpu_memory_utilization")),
    }
    assumed: list[str] = []
    run_config = resolve_config(f, config, hardware, requests, assumed, where="config (resolved_config, kv_cache, "
                                                                             "engine_kwargs)")
    name = kwargs.get("model") or meta.get("model")
    model = resolve_model_name(name, str(meta_path))
    dtype = DTYPES.get(str(kwargs.get("dtype") or "bfloat16").lower())
    if dtype is None:
        raise f.fail("engine_kwargs.dtype", f"unknown dtype {kwargs.get('dtype')!r}; expected bfloat16, float16 or "
                                            f"float32")
    if kwargs.get("kv_cache_dtype") not in (None, "auto"):
        raise f.fail("engine_kwargs.kv_cache_dtype", f"{kwargs['kv_cache_dtype']!r} is not modelled here (auto only)")
    from dataclasses import replace

    from sim.hardware.models import get_model

    spec = get_model(model)
    if spec.dtype != dtype:
        spec = replace(spec, dtype=dtype)
        model = spec.to_dict()
    hw = meta.get("hardware") if isinstance(meta.get("hardware"), dict) else {}
    device = hw.get("device_name")
    version = str(meta.get("vllm_version") or "unknown")
    source = f"vLLM {version} on {run_config.tensor_parallel}x {device or 'an unrecorded GPU'}, {dtype}"
    return RequestRun(root, FORMAT, source, {"name": "vllm", "version": version}, model,
                      gpu_from_device_name(device), run_config, requests, assumed)


def _requests(path: Path) -> list[RunRequest]:
    f = Fields(path)
    rows = []
    lines = read_text(path, "LLMServingSim requests.jsonl").splitlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CbsimError(f"{path}:{lineno}: not valid JSON ({exc.msg}); one JSON object per line") from None
        where = f"line {lineno}"
        out = f.positive(r, "output_toks", where)
        rows.append((str(f.get(r, "request_id", where, (str, int))), f.get(r, "queued_ts", where, float),
                     f.positive(r, "input_toks", where), out, f.get(r, "first_token_ts", where, float),
                     f.get(r, "last_token_ts", where, float)))
    if not rows:
        raise CbsimError(f"{path}: holds no requests")
    t0 = min(r[1] for r in rows)
    requests = [RunRequest(rid, q - t0, p, o, o, a - t0, b - t0) for rid, q, p, o, a, b in rows]
    check_requests(f, requests)
    if not all(math.isfinite(r.last_token_s) for r in requests):
        raise CbsimError(f"{path}: token times must be finite")
    return requests
