"""Trace readers: real request logs replayed as workloads.

Three formats, each read into one :class:`Trace` (columns as numpy arrays) and from there into
:class:`sim.workload.request_spec.RequestSpec` lists. A trace's ``output_tokens`` is what was
generated, which no client knew in advance, so it never becomes ``max_tokens``: a request's
``max_tokens`` is the client's limit where the trace has one (the plain CSV's ``max_tokens``
column), else what the engine fills in when the client sends none (vLLM: ``max_model_len − prompt``,
:func:`engine_max_tokens`). Otherwise a reservation policy (TGI, Orca) or SGLang's admission
estimate would read the future from it.

- ``azure``: the Azure LLM inference trace CSV (Patel et al., Splitwise, ISCA'24), header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``, timestamps like ``2023-11-16 18:15:46.6805900``.
  Arrival = seconds since the earliest row.
- ``mooncake``: the Mooncake trace JSONL (Qin et al., FAST'25), one object per line with
  ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``: one id per 512-token
  block of the prompt, equal ids meaning equal content. Arrival = timestamp / 1000. Each id
  becomes one prompt run ``(("mc", id), 512)`` (the last run holds the remainder), so two
  prompts agree token by token exactly where their ids agree, and the KV blocks they cover get
  equal prefix-cache hashes at any block size.
- ``csv``: a plain CSV with header ``arrival_s,prompt_tokens,output_tokens`` and optionally
  ``max_tokens`` (the client's limit, >= output_tokens; default: none sent) and ``priority`` (default 0), and
  ``session_id`` (any text) with ``turn`` (an integer >= 0): rows of one session replay as its
  turns (:mod:`sim.workload.sessions`, docs/sessions.md).

Rows are sorted by arrival (stable) and numbered ``r000000``, ``r000001``, ... in that order.
``window_s: [start, end)`` keeps the requests arriving in that span of the trace's own clock and
re-bases arrivals to ``start``; ``rate_scale`` then divides arrival times (2.0 = twice as many
requests per second), so the window is always given in the original trace's seconds.

Bad input raises :class:`sim.errors.TraceError` naming the file, the line and what was expected.
Parsed files are cached by (path, size, modification time): a sweep re-reads nothing.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.errors import TraceError
from sim.workload.request_spec import RequestSpec

TRACE_FORMATS = ("azure", "mooncake", "csv")
MOONCAKE_BLOCK = 512  # tokens per hash id in the Mooncake traces
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
CSV_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
CSV_OPTIONAL = ("max_tokens", "priority", "session_id", "turn")


@dataclass(frozen=True)
class Trace:
    """A trace's requests as columns, sorted by arrival."""

    path: str
    format: str
    arrival_s: np.ndarray  # float64 seconds
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    max_tokens: np.ndarray  # int64: the client's limit (>= output_tokens), 0 where it sent none
    priority: np.ndarray  # int64
    prompt_runs: tuple | None = None  # per row: tuple of (key, length) runs, or None
    session: np.ndarray | None = None  # csv with session_id and turn: int64 session (in order of appearance)
    turn: np.ndarray | None = None  # ... and turn (0-based order within the session); None: no sessions

    def __len__(self) -> int:
        return len(self.arrival_s)

    def select(self, window_s: tuple[float, float] | None = None, rate_scale: float = 1.0) -> Trace:
        """The requests of ``[start, end)``, re-based to ``start``, with arrivals / ``rate_scale``."""
        if rate_scale <= 0:
            raise TraceError(f"{self.path}: rate_scale must be > 0, got {rate_scale}")
        arrival = self.arrival_s
        keep = slice(None)
        if window_s is not None:
            start, end = window_s
            if not start < end:
                raise TraceError(f"{self.path}: window_s [{start}, {end}) is empty: start must be < end")
            lo, hi = np.searchsorted(arrival, [start, end], side="left")
            if lo == hi:
                span = f"{arrival[0]:.3f} to {arrival[-1]:.3f} s" if len(arrival) else "nothing"
                raise TraceError(f"{self.path}: window_s [{start}, {end}) selects no request "
                                 f"(the trace's arrivals span {span})")
            keep = slice(int(lo), int(hi))
            arrival = arrival[keep] - start
        return replace(
            self,
            arrival_s=arrival / rate_scale,
            prompt_tokens=self.prompt_tokens[keep],
            output_tokens=self.output_tokens[keep],
            max_tokens=self.max_tokens[keep],
            priority=self.priority[keep],
            prompt_runs=None if self.prompt_runs is None else self.prompt_runs[keep],
            session=None if self.session is None else self.session[keep],
            turn=None if self.turn is None else self.turn[keep],
        )

    def to_specs(self, max_model_len: int) -> list[RequestSpec]:
        """The requests; ``max_tokens`` where the trace has none is the engine's fill-in at
        ``max_model_len`` (:func:`engine_max_tokens`)."""
        width = max(6, len(str(max(len(self) - 1, 0))))
        runs = self.prompt_runs
        specs = []
        limits = client_max_tokens(self.max_tokens, self.prompt_tokens, max_model_len)
        for i, (t, p, o, m, pr) in enumerate(zip(self.arrival_s.tolist(), self.prompt_tokens.tolist(),
                                                 self.output_tokens.tolist(), limits.tolist(),
                                                 self.priority.tolist())):
            rid = f"r{i:0{width}d}"
            # no hash ids: content of its own, Request's default run ("req", id), not stored per request
            specs.append(RequestSpec(rid, t, p, o, m, pr, runs[i] if runs is not None else None))
        return specs


