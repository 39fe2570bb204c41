"""Workloads: the list of requests a run serves, generated from a scenario, reproducibly.

``build_workload(scenario)`` returns :class:`RequestSpec` objects sorted by arrival and named
``r000000``, ``r000001``, ... Three sources, in this order of precedence:

1. ``workload.requests``: written out one by one (teaching and tests); exact lengths.
2. ``workload.trace``: a trace file (``sim.workload.traces``). With ``arrival.process: trace`` the rows are
   replayed in order with their own timestamps and lengths (and Mooncake's prefix ids). With a
   synthetic arrival process, lengths with ``dist: trace`` are drawn from the trace's empirical
   distribution (whole rows are resampled with replacement, so prompt and output lengths keep
   their correlation; resampled prompts get fresh content, so duplicates do not fake cache hits).
3. Synthetic: arrivals and lengths from the distributions below.

Reproducibility: every random quantity has its own stream, ``numpy.random.default_rng([seed,
STREAM])``, so changing one setting leaves the others' draws alone. In particular arrivals are
drawn as *unit-rate* gaps and divided by ``arrival.rate``: two scenarios that differ only in
the rate have the same arrival pattern, time-scaled, and the same request lengths, which is what
a rate sweep needs. The first request arrives at t = 0 (as ``vllm bench serve`` sends it).

Arrival processes (gaps between consecutive requests, mean 1/rate):
- ``poisson``: exponential gaps.
- ``gamma``: gamma gaps with coefficient of variation ``cv``: shape k = 1/cv², scale 1/(rate·k);
  cv = 1 is Poisson, cv > 1 is burstier.
- ``constant``: every gap is exactly 1/rate.
- ``closed``: no arrival times here (``arrival_s`` is NaN): ``concurrency`` clients send the
  requests in this order during the run, each when its previous one ended
  (:mod:`sim.workload.closed_loop`, :mod:`sim.clients`); a trace's rows are taken in order,
  with their prefix ids.

Lengths (``prompt_tokens``, ``output_tokens``), integers >= 1:
- ``fixed`` ``value``; ``uniform`` ``min``..``max`` inclusive;
- ``lognormal`` by ``mean`` and ``p99``: with z = Φ⁻¹(0.99) = 2.3263, ``p99 = exp(μ + zσ)`` and
  ``mean = exp(μ + σ²/2)``, so ``ln(p99/mean) = zσ − σ²/2`` and σ = z − √(z² − 2·ln(p99/mean))
  (the root below z; a solution needs mean < p99 <= e^(z²/2)·mean ≈ 14.97·mean), then
  μ = ln(mean) − σ²/2. Draws are rounded to the nearest integer.
- ``azure-conv`` (the default): the Azure LLM conversation trace's own prompt or output lengths,
  drawn through its quantiles (:mod:`sim.workload.azure_conv`: a lognormal cannot match that
  trace's bimodal outputs, mean 211 / median 129 / p99 601);
- ``trace``: the trace's column (see above).
Synthetic prompts are kept servable: a prompt is clipped to ``max_model_len − 1`` tokens, and the
run counts the clipped ones (``workload_cuts``). Output lengths are where the model would stop (its
EOS) and are never clipped: the engine stops a request at ``max_tokens`` or at ``max_model_len``, as
vLLM does (finish reason "length"), and the summary counts those it cut (``requests_cut``). Trace
and written-out lengths are never clipped: an over-long prompt is rejected by the engine, as vLLM
does.

``max_tokens`` (the client's limit, DESIGN.md "Words"): ``workload.max_tokens`` when set; else a
trace's own client limit (a plain CSV's ``max_tokens`` column) or a written-out request's; else what
the engine fills in when the client sends none, ``max_model_len − prompt`` (vLLM's OpenAI server),
for traces and synthetic lengths alike. Never the output length: no client knows it, and a policy
that reserves or estimates by ``max_tokens`` (TGI, Orca, SGLang) would read the future. (Written-out
requests without one keep ``output_tokens``: they are lessons written with their limit.)

Shared prefixes (``workload.prefix``): each synthetic request draws one of ``num_groups`` groups
uniformly; its prompt is the group's first ``prefix_len`` tokens followed by its own tokens,
``prompt_runs = ((("group", g), prefix_len), (("req", id), rest))``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.errors import ScenarioError
from sim.workload import spec_columns
from sim.workload.draws import OUTPUT, PREFIX, PROMPT, ROWS, rng, sample_lengths, synthetic_arrivals
from sim.workload.request_spec import RequestSpec

if TYPE_CHECKING:
    from sim.scenario.schema import Scenario

PROMPT_CLIPPED = "prompt clipped to engine.max_model_len - 1"  # a RequestSpec's cut


def build_workload(scenario: Scenario) -> list[RequestSpec]:
    """The scenario's requests, sorted by arrival (see the module docstring)."""
    w = scenario.workload
    if w.requests is not None:
        return _written_out(scenario)
    if w.sessions is not None:
        from sim.workload.sessions import build_sessions

        return build_sessions(scenario)
    max_len = scenario.engine.max_model_len
    trace = None
    if w.trace is not None:
        from sim.workload.traces import load_trace

        window = tuple(w.trace.window_s) if w.trace.window_s is not None else None
        path = scenario.resolve_path(w.trace.path)
        if not path.exists():
            from pathlib import Path

            where = f"in {Path.cwd()}"
            beside = Path(scenario.source).resolve().parent if scenario.source is not None else None
            if beside is not None and beside != Path.cwd().resolve():
                where += f" and beside the scenario, in {beside}"
            raise ScenarioError(f"workload.trace.path: trace file {w.trace.path!r} does not exist (looked {where})")
        trace = load_trace(path, w.trace.format).select(window, w.trace.rate_scale)

    replay = w.arrival.process == "trace"
    closed = w.arrival.process == "closed"
    if closed:  # sent by clients during the run (sim.clients): no arrival time yet; a trace in order
        n = w.num_requests if w.num_requests is not None else len(trace)
        if trace is not None and n > len(trace):
            raise ScenarioError(f"workload.num_requests is {n} but the trace {w.trace.path} has only "
                                f"{len(trace)} requests in its window; lower num_requests or drop it")
        arrivals = np.full(n, np.nan)
        rows = np.arange(n) if trace is not None else None
    elif replay:
        n = len(trace) if w.num_requests is None else w.num_requests
        if n > len(trace):
            raise ScenarioError(f"workload.num_requests is {n} but the trace {w.trace.path} has only "
                                f"{len(trace)} requests in its window; lower num_requests or drop it")
        arrivals = trace.arrival_s[:n]
        rows = np.arange(n)
    else:
        n = w.num_requests if w.num_requests is not None else len(trace)
        arrivals = synthetic_arrivals(w.arrival, n, scenario.seed)
        rows = None
        if trace is not None and "trace" in (w.prompt_tokens.dist, w.output_tokens.dist):
            rows = rng(scenario.seed, ROWS).integers(0, len(trace), size=n)

    clipped = np.zeros(n, dtype=bool)
    if w.prompt_tokens.dist == "trace":
        prompt = trace.prompt_tokens[rows]
    else:
        drawn = np.maximum(sample_lengths(w.prompt_tokens, n, rng(scenario.seed, PROMPT)), 1)
        prompt = np.minimum(drawn, max(max_len - 1, 1))
        clipped = drawn > prompt
    if w.output_tokens.dist == "trace":
        output = trace.output_tokens[rows]
    else:
        output = np.maximum(sample_lengths(w.output_tokens, n, rng(scenario.seed, OUTPUT), "output"), 1)

    from sim.workload.traces import client_max_tokens, engine_max_tokens

    if w.max_tokens is not None:
        max_tokens = np.full(n, w.max_tokens, dtype=np.int64)
    elif trace is not None and rows is not None:  # the rows' own client limits
        max_tokens = client_max_tokens(trace.max_tokens[rows], prompt, max_len)
    else:
        max_tokens = engine_max_tokens(prompt, max_len)

    trace_runs = None
    if (replay or closed) and w.prompt_tokens.dist == "trace" and trace.prompt_runs is not None:
        if w.prefix is not None:
            raise ScenarioError(f"workload.prefix cannot be combined with the trace {w.trace.path}: its "
                                f"hash_ids already say which prompts share prefixes")
        trace_runs = trace.prompt_runs
    sessions = None  # a csv trace's session_id and turn: each row's history runs (sim.workload.sessions)
    if (replay or closed) and trace is not None and trace.session is not None:
        if w.prefix is not None:
            raise ScenarioError(f"workload.prefix cannot be combined with the trace {w.trace.path}: its sessions "
                                f"already say which prompts share prefixes")
        from sim.workload.sessions import trace_sessions

        sess_l, turn_l = trace.session[rows].tolist(), trace.turn[rows].tolist()
        sessions = trace_sessions(sess_l, turn_l, prompt.tolist(), output.tolist())
    groups = None
    if w.prefix is not None:
        groups = rng(scenario.seed, PREFIX).integers(0, w.prefix.num_groups, size=n).tolist()

    if closed:
        order = np.arange(n)  # sent in this order, whichever client is free first
    else:
        arrivals = _fit_to_clock(scenario, np.asarray(arrivals, dtype=float), replay)
        order = np.argsort(arrivals, kind="stable")
    if sessions is None and trace_runs is None and groups is None and n >= spec_columns.COLUMNS_FROM:
        # every request's content its own: kept as columns, each spec made when asked for
        return spec_columns.SpecColumns(arrivals[order], prompt[order], output[order], max_tokens[order],
                                        clipped[order], PROMPT_CLIPPED)
    width = max(6, len(str(max(n - 1, 0))))
    specs = []
    arr_l, c_l = arrivals[order].tolist(), clipped[order].tolist()
    # one int object per distinct length (not one per request: 28 bytes each, three per request,
    # kept for the whole run; lengths take a few thousand values at most)
    p_l, o_l, m_l = (_one_object_per_value(a[order].tolist()) for a in (prompt, output, max_tokens))
    for i, src in enumerate(order.tolist()):
        rid = f"r{i:0{width}d}"
        p = p_l[i]
        if sessions is not None:
            runs, out_key = sessions[src]
            specs.append(RequestSpec(rid, float(arr_l[i]), p, o_l[i], m_l[i], 0, runs, out_key,
                                     session=sess_l[src], turn=turn_l[src]))
            continue
        if trace_runs is not None:
            runs = trace_runs[src]
        elif groups is not None:
            shared = min(w.prefix.prefix_len, p)
            runs = ((("group", groups[src]), shared),)
            if p > shared:
                runs += ((("req", rid), p - shared),)
        else:
            runs = None  # the request's own content: Request's default (("req", id), prompt), kept implicit
        specs.append(RequestSpec(rid, float(arr_l[i]), p, o_l[i], m_l[i], 0, runs,
                                 cut=PROMPT_CLIPPED if c_l[i] else ""))
    return specs


