"""``cbsim observe``: one observed run, from scenario to run file.

The steps, each in its own module: the scenario's workload (:func:`sim.workload.synthetic.build_workload`,
the same requests ``cbsim run`` simulates), prompts of its lengths (:mod:`sim.observe.prompts`), the
server's facts before (:mod:`sim.observe.server_facts`), the requests on the wall clock
(:mod:`sim.observe.client`), the server's facts after, and the run file (:mod:`sim.observe.run_file`),
written whatever happened: a finished run, a server that died or refused requests, or Ctrl-C.

The engine config in the run comes from the server wherever it says (``/metrics``: block size,
KV blocks, prefix caching; ``/v1/models``: ``max_model_len``) and from the scenario otherwise
(``max_num_seqs``, ``max_num_batched_tokens``: vLLM does not export them; give the scenario the
values the server was started with). ``config_sources`` in the run names the origin of each.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import CbsimError
from sim.observe.client import Dispatch, Measured, dispatch, request_body
from sim.observe.prompts import fit_text_prompt, token_id_prompt
from sim.observe.run_file import run_document, write_atomically
from sim.observe.server_facts import fetch_server_facts, preemptions_between

PROMPT_MODES = ("auto", "token-ids", "text")
APIS = ("completions", "chat")


@dataclass
class Observed:
    """What the command reports: the run file's path and the figures it prints."""

    path: Path
    document: dict[str, Any]
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        return bool(self.document["complete"])


def base_url(url: str) -> str:
    """``http://host:port`` from what a user may paste (a trailing ``/`` or ``/v1``)."""
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise CbsimError(f"--url: expected an http:// or https:// address of the server, got {url!r}")
    return u[:-3] if u.endswith("/v1") else u


