"""What a serving engine says about itself: vLLM's Prometheus ``/metrics`` and ``/v1/models``.

Why: a simulation of an observed run is only fair when it gets the server's real KV capacity and
block size, not the scenario's guess. vLLM exports its cache config as the labels of one gauge,
``vllm:cache_config_info`` (``block_size``, ``num_gpu_blocks``, ``enable_prefix_caching``, ...,
from ``CacheConfig.metrics_info()``, vllm/v1/metrics/loggers.py ``log_metrics_info``), and counts
preemptions in ``vllm:num_preemptions_total``. ``/v1/models`` names the served model and its
``max_model_len``. Both are read before and after a run and stored in the run file; the run's
preemptions are the difference of the two counters.

Everything here is parsing of plain text and JSON (the fetching is :func:`fetch_server_facts`,
given an open client session), so other engines need only another parser.
"""

from __future__ import annotations

import math
import re
from typing import Any

# name{label="v",...} value   (the Prometheus text exposition format, version 0.0.4)
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# the samples kept from /metrics: the rest (histograms of every latency) are not needed to simulate
KEPT_METRICS = ("vllm:num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                "vllm:request_success_total")


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text page as (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        labels = {k: bytes(v, "utf-8").decode("unicode_escape") for k, v in _LABEL.findall(m["labels"] or "")}
        out.append((m["name"], labels, value))
    return out


def _typed(value: str) -> Any:
    """A label value as the Python value it spells (vLLM writes str() of ints, bools, None)."""
    if value in ("True", "False"):
        return value == "True"
    if value == "None":
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        f = float(value)
        return f if math.isfinite(f) else value
    except ValueError:
        return value


def vllm_metrics_facts(text: str) -> dict[str, Any]:
    """The facts of a vLLM ``/metrics`` page: ``cache_config`` (the labels of
    ``vllm:cache_config_info``, typed) and ``counters`` (the kept samples, summed over engines)."""
    samples = parse_prometheus(text)
    cache: dict[str, Any] = {}
    counters: dict[str, float] = {}
    for name, labels, value in samples:
        if name == "vllm:cache_config_info" and not cache:
            cache = {k: _typed(v) for k, v in labels.items() if k != "engine"}
        elif name in KEPT_METRICS:
            counters[name] = counters.get(name, 0.0) + value
    return {"cache_config": cache, "counters": counters}


def models_facts(payload: Any) -> dict[str, Any]:
    """The served models of an OpenAI ``/v1/models`` answer: id, root and max_model_len of each."""
    models = []
    if isinstance(payload, dict) and isinstance(payload.get("data"), list):
        for m in payload["data"]:
            if isinstance(m, dict) and "id" in m:
                models.append({"id": m["id"], "root": m.get("root"), "max_model_len": m.get("max_model_len")})
    return {"models": models}


async def fetch_server_facts(session, base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """``/metrics`` and ``/v1/models`` of the server at ``base_url`` (an aiohttp session). A page that
    cannot be read is recorded with its error instead: many OpenAI-compatible servers have no
    ``/metrics``."""
    import aiohttp

    facts: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.get(f"{base_url}/metrics", timeout=timeout) as resp:
            if resp.status == 200:
                facts["metrics"] = vllm_metrics_facts(await resp.text())
            else:
                facts["metrics_error"] = f"HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        facts["metrics_error"] = _describe(exc)
    try:
        async with session.get(f"{base_url}/v1/models", timeout=timeout) as resp:
            if resp.status == 200:
                facts.update(models_facts(await resp.json(content_type=None)))
            else:
                facts["models_error"] = f"HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        facts["models_error"] = _describe(exc)
    try:
        async with session.get(f"{base_url}/version", timeout=timeout) as resp:
            if resp.status == 200:
                version = (await resp.json(content_type=None)).get("version")
                facts["version"] = str(version) if version is not None else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError, AttributeError):
        pass  # not every server has /version
    return facts


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def preemptions_between(before: dict[str, Any], after: dict[str, Any]) -> int | None:
    """Preemptions the server counted between two fact snapshots (None when it does not say)."""
    key = "vllm:num_preemptions_total"
    try:
        return int(after["metrics"]["counters"][key] - before["metrics"]["counters"][key])
    except (KeyError, TypeError):
        return None
