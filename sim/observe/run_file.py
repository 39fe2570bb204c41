"""Write what ``cbsim observe`` measured as a request-level run (:mod:`sim.recorded.request_run`).

Why this format: ``cbsim validate --against RUN`` and ``cbsim calibrate --from-run RUN`` read
it, like any other recorded run. The measured requests go in ``requests`` exactly as that format
defines them, with ``arrival_s`` the moment the request left the client (the server cannot have
seen it earlier; TTFT then excludes the client's own send lag). What the format has no place for
is kept beside it, under keys its reader ignores: ``complete`` and ``incomplete_reason``, the
requests that did not finish (``unmeasured_requests``: error, tokens received), what the server
said about itself before and after (``server``), and how it was observed (``observe``).

The file is written atomically (a temporary file beside it, then a rename): after Ctrl-C or a
dead server, RUN holds everything measured so far, or the previous file, never half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from sim.observe.client import Measured
from sim.recorded.request_run import FORMAT, FORMAT_VERSION


def send_lag(records: list[Measured]) -> dict[str, Any]:
    """Seconds each sent request left after its scheduled arrival: mean, p50, p99, max."""
    lags = np.array([r.sent_s - r.scheduled_s for r in records if r.sent_s is not None])
    if not len(lags):
        return {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    return {"n": int(len(lags)), "mean": float(lags.mean()), "p50": float(np.percentile(lags, 50)),
            "p99": float(np.percentile(lags, 99)), "max": float(lags.max())}


def measured_request(r: Measured) -> dict[str, Any]:
    """One finished request in the request-level run format (plus ``scheduled_s`` and ``usage``)."""
    prompt = (r.usage or {}).get("prompt_tokens") or r.prompt_tokens
    return {"id": r.id, "arrival_s": r.sent_s, "prompt_tokens": int(prompt),
            "output_tokens": len(r.token_times_s), "max_tokens": r.max_tokens,
            "first_token_s": r.token_times_s[0], "last_token_s": r.token_times_s[-1],
            "token_times_s": r.token_times_s, "scheduled_s": r.scheduled_s, "usage": r.usage}


def unmeasured_request(r: Measured) -> dict[str, Any]:
    state = "cut off" if r.state == "sent" else r.state
    return {"id": r.id, "scheduled_s": r.scheduled_s, "sent_s": r.sent_s, "prompt_tokens": r.prompt_tokens,
            "max_tokens": r.max_tokens, "state": state,
            "error": r.error or ("cut off: the run stopped before it finished" if r.state == "sent" else None),
            "tokens_received": len(r.token_times_s), "token_times_s": r.token_times_s, "usage": r.usage}


def run_document(records: list[Measured], *, source: str, engine: dict, model: Any, hardware: dict,
                 config: dict, config_sources: dict, server: dict, observe: dict,
                 stopped: str | None) -> dict[str, Any]:
    """The whole run file as a mapping."""
    done = [r for r in records if r.finished and r.token_times_s]
    others = [r for r in records if not (r.finished and r.token_times_s)]
    reason = stopped
    if reason is None and others:
        first = next((r for r in others if r.error), others[0])
        reason = (f"{len(others)} of {len(records)} requests not measured (e.g. {first.id}: "
                  f"{first.error or first.state})")
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "source": source, "engine": engine, "model": model, "hardware": hardware,
        "config": config,
        "complete": reason is None, "incomplete_reason": reason,
        "requests": [measured_request(r) for r in done],
        "unmeasured_requests": [unmeasured_request(r) for r in others],
        "config_sources": config_sources,
        "server": server,
        "observe": {**observe, "send_lag_s": send_lag(records)},
    }


def write_atomically(doc: dict[str, Any], path: str | Path) -> Path:
    """Write ``doc`` as JSON to ``path`` through a temporary file and a rename."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()
    return p