def _one_object_per_value(values: list[int]) -> list[int]:
    same: dict[int, int] = {}
    return [same.setdefault(v, v) for v in values]


def _fit_to_clock(scenario: Scenario, arrivals: np.ndarray, replay: bool) -> np.ndarray:
    """The arrivals, checked against the float clock's resolution (:mod:`sim.workload.clock`)."""
    from sim.workload.clock import fit_to_clock

    w = scenario.workload
    if replay:
        scale = f" and workload.trace.rate_scale {w.trace.rate_scale:g}" if w.trace.rate_scale != 1 else ""
        return fit_to_clock(arrivals, f"workload.trace.path ({w.trace.path})",
                            f"its arrival_s must be seconds (are they milliseconds or nanoseconds?){scale}")
    return fit_to_clock(arrivals, "workload.arrival.rate",
                        f"raise workload.arrival.rate ({w.arrival.rate:g} req/s spreads "
                        f"{len(arrivals)} requests over that span)")


def _written_out(scenario: Scenario) -> list[RequestSpec]:
    w = scenario.workload
    width = max(6, len(str(len(w.requests) - 1)))
    specs = []
    for i, r in enumerate(w.requests):
        rid = f"r{i:0{width}d}"
        max_tokens = r.max_tokens if r.max_tokens is not None else w.max_tokens
        if max_tokens is None:
            max_tokens = r.output_tokens
        elif max_tokens < r.output_tokens:
            raise ScenarioError(f"workload.requests.{i}: output_tokens ({r.output_tokens}) exceeds "
                                f"workload.max_tokens ({max_tokens}); set the request's own max_tokens")
        specs.append(RequestSpec(rid, float(r.arrival_s), r.prompt_tokens, r.output_tokens, max_tokens,
                                 r.priority))  # content of its own: Request's default run
    specs.sort(key=lambda s: s.arrival_s)  # stable: ties keep the listed order
    from dataclasses import replace

    from sim.workload.clock import fit_to_clock

    arrivals = np.array([s.arrival_s for s in specs])
    fitted = fit_to_clock(arrivals, "workload.requests.*.arrival_s", "write arrival_s in seconds from the start")
    if fitted is not arrivals:
        specs = [replace(s, arrival_s=float(t)) for s, t in zip(specs, fitted.tolist())]
    return specs