class Observer:
    """One observation: set up, then :meth:`run` (async), then :meth:`document` (always possible)."""

    def __init__(self, scenario, url: str, model_name: str | None, api: str, prompts: str, read_timeout_s: float,
                 content_seed: int | None = None):
        from sim.scenario.resolved import resolve
        from sim.workload.synthetic import build_workload

        if api not in APIS:
            raise CbsimError(f"--api: expected one of {', '.join(APIS)}, got {api!r}")
        if prompts not in PROMPT_MODES:
            raise CbsimError(f"--prompts: expected one of {', '.join(PROMPT_MODES)}, got {prompts!r}")
        if api == "chat" and prompts == "token-ids":
            raise CbsimError("--prompts token-ids needs --api completions: chat messages are text")
        self.scenario = scenario
        self.deployment = resolve(scenario)
        self.specs = build_workload(scenario)
        self.url = base_url(url)
        self.api = api
        self.endpoint = f"{self.url}/v1/chat/completions" if api == "chat" else f"{self.url}/v1/completions"
        self.model_name = model_name
        self.prompts = prompts
        self.prompt_mode: str | None = None
        self.read_timeout_s = read_timeout_s
        self.records = [Measured(s.id, s.arrival_s, s.prompt_tokens, s.output_tokens) for s in self.specs]
        self.state = Dispatch(self.records)
        self.facts_before: dict[str, Any] | None = None
        self.facts_after: dict[str, Any] | None = None
        self.text_counts: list[int | None] = []
        # Prompt content is drawn from its own seed, fresh per observation unless given: the same
        # scenario observed twice on one server would otherwise resend the same tokens, and the
        # server's prefix cache (left warm by the first run) would serve the repeat's prompts.
        if content_seed is not None and not (isinstance(content_seed, int) and 0 <= content_seed < 2 ** 63):
            raise CbsimError(f"--content-seed: expected an integer 0 <= seed < 2**63, got {content_seed!r}")
        self.content_seed = secrets.randbelow(2 ** 63) if content_seed is None else content_seed

    # ---------------------------------------------------------------------------------------------
    async def run(self, on_change=None) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as session:
            self.facts_before = await fetch_server_facts(session, self.url, min(self.read_timeout_s, 10.0))
            self._check_reachable(self.facts_before)
            self.model_name = self.model_name or self._served_model(self.facts_before)
            bodies = await self._bodies(session)
            await dispatch(session, self.endpoint, self.api, bodies, self.records, self.state, self.read_timeout_s,
                           on_change)
            if self.state.stopped is None:
                self.facts_after = await fetch_server_facts(session, self.url, min(self.read_timeout_s, 10.0))

    def _check_reachable(self, facts: dict) -> None:
        errors = [facts.get("metrics_error", ""), facts.get("models_error", "")]
        if all("ClientConnectorError" in e or "Cannot connect" in e for e in errors):
            raise CbsimError(f"--url: no server answers at {self.url} ({errors[1]}); start it, or fix the address")

    def _served_model(self, facts: dict) -> str:
        models = facts.get("models") or []
        if not models:
            raise CbsimError(f"--model: the server at {self.url} does not list its models on /v1/models "
                             f"({facts.get('models_error', 'no models')}); name the served model with --model")
        return models[0]["id"]

    async def _probe_token_ids(self, session) -> str:
        """Whether the server takes token-id prompts: one tiny request (also warms the server up)."""
        import aiohttp

        vocab = self.deployment.model.vocab_size
        # shaped like the run's requests (streaming, usage), so the client's first-use costs are paid here
        body = request_body("completions", self.model_name, [min(3, vocab - 1)] * 4, 2)
        try:
            timeout = aiohttp.ClientTimeout(total=self.read_timeout_s)
            async with session.post(self.endpoint, json=body, timeout=timeout) as resp:
                async for _ in resp.content:
                    pass
                if resp.status in (400, 422):
                    return "text"
        except (aiohttp.ClientError, TimeoutError):
            pass  # not decided by the probe: the run itself will say what the server does
        return "token-ids"

    async def _bodies(self, session) -> list[dict]:
        mode = self.prompts
        if mode == "auto":
            mode = "text" if self.api == "chat" else await self._probe_token_ids(session)
        seed = self.content_seed
        if mode == "token-ids":
            vocab = self.deployment.model.vocab_size
            self.prompt_mode = "token-ids"
            return [request_body(self.api, self.model_name, token_id_prompt(s, vocab, seed), s.output_tokens)
                    for s in self.specs]
        counter = _TokenCounter(session, self.url, self.model_name, self.api)
        sem = asyncio.Semaphore(8)

        async def fit(spec):
            async with sem:
                return await fit_text_prompt(spec, counter, seed)

        fitted = await asyncio.gather(*(fit(s) for s in self.specs))
        self.text_counts = [n for _, n in fitted]
        exact = sum(n == s.prompt_tokens for (_, n), s in zip(fitted, self.specs))
        if counter.available:
            self.prompt_mode = (f"text fitted with the server's /tokenize ({exact} of {len(self.specs)} exactly "
                                f"the workload's length)")
        else:
            self.prompt_mode = ("text, lengths estimated at one word per token (the server has no /tokenize); "
                                "the server's counts are in each request's usage")
        return [request_body(self.api, self.model_name, text, s.output_tokens)
                for (text, _), s in zip(fitted, self.specs)]

    # ---------------------------------------------------------------------------------------------
    def document(self, interrupted: bool = False) -> dict[str, Any]:
        scn = self.scenario
        before = self.facts_before or {}
        after = self.facts_after or {}
        config, sources = self._config(before)
        stopped = self.state.stopped
        if interrupted:
            stopped = "stopped by Ctrl-C" + (f"; {stopped}" if stopped else "")
        cache = (before.get("metrics") or {}).get("cache_config") or {}
        version = before.get("version")
        engine = {"name": "vllm", "version": version} if cache else {"name": "unknown", "version": version}
        gpu = scn.hardware.gpu if isinstance(scn.hardware.gpu, str) else None
        util = cache.get("gpu_memory_utilization", scn.hardware.gpu_memory_utilization)
        label = f"vLLM {version}" if cache and version else ("vLLM" if cache else "an OpenAI-compatible server")
        source = (f"{label} serving {self.model_name} at {self.url} ({self.api} API, {self.prompt_mode or 'no'} "
                  f"prompts), observed by cbsim observe")
        server = {"before": before, "after": after or None,
                  "preemptions": preemptions_between(before, after) if after else None}
        observe = {"url": self.url, "endpoint": self.endpoint, "api": self.api, "served_model": self.model_name,
                   "prompt_mode": self.prompt_mode, "content_seed": self.content_seed,
                   "read_timeout_s": self.read_timeout_s,
                   "wall_clock_start_unix_s": self.state.t0_unix_s or None,
                   "scenario": scn.model_dump(mode="json", exclude_none=True)}
        return run_document(self.records, source=source, engine=engine, model=self.deployment.model.to_dict(),
                            hardware={"gpu": gpu, "tensor_parallel": scn.hardware.tensor_parallel,
                                      "gpu_memory_utilization": util},
                            config=config, config_sources=sources, server=server, observe=observe, stopped=stopped)

    def _config(self, facts: dict) -> tuple[dict, dict]:
        """The engine config in cbsim's terms, and where each value came from."""
        cache = (facts.get("metrics") or {}).get("cache_config") or {}
        served = next((m for m in facts.get("models") or [] if m["id"] == self.model_name), None)
        limits = self.deployment.limits_for("vllm-v1")
        engine = self.scenario.engine
        config: dict[str, Any] = {}
        sources: dict[str, str] = {}

        def put(key, value, source):
            config[key] = value
            sources[key] = source

        if isinstance(cache.get("block_size"), int):
            put("block_size", cache["block_size"], "server /metrics (vllm:cache_config_info)")
        else:
            put("block_size", engine.block_size, "scenario engine.block_size")
        if isinstance(cache.get("num_gpu_blocks"), int):
            put("num_gpu_blocks", cache["num_gpu_blocks"] - 1,
                "server /metrics (vllm:cache_config_info num_gpu_blocks, minus vLLM's null block)")
        elif engine.num_gpu_blocks is not None:
            put("num_gpu_blocks", engine.num_gpu_blocks, "scenario engine.num_gpu_blocks")
        else:
            put("num_gpu_blocks", None, "unknown: computed from GPU memory when simulated")
        if isinstance(cache.get("enable_prefix_caching"), bool):
            put("enable_prefix_caching", cache["enable_prefix_caching"], "server /metrics (vllm:cache_config_info)")
        else:
            put("enable_prefix_caching", engine.enable_prefix_caching if engine.enable_prefix_caching is not None
                else True, "scenario engine.enable_prefix_caching (vLLM V1 default: on)")
        if served and isinstance(served.get("max_model_len"), int):
            put("max_model_len", served["max_model_len"], "server /v1/models")
        else:
            put("max_model_len", engine.max_model_len, "scenario engine.max_model_len")
        put("max_num_seqs", limits.max_num_seqs, "scenario engine.max_num_seqs (vLLM does not export it)"
            if engine.max_num_seqs is not None else "vLLM's default on the scenario's GPU (not exported)")
        put("max_num_batched_tokens", limits.max_num_batched_tokens,
            "scenario engine.max_num_batched_tokens (vLLM does not export it)"
            if engine.max_num_batched_tokens is not None else "vLLM's default on the scenario's GPU (not exported)")
        put("enable_chunked_prefill", True, "vLLM V1 (always on)")
        put("async_scheduling", engine.async_scheduling, "scenario engine.async_scheduling (not exported)")
        put("scheduling_policy", "fcfs", "vLLM's default")
        return config, sources


