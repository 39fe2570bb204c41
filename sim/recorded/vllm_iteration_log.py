"""vLLM's iteration log (``--enable-logging-iteration-details``): what each engine step computed.

With that flag vLLM 0.32 logs one line per step (vllm/v1/metrics/loggers.py, ``_log_iteration_details``)::

    ... INFO 12-01 11:02:42 [loggers.py:199] Engine 000: Iteration(5): 1 context requests, 96 context tokens,
    3 generation requests, 3 generation tokens, iteration elapsed time: 8.46 ms, CPU KV cache usage: 0.2%

(context = prefill, including later chunks of a chunked prefill; generation = decode). The elapsed
time is measured inside the engine core around the wait for the model's output
(vllm/v1/engine/core.py, ``capture_iteration_details``): with a multiprocess executor (vLLM's
default for ``vllm serve``) that is the step's model time; scheduling and output processing fall
between steps. The line's own timestamp has one-second resolution, so it places a step in a run
but does not time it.

This module only parses; :mod:`sim.recorded.run_steps` joins the iterations with a request-level
run's token times into a step log.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from pathlib import Path

from sim.errors import CbsimError

_LINE = re.compile(
    r"(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d).*?Engine (?P<engine>\d+): Iteration\((?P<index>\d+)\): "
    r"(?P<ctx_reqs>\d+) context requests, (?P<ctx_tokens>\d+) context tokens, "
    r"(?P<gen_reqs>\d+) generation requests, (?P<gen_tokens>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[\d.]+) ms(?P<dummy> \(dummy\))?")


@dataclass(frozen=True, slots=True)
class Iteration:
    engine: int
    index: int
    stamp_unix_s: float  # the log line's time, to the second (local time of the server)
    ctx_requests: int
    ctx_tokens: int
    gen_requests: int
    gen_tokens: int
    elapsed_s: float


def parse_iteration_log(text: str, year: int | None = None) -> list[Iteration]:
    """Every non-dummy iteration line of a vLLM log, in log order. The log's timestamps have no year:
    ``year`` (default: this year) and the local time zone complete them."""
    year = year or _dt.datetime.now().year
    out = []
    for line in text.splitlines():
        m = _LINE.search(line)
        if m is None or m["dummy"]:
            continue
        stamp = _dt.datetime.strptime(f"{year}-{m['stamp']}", "%Y-%m-%d %H:%M:%S").timestamp()
        out.append(Iteration(int(m["engine"]), int(m["index"]), stamp, int(m["ctx_reqs"]), int(m["ctx_tokens"]),
                             int(m["gen_reqs"]), int(m["gen_tokens"]), float(m["ms"]) / 1e3))
    return out


def read_iteration_log(path: str | Path) -> list[Iteration]:
    p = Path(path)
    if not p.is_file():
        raise CbsimError(f"--iteration-log: {str(path)!r} is not a file; give the log of the vLLM server "
                         f"started with --enable-logging-iteration-details")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CbsimError(f"--iteration-log: cannot read {p}: {exc}") from None
    iterations = parse_iteration_log(text)
    if not iterations:
        raise CbsimError(f"--iteration-log: {p} has no 'Iteration(N): ... context requests ...' lines; start "
                         f"the server with --enable-logging-iteration-details (vLLM >= 0.11)")
    engines = {it.engine for it in iterations}
    if len(engines) > 1:
        raise CbsimError(f"--iteration-log: {p} logs {len(engines)} engines (data parallel); cbsim fits one "
                         f"engine's steps: keep only one engine's lines")
    return iterations
