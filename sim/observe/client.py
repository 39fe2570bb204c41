"""Send a workload to an OpenAI-compatible server on the wall clock and time every streamed token.

Why it is built this way:

- **Arrivals on the wall clock, not after the previous answer.** One dispatcher sleeps until each
  request's arrival time and starts it as its own task (aiohttp, no connection limit), so any
  number are in flight at once and a slow answer never delays the next arrival. What the client
  itself adds is measured, not assumed: the *send lag* (when the request was handed to the HTTP
  library minus when it was due), as inference-perf reports it.
- **Token times from the stream.** Requests stream (``stream: true``) with usage in every chunk
  (vLLM's ``stream_options.continuous_usage_stats``), so a chunk that carries several tokens (the
  server coalesced them) is counted as several, all arriving at that chunk's time. A server that
  sends no per-chunk usage gets one token per chunk with content, and its final usage is compared.
- **Lengths as the workload says.** ``max_tokens`` is the workload's output length, with
  ``ignore_eos`` (vLLM) and ``min_tokens`` so a model that would stop early does not.
- **Failures are data.** An HTTP error (4xx/5xx, e.g. 429), a stream that ends short, or a server
  silent for ``read_timeout_s`` ends that request with its error; a refused or dropped connection,
  or a stream broken off mid-answer, means the server is gone and stops the run (:class:`ServerGone`). Whatever was measured until then
  stays in the records.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Measured:
    """What the client saw of one request (times in seconds from the run's start)."""

    id: str
    scheduled_s: float  # the workload's arrival
    prompt_tokens: int  # what was asked (the server's own count is in usage)
    max_tokens: int
    sent_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    state: str = "not sent"  # not sent | sent | finished | failed

    @property
    def finished(self) -> bool:
        return self.state == "finished"


class ServerGone(Exception):
    """The server refused or dropped connections: nothing more can be measured."""


def request_body(api: str, model: str, prompt: Any, max_tokens: int) -> dict[str, Any]:
    """The JSON body of one streaming request. ``prompt``: token ids or text (completions), text
    (chat)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _chunk_text(api: str, choice: dict) -> str:
    if api == "chat":
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def stream_one(session, url: str, body: dict, rec: Measured, clock, api: str, read_timeout_s: float) -> None:
    """Send one request and record its stream into ``rec``. Raises :class:`ServerGone` when the
    connection is refused or dropped."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=read_timeout_s, sock_read=read_timeout_s)
    rec.sent_s = clock()
    rec.state = "sent"
    counted_by_usage = False
    try:
        async with session.post(url, json=body, timeout=timeout) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300].replace("\n", " ")
                rec.state, rec.error = "failed", f"HTTP {resp.status}: {text}"
                return
            async for raw in resp.content:
                now = clock()
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    rec.state, rec.error = "failed", f"the stream sent a line that is not JSON: {data[:120]!r}"
                    return
                if "error" in chunk:
                    rec.state, rec.error = "failed", f"server error in the stream: {str(chunk['error'])[:200]}"
                    return
                usage = chunk.get("usage")
                choices = chunk.get("choices") or []
                if usage and usage.get("completion_tokens") is not None and choices:
                    counted_by_usage = True
                    new = int(usage["completion_tokens"]) - len(rec.token_times_s)
                    rec.token_times_s.extend([now] * max(new, 0))
                elif choices and not counted_by_usage and _chunk_text(api, choices[0]):
                    rec.token_times_s.append(now)
                if usage:
                    rec.usage = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens")}
                for c in choices:
                    if c.get("finish_reason"):
                        rec.finish_reason = c["finish_reason"]
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
        rec.state, rec.error = "failed", f"connection lost: {type(exc).__name__}: {exc}"
        raise ServerGone(f"the server stopped answering ({type(exc).__name__}: {exc})") from None
    except TimeoutError:
        rec.state, rec.error = "failed", f"no answer for {read_timeout_s:g} s"
        return
    except aiohttp.ClientPayloadError as exc:
        rec.state, rec.error = "failed", f"the stream broke off: {exc}"
        raise ServerGone(f"a stream broke off ({exc})") from None
    except aiohttp.ClientError as exc:
        rec.state, rec.error = "failed", f"{type(exc).__name__}: {exc}"
        return
    done = rec.usage.get("completion_tokens") if rec.usage else len(rec.token_times_s)
    if done is not None and done < rec.max_tokens:
        rec.state, rec.error = "failed", f"stream ended after {done} of {rec.max_tokens} tokens"
        return
    rec.state = "finished"


@dataclass
class Dispatch:
    """A whole run in flight: the records, and why it stopped early (None: it did not)."""

    records: list[Measured]
    stopped: str | None = None
    t0_unix_s: float = 0.0


async def dispatch(session, url: str, api: str, bodies: list[dict], records: list[Measured], state: Dispatch,
                   read_timeout_s: float, on_change=None) -> None:
    """Start each request at its scheduled time; wait for all. Stops early when the server is gone."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    state.t0_unix_s = time.time()

    def clock() -> float:
        return loop.time() - t0

    gone = asyncio.Event()
    tasks: set[asyncio.Task] = set()

    async def one(body: dict, rec: Measured) -> None:
        try:
            await stream_one(session, url, body, rec, clock, api, read_timeout_s)
        except ServerGone as exc:
            if state.stopped is None:
                state.stopped = f"{exc} at {clock():.2f} s"
            gone.set()
        finally:
            if on_change is not None:
                on_change(records)

    for body, rec in zip(bodies, records):
        delay = rec.scheduled_s - clock()
        if delay > 0:
            try:
                await asyncio.wait_for(gone.wait(), timeout=delay)
            except TimeoutError:
                pass
        if gone.is_set():
            break
        task = asyncio.create_task(one(body, rec))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        if on_change is not None:
            on_change(records)
    while tasks and not gone.is_set():
        waiter = asyncio.create_task(gone.wait())
        await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    for task in list(tasks):  # the server is gone: what is still open cannot finish
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    for rec in records:
        if rec.state == "sent":
            rec.state, rec.error = "failed", rec.error or "cut off: the run stopped before it finished"