class _TokenCounter:
    """The server's token count of a text (vLLM's ``/tokenize``); None when it has none."""

    def __init__(self, session, url: str, model: str, api: str) -> None:
        self.session, self.url, self.model, self.api = session, url, model, api
        self.available = True

    async def __call__(self, text: str) -> int | None:
        import aiohttp

        if not self.available:
            return None
        body: dict[str, Any] = {"model": self.model}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        try:
            async with self.session.post(f"{self.url}/tokenize", json=body,
                                         timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status != 200:
                    self.available = False
                    return None
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            self.available = False
            return None
        count = data.get("count") if isinstance(data, dict) else None
        if not isinstance(count, int):
            self.available = False
            return None
        return count


def observe(scenario, url: str, out: str | Path, *, model_name: str | None = None, api: str = "completions",
            prompts: str = "auto", read_timeout_s: float = 120.0, content_seed: int | None = None,
            on_change=None) -> Observed:
    """Observe one run and write it to ``out``; returns what was written. Ctrl-C writes what was
    measured (marked incomplete) and then raises KeyboardInterrupt."""
    obs = Observer(scenario, url, model_name, api, prompts, read_timeout_s, content_seed)
    out = Path(out)
    if out.exists() and out.is_dir():
        raise CbsimError(f"--out: {out} is a folder; give the run file's path (e.g. {out}/run.json)")
    try:
        asyncio.run(obs.run(on_change))
    except KeyboardInterrupt:
        doc = obs.document(interrupted=True)
        write_atomically(doc, out)
        raise
    doc = obs.document()
    write_atomically(doc, out)
    return Observed(out, doc)