def workload_stats(specs: list[RequestSpec]) -> dict[str, Any]:
    """Summary statistics of a workload, for ``cbsim run --dry-run``."""
    n = len(specs)
    if n == 0:
        return {"num_requests": 0}
    arrivals = np.array([s.arrival_s for s in specs])
    prompt = np.array([s.prompt_tokens for s in specs])
    output = np.array([s.output_tokens for s in specs])
    max_tokens = np.array([s.max_tokens for s in specs])
    timed = not np.isnan(arrivals).any()  # closed loop: sent during the run, no times yet
    duration = float(arrivals[-1] - arrivals[0]) if timed else math.nan
    gaps = np.diff(arrivals)
    stats: dict[str, Any] = {
        "num_requests": n,
        "duration_s": round(duration, 3) if timed else None,
        # one over the mean gap: (n - 1) gaps span the duration
        "mean_rate_rps": round((n - 1) / duration, 4) if timed and duration > 0 else None,
        "interarrival_cv": (round(float(gaps.std() / gaps.mean()), 3)
                            if timed and n > 2 and gaps.mean() > 0 else None),
        "prompt_tokens": _dist(prompt),
        "output_tokens": _dist(output),
        "max_tokens_mean": round(float(max_tokens.mean()), 1),
        "total_prompt_tokens": int(prompt.sum()),
        "total_output_tokens": int(output.sum()),
    }
    holders = Counter(key for s in specs for key, _ in (s.prompt_runs or ()))
    shared = sum(length for s in specs for key, length in (s.prompt_runs or ()) if holders[key] > 1)
    stats["shared_prompt_fraction"] = round(shared / max(int(prompt.sum()), 1), 4)
    return stats


def _dist(values: np.ndarray) -> dict[str, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": round(float(values.mean()), 1), "p50": round(float(p50), 1), "p90": round(float(p90), 1),
            "p99": round(float(p99), 1), "max": int(values.max())}