def engine_max_tokens(prompt_tokens, max_model_len: int):
    """What vLLM's OpenAI server sets ``max_tokens`` to when the client sends none: the room left
    in the context, ``max_model_len − prompt`` (``get_max_tokens``, vllm/entrypoints/utils.py), at
    least 1 (a prompt that fills the context is rejected anyway)."""
    return np.maximum(max_model_len - np.asarray(prompt_tokens, dtype=np.int64), 1)


def client_max_tokens(trace_max_tokens, prompt_tokens, max_model_len: int):
    """Each request's ``max_tokens``: the trace's client limit where it has one (> 0), else the
    engine's fill-in (:func:`engine_max_tokens`)."""
    given = np.asarray(trace_max_tokens, dtype=np.int64)
    return np.where(given > 0, given, engine_max_tokens(prompt_tokens, max_model_len))


def read_trace(path: str | Path, format: str | None = None, rate_scale: float = 1.0,
               window_s: tuple[float, float] | None = None, max_model_len: int = 8192) -> list[RequestSpec]:
    """Read a trace file into requests (``format`` None: detected from the file; ``max_model_len``
    sizes the engine's ``max_tokens`` fill-in)."""
    return load_trace(path, format).select(window_s, rate_scale).to_specs(max_model_len)


def load_trace(path: str | Path, format: str | None = None) -> Trace:
    """The whole trace as columns (cached; the arrays are read-only)."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file {str(path)!r} does not exist" if not p.exists()
                         else f"trace path {str(path)!r} is not a file")
    fmt = format or detect_format(p)
    if fmt not in TRACE_FORMATS:
        raise TraceError(f"{path}: unknown trace format {fmt!r}; formats: {', '.join(TRACE_FORMATS)}")
    st = p.stat()
    return _load_cached(str(p.resolve()), st.st_size, st.st_mtime_ns, fmt, str(path))


def detect_format(path: Path) -> str:
    """``mooncake`` for JSON lines, ``azure`` for a CSV with a TIMESTAMP column, else ``csv``."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline(4096).strip().removeprefix("\ufeff")
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror or exc}") from None
    if not first:
        raise TraceError(f"{path}: the trace is empty (line 1 is blank); expected a header or a JSON object")
    if first.startswith("{"):
        return "mooncake"
    return "azure" if "TIMESTAMP" in first.split(",") else "csv"


