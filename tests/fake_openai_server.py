"""A small OpenAI-compatible server on 127.0.0.1 for ``cbsim observe`` tests, in a thread of its own.

It answers like vLLM where observe looks (``/v1/models``, ``/metrics`` with ``vllm:cache_config_info``,
``/version``, ``/tokenize``, streaming ``/v1/completions`` and ``/v1/chat/completions`` with
continuous usage), generating ``max_tokens`` tokens ``step_s`` apart, and misbehaves on request:

- ``refuse_every``: every k-th completion request gets HTTP 429;
- ``die_after``: after n completion requests the server drops every open stream and stops
  listening (a crashed server);
- ``silent``: completion requests are accepted and never answered.
"""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

BLOCK_SIZE, NUM_GPU_BLOCKS, MAX_MODEL_LEN = 16, 101, 512


class FakeServer:
    def __init__(self, step_s: float = 0.002, refuse_every: int = 0, die_after: int | None = None,
                 silent: bool = False, token_ids: bool = True):
        self.step_s, self.refuse_every, self.die_after, self.silent = step_s, refuse_every, die_after, silent
        self.token_ids = token_ids
        self.completions = 0
        self.bodies: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.open: set = set()

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> FakeServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/version", self.version)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await self.site.start()
        self.port = self.site._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _die(self) -> None:
        for transport in list(self.open):
            transport.abort()
        if self.site is not None:
            await self.site.stop()
            self.site = None

    # -- endpoints -------------------------------------------------------------------------------
    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "fake", "root": "fake",
                                                              "max_model_len": MAX_MODEL_LEN}]})

    async def metrics(self, request):
        return web.Response(text=(
            "# TYPE vllm:num_preemptions_total counter\n"
            'vllm:num_preemptions_total{engine="0",model_name="fake"} 0.0\n'
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",enable_prefix_caching="True",engine="0",'
            f'gpu_memory_utilization="0.9",num_gpu_blocks="{NUM_GPU_BLOCKS}",num_cpu_blocks="None"}} 1.0\n'))

    async def version(self, request):
        return web.json_response({"version": "0.0-fake"})

    async def tokenize(self, request):
        body = await request.json()
        text = body["messages"][0]["content"] if "messages" in body else body["prompt"]
        return web.json_response({"count": len(text.split()), "max_model_len": MAX_MODEL_LEN})

    async def complete(self, request):
        body = await request.json()
        if isinstance(body.get("prompt"), list) and not self.token_ids:
            return web.json_response({"error": "prompt must be a string"}, status=400)
        probe = body.get("prompt") == [3, 3, 3, 3] and body["max_tokens"] == 2  # observe's probe (session.py)
        if probe:
            return await self._stream(request, body, 4)
        self.completions += 1
        self.bodies.append(body)
        n = self.completions
        if self.refuse_every and n % self.refuse_every == 0:
            return web.json_response({"error": {"message": "rate limited"}}, status=429)
        if self.die_after is not None and n > self.die_after:
            self.open.add(request.transport)
            await self._die()
            raise ConnectionResetError("dead")
        if self.silent:
            await asyncio.sleep(3600)
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(
            (prompt if prompt is not None else body["messages"][0]["content"]).split())
        return await self._stream(request, body, prompt_tokens)

    async def _stream(self, request, body: dict, prompt_tokens: int):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.open.add(request.transport)
        chat = "messages" in body
        try:
            for k in range(body["max_tokens"]):
                await asyncio.sleep(self.step_s)
                choice = {"index": 0, "finish_reason": "length" if k + 1 == body["max_tokens"] else None}
                choice.update({"delta": {"content": f" t{k}"}} if chat else {"text": f" t{k}"})
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": k + 1,
                         "total_tokens": prompt_tokens + k + 1}
                await resp.write(f"data: {json.dumps({'choices': [choice], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        finally:
            self.open.discard(request.transport)
        return resp