@lru_cache(maxsize=16)
def _load_cached(resolved: str, size: int, mtime_ns: int, fmt: str, shown: str) -> Trace:
    reader = {"azure": _read_azure, "mooncake": _read_mooncake, "csv": _read_csv}[fmt]
    try:
        cols = reader(shown)
    except UnicodeDecodeError as exc:
        raise TraceError(f"{shown}: not a UTF-8 text file (undecodable byte at offset {exc.start}); "
                         f"expected a {fmt} trace") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace file {shown}: {exc.strerror or exc}") from None

    if not cols["arrival_s"]:
        raise TraceError(f"{shown}: the trace has no requests")
    arrival = np.asarray(cols["arrival_s"], dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    arrays = {}
    for key in ("prompt_tokens", "output_tokens", "max_tokens", "priority"):
        arrays[key] = np.asarray(cols[key], dtype=np.int64)[order]
    arrays["arrival_s"] = arrival[order]
    for a in arrays.values():
        a.setflags(write=False)
    runs = cols.get("prompt_runs")
    if runs is not None:
        runs = tuple(runs[i] for i in order.tolist())
    for key in ("session", "turn"):
        if cols.get(key) is not None:
            arrays[key] = np.asarray(cols[key], dtype=np.int64)[order]
            arrays[key].setflags(write=False)
    return Trace(shown, fmt, prompt_runs=runs, **arrays)


# --- the three formats -------------------------------------------------------------------------
MAX_TOKENS = 10**9  # a prompt or output longer than this is a corrupt row, not a request


def _rows(path: str, reader):
    """(line number, row) of a csv reader; a row the csv module cannot parse (a NUL byte, a
    field over its size limit) is a TraceError naming the line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: not readable as CSV ({exc})") from None
        yield reader.line_num, row


def _header(path: str, reader, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, int]:
    try:
        header = next(reader)
    except csv.Error as exc:
        raise TraceError(f"{path}:1: not readable as CSV ({exc})") from None
    except StopIteration:
        raise TraceError(f"{path}: the trace is empty; expected a header line "
                         f"{','.join(required)}") from None
    names = [h.strip() for h in header]
    if names:
        names[0] = names[0].removeprefix("\ufeff")  # a byte-order mark written by spreadsheet tools
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise TraceError(f"{path}:1: column {dup!r} appears twice in the header")
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(f"{path}:1: expected a header with columns {','.join(required)}, "
                         f"got {','.join(names)!r} (missing {', '.join(missing)})")
    unknown = [c for c in names if c not in required and c not in optional]
    if unknown and optional:
        raise TraceError(f"{path}:1: unknown column {unknown[0]!r}; columns are "
                         f"{', '.join(required + optional)}")
    return {n: i for i, n in enumerate(names)}


def _int(path: str, line: int, column: str, text: str, minimum: int | None = 1) -> int:
    what = "an integer" if minimum is None else f"an integer >= {minimum}"
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{line}: expected {column} to be {what}, got {_short(text)}") from None
    if minimum is not None and value < minimum:
        raise TraceError(f"{path}:{line}: expected {column} to be an integer >= {minimum}, got {value}")
    if abs(value) > MAX_TOKENS:
        raise TraceError(f"{path}:{line}: {column} {value} is implausibly large (more than {MAX_TOKENS:,}); "
                         f"is the column right?")
    return value


def _row(path: str, line: int, row: list[str], width: int) -> list[str]:
    if len(row) != width:
        raise TraceError(f"{path}:{line}: expected {width} comma-separated fields, got {len(row)}: "
                         f"{_short(','.join(row))}")
    return row


def _read_azure(path: str) -> dict:
    arrival, prompt, output = [], [], []
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        cols = _header(path, reader, AZURE_COLUMNS)
        it, ic, ig = (cols[c] for c in AZURE_COLUMNS)
        width = len(cols)
        first = None
        for line, row in _rows(path, reader):
            if not row:
                continue
            _row(path, line, row, width)
            try:
                stamp = datetime.fromisoformat(row[it])
            except ValueError:
                raise TraceError(f"{path}:{line}: expected TIMESTAMP like '2023-11-16 18:15:46.6805900', "
                                 f"got {_short(row[it])}") from None
            if stamp.tzinfo is not None:  # with an offset: compare in UTC (naive stamps are taken as UTC)
                stamp = stamp.astimezone(UTC).replace(tzinfo=None)
            first = stamp if first is None else first
            arrival.append((stamp - first).total_seconds())
            prompt.append(_int(path, line, "ContextTokens", row[ic]))
            output.append(_int(path, line, "GeneratedTokens", row[ig]))
    if arrival:
        origin = min(arrival)  # the earliest row, should the file not be sorted
        arrival = [t - origin for t in arrival]
    return {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output, "max_tokens": [0] * len(output),
            "priority": [0] * len(output)}


def _read_mooncake(path: str) -> dict:
    arrival, prompt, output, runs = [], [], [], []
    with open(path, encoding="utf-8-sig") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{line}: expected one JSON object per line ({exc.msg} at "
                                 f"column {exc.pos + 1})") from None
            except (ValueError, RecursionError) as exc:  # a 5000-digit number, absurd nesting
                raise TraceError(f"{path}:{line}: expected one JSON object per line "
                                 f"({type(exc).__name__}: {str(exc)[:80]})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{path}:{line}: expected a JSON object, got {type(obj).__name__}")
            missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
            if missing:
                raise TraceError(f"{path}:{line}: missing key(s) {', '.join(missing)}; expected "
                                 f"timestamp (ms), input_length, output_length, hash_ids")
            ts = obj["timestamp"]
            huge = isinstance(ts, int) and abs(ts) > 2**53  # past what a float holds: not a time in ms
            if (huge or isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts)
                    or ts < 0):
                raise TraceError(f"{path}:{line}: expected timestamp to be milliseconds >= 0, got {_short(ts)}")
            n_in = _json_int(path, line, "input_length", obj["input_length"])
            n_out = _json_int(path, line, "output_length", obj["output_length"])
            ids = obj["hash_ids"]
            blocks = -(-n_in // MOONCAKE_BLOCK)
            if not isinstance(ids, list) or len(ids) != blocks:
                got = f"{len(ids)} ids" if isinstance(ids, list) else _short(ids)
                raise TraceError(f"{path}:{line}: expected hash_ids to be a list of {blocks} ids (one per "
                                 f"{MOONCAKE_BLOCK}-token block of input_length {n_in}), got {got}")
            bad = next((h for h in ids if isinstance(h, bool) or not isinstance(h, int | str)), None)
            if bad is not None:
                raise TraceError(f"{path}:{line}: expected hash_ids to hold integers (or strings), "
                                 f"got {_short(bad)}")
            last = n_in - MOONCAKE_BLOCK * (blocks - 1)
            runs.append(tuple((("mc", h), MOONCAKE_BLOCK if j < blocks - 1 else last)
                              for j, h in enumerate(ids)))
            arrival.append(ts / 1000.0)
            prompt.append(n_in)
            output.append(n_out)
    return {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output, "max_tokens": [0] * len(output),
            "priority": [0] * len(output), "prompt_runs": runs}


def _json_int(path: str, line: int, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TraceError(f"{path}:{line}: expected {key} to be an integer >= 1, got {_short(value)}")
    if value > MAX_TOKENS:
        raise TraceError(f"{path}:{line}: {key} {value} is implausibly large (more than {MAX_TOKENS:,})")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _read_csv(path: str) -> dict:
    arrival, prompt, output, max_tokens, priority, session, turn = [], [], [], [], [], [], []
    sessions: dict[str, int] = {}  # session_id text -> session number, in order of appearance
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        cols = _header(path, reader, CSV_COLUMNS, CSV_OPTIONAL)
        if ("session_id" in cols) != ("turn" in cols):
            raise TraceError(f"{path}:1: sessions need both columns session_id and turn, got only "
                             f"{'session_id' if 'session_id' in cols else 'turn'}")
        width = len(cols)
        for line, row in _rows(path, reader):
            if not row:
                continue
            _row(path, line, row, width)
            text = row[cols["arrival_s"]]
            try:
                t = float(text)
            except ValueError:
                t = math.nan
            if not math.isfinite(t) or t < 0:
                raise TraceError(f"{path}:{line}: expected arrival_s to be seconds >= 0, got {_short(text)}")
            p = _int(path, line, "prompt_tokens", row[cols["prompt_tokens"]])
            o = _int(path, line, "output_tokens", row[cols["output_tokens"]])
            m = 0  # the client sent none
            if "max_tokens" in cols:
                m = _int(path, line, "max_tokens", row[cols["max_tokens"]])
                if m < o:
                    raise TraceError(f"{path}:{line}: expected max_tokens >= output_tokens ({o}), got {m}")
            pr = _int(path, line, "priority", row[cols["priority"]], minimum=None) if "priority" in cols else 0
            arrival.append(t)
            prompt.append(p)
            output.append(o)
            max_tokens.append(m)
            priority.append(pr)
            if "session_id" in cols:
                sid = row[cols["session_id"]].strip()
                if not sid:
                    raise TraceError(f"{path}:{line}: expected a session_id, got an empty field")
                session.append(sessions.setdefault(sid, len(sessions)))
                turn.append(_int(path, line, "turn", row[cols["turn"]], minimum=0))
    out = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output, "max_tokens": max_tokens,
           "priority": priority}
    if "session_id" in cols:
        out["session"], out["turn"] = session, turn
    return out
