"""Engine steps rebuilt from a request-level run, so ``cbsim calibrate --from-run`` can fit a table
with the step-log fitter (:func:`sim.latency.fit.fit_steplog`) instead of a second one.

Two sources of steps, the second better:

- **Token times alone** (:func:`steps_from_token_times`). A streaming client sees every token when
  its step ends, and a step emits at most one token per running request: sorting all tokens by
  arrival and starting a new step whenever a request repeats, or the stream pauses for more than
  half the median inter-token gap, recovers the steps that emitted tokens. A request's first token
  ends its prefill (``prompt_tokens`` new tokens on no context), a later token ``k`` is a decode on
  ``prompt + k − 1`` tokens of context. A step lasts from the previous step's end (or from the
  arrival of its newest prefill, after an idle spell) to its first token: model time and the
  engine's time between steps in one, so the fitted ``step_gap`` is 0. What it cannot see:
  prefill chunks that ended in a step emitting no token for that request (chunked prefill of long
  prompts, or of prompts that did not fit the token budget left) and recomputation after
  preemption; steps whose rebuilt composition exceeds the token budget are left out.
- **vLLM's iteration log** (:func:`steps_from_iteration_log`, :mod:`sim.recorded.vllm_iteration_log`):
  every step with its exact prefill and decode token counts and its model time. The run's token
  times say which requests they were: the ``g``-th decode token of the run (in arrival order)
  belongs to the step holding the ``g``-th generation token of the log, and prefill chunks consume
  the prompts in arrival order (vLLM V1 is first-come first-served), giving every entry's context.
  Each busy stretch (the engine never idle in between) lasts what the client saw, from its first
  step's start (its first token minus the model time before it) to its last step's first token;
  that span is shared among its steps in proportion to their model times (``elapsed``), so the
  gaps between steps are inside the steps (``step_gap`` 0) and a client that read a burst of tokens
  late moves no step's share. (The log's elapsed times are not used as step times directly: on
  vLLM's CPU build they did not add up to the wall time the client saw.)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sim.errors import CbsimError
from sim.recorded.request_run import RequestRun
from sim.recorded.steplog import EngineConfig, LoggedRequest, LoggedStep, StepLog
from sim.recorded.vllm_iteration_log import Iteration


def _engine_config(run: RequestRun) -> EngineConfig:
    c = run.config
    if c.num_gpu_blocks is None:
        raise CbsimError(f"{run.path}: config.num_gpu_blocks is unknown; a table's KV capacity needs it (observe a "
                         f"server that exports /metrics, or write the server's usable blocks into the run)")
    return EngineConfig(block_size=c.block_size, num_gpu_blocks=c.num_gpu_blocks,
                        max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs,
                        max_model_len=c.max_model_len, scheduling_policy=c.scheduling_policy,
                        enable_prefix_caching=c.enable_prefix_caching,
                        enable_chunked_prefill=c.enable_chunked_prefill, tensor_parallel=c.tensor_parallel)


def _requests(run: RequestRun) -> list[LoggedRequest]:
    missing = [r.id for r in run.requests if not r.token_times_s]
    if missing:
        raise CbsimError(f"{run.path}: requests without token_times_s (e.g. {missing[0]}); fitting steps needs every "
                         f"token's time (`cbsim observe` records them)")
    return [LoggedRequest(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.token_times_s) for r in run.requests]


def _step_log(run: RequestRun, steps: list[LoggedStep], fmt: str) -> StepLog:
    """The step log, with each request's token times the ends of the steps that emitted them (the
    step-log convention: the fit's idle/busy test then agrees with the steps, not with a late client)."""
    from sim.hardware.models import get_model

    model = get_model(run.model).to_dict()
    device = "cpu" if run.gpu == "cpu" else (run.gpu or "unknown")
    prompt = {r.id: r.prompt_tokens for r in run.requests}
    emitted: dict[str, list[float]] = {r.id: [] for r in run.requests}
    for step in steps:
        for rid, n, c in step.batch:
            if rid in emitted and c + n >= prompt[rid]:  # a decode, or the chunk that completes the prompt
                emitted[rid].append(step.end_s)
    requests = [LoggedRequest(r.id, r.arrival_s, r.prompt_tokens, r.max_tokens,
                              tuple(emitted[r.id]) if len(emitted[r.id]) == r.max_tokens else r.token_times_s)
                for r in _requests(run)]
    return StepLog(Path(run.path), fmt, run.source, device, model, _engine_config(run), requests, steps)


def _token_events(run: RequestRun) -> list[tuple[float, str, int]]:
    return sorted((t, r.id, k) for r in run.requests for k, t in enumerate(r.token_times_s or ()))


def steps_from_token_times(run: RequestRun) -> StepLog:
    """A step log rebuilt from every request's token times (see the module docstring)."""
    _requests(run)
    itl = [g for r in run.requests for g in np.diff(r.token_times_s) if g > 0]
    if not itl:
        raise CbsimError(f"{run.path}: no request has two tokens; token times cannot show the engine's steps")
    pause = 0.5 * float(np.median(itl))
    by_id = {r.id: r for r in run.requests}
    clusters: list[list[tuple[float, str, int]]] = []
    seen: set[str] = set()
    last_t = -math.inf
    for ev in _token_events(run):
        t, rid, _ = ev
        if not clusters or rid in seen or t - last_t > pause:
            clusters.append([])
            seen = set()
        clusters[-1].append(ev)
        seen.add(rid)
        last_t = t
    budget = run.config.max_num_batched_tokens
    finishes = sorted(r.last_token_s for r in run.requests)
    arrivals = sorted(r.arrival_s for r in run.requests)
    steps: list[LoggedStep] = []
    prev_end = None
    from bisect import bisect_right

    for cl in clusters:
        end = cl[0][0]
        batch = []
        newest = -math.inf
        for _, rid, k in cl:
            r = by_id[rid]
            if k == 0:
                batch.append((rid, r.prompt_tokens, 0))
                newest = max(newest, r.arrival_s)
            else:
                batch.append((rid, 1, r.prompt_tokens + k - 1))
        # busy: a request had arrived and not finished when the previous step ended
        busy = prev_end is not None and bisect_right(arrivals, prev_end) - bisect_right(finishes, prev_end) > 0
        start = max(prev_end, newest) if busy else newest
        prev_end = end
        if not math.isfinite(start) or start >= end or sum(n for _, n, _ in batch) > budget:
            continue  # no visible start (a decode-only step after idle), or chunks the tokens cannot show
        steps.append(LoggedStep(start, end, tuple(batch)))
    if len(steps) < 10:
        raise CbsimError(f"{run.path}: only {len(steps)} engine steps could be rebuilt from its token times; a fit "
                         f"needs at least 10 (observe more requests)")
    return _step_log(run, steps, "request-run token times")


def _window(run: RequestRun, iterations: list[Iteration], t0_unix_s: float | None) -> list[Iteration]:
    """The iterations of this run: those whose token counts add up to the run's, searched from the
    run's start (by the log's one-second timestamps when the run has its wall-clock start)."""
    ctx_total = sum(r.prompt_tokens for r in run.requests)
    gen_total = sum(r.output_tokens - 1 for r in run.requests)
    busy = [it for it in iterations if it.ctx_tokens + it.gen_tokens > 0]
    starts = range(len(busy))
    if t0_unix_s is not None:
        end_unix = t0_unix_s + max(r.last_token_s for r in run.requests)
        starts = [i for i, it in enumerate(busy) if t0_unix_s - 2 <= it.stamp_unix_s <= end_unix + 2]
    for s in starts:
        if busy[s].ctx_tokens == 0:  # a run begins with its first request's prefill
            continue
        ctx = gen = 0
        for e in range(s, len(busy)):
            ctx += busy[e].ctx_tokens
            gen += busy[e].gen_tokens
            if ctx >= ctx_total and gen >= gen_total:
                if ctx == ctx_total and gen == gen_total:
                    return busy[s:e + 1]
                break
    raise CbsimError(f"{run.path}: no run of consecutive iterations in the log adds up to this run's "
                     f"{ctx_total} prompt and {gen_total} decode tokens; give the log of the server this run was "
                     f"observed on (prefix-cache hits and preemptions also change the counts)")


def steps_from_iteration_log(run: RequestRun, iterations: list[Iteration], t0_unix_s: float | None = None) -> StepLog:
    """A step log from vLLM's iteration log joined with the run's token times (module docstring)."""
    _requests(run)
    its = _window(run, iterations, t0_unix_s)
    by_arrival = sorted(run.requests, key=lambda r: (r.arrival_s, r.id))
    decodes = sorted((t, r.id, k) for r in run.requests for k, t in enumerate(r.token_times_s) if k > 0)
    by_id = {r.id: r for r in run.requests}
    ends: list[float | None] = []
    batches = []
    idle_after: list[bool] = []  # no request in the engine after this step (all it had begun are done)
    live = 0
    d = 0  # next decode token of the run
    p, p_done = 0, 0  # next prompt (in arrival order) and how much of it is computed
    for it in its:
        batch, times = [], []
        for t, rid, k in decodes[d:d + it.gen_tokens]:
            batch.append((rid, 1, by_id[rid].prompt_tokens + k - 1))
            times.append(t)
            live -= k == by_id[rid].output_tokens - 1
        d += it.gen_tokens
        left = it.ctx_tokens
        while left > 0 and p < len(by_arrival):
            r = by_arrival[p]
            n = min(left, r.prompt_tokens - p_done)
            live += p_done == 0
            batch.append((r.id, n, p_done))
            left -= n
            p_done += n
            if p_done == r.prompt_tokens:
                times.append(r.first_token_s)
                live -= r.output_tokens == 1
                p, p_done = p + 1, 0
        batches.append(tuple(batch))
        idle_after.append(live == 0)
        ends.append(min(times) if times else None)
    # Busy stretches: runs of steps with requests in the engine between them, cut where it idled.
    stretches: list[list[tuple[Iteration, tuple, float | None]]] = []
    idle = True
    for it, batch, end, now_idle in zip(its, batches, ends, idle_after):
        if idle:
            stretches.append([])
        stretches[-1].append((it, batch, end))
        idle = now_idle
    steps: list[LoggedStep] = []
    for stretch in stretches:
        timed = [i for i, (_, _, e) in enumerate(stretch) if e is not None]
        if not timed:
            continue
        first, last = timed[0], timed[-1]
        model = [it.elapsed_s for it, _, _ in stretch[:last + 1]]
        rest = stretch[:last + 1]
        t = stretch[first][2] - sum(model[:first + 1])  # its first model time(s) before its first token
        if steps:
            t = max(t, steps[-1].end_s)  # never before the previous step ended
        newest = max((by_id[rid].arrival_s for rid, n, c in stretch[0][1] if c == 0), default=-math.inf)
        if first == 0 and newest < stretch[0][2]:
            # the first step lasts from its newest request's arrival to its first token: the server's
            # own time per request (HTTP, tokenizing, scheduling) before the engine, as TTFT holds it
            begin = max(newest, t - 1.0, steps[-1].end_s if steps else -math.inf)
            steps.append(LoggedStep(min(begin, stretch[0][2]), stretch[0][2], stretch[0][1]))
            t, rest, model = stretch[0][2], rest[1:], model[1:]
        # the rest of the span is the client's, shared among the steps in proportion to their model
        # times (the gaps between steps inside them)
        scale = (stretch[last][2] - t) / sum(model) if sum(model) > 0 else 0.0
        for (_, batch, _), m in zip(rest, model):
            steps.append(LoggedStep(t, t + m * scale, batch))
            t += m * scale
    return _step_log(run, steps, "vLLM iteration log + request-run token times")


def fit_run(run_path: str | Path, iteration_log: str | Path | None = None, heldout_fraction: float = 0.2,
            seed: int = 0):
    """Fit a latency table to a request-level run (and its server's iteration log when given);
    returns the :class:`sim.latency.fit.FitResult` and the rebuilt :class:`StepLog`."""
    import json

    from sim.latency.fit import fit_steplog
    from sim.recorded.run_readers import read_run
    from sim.recorded.vllm_iteration_log import read_iteration_log

    run = read_run(run_path)
    if iteration_log is not None:
        t0 = None
        try:
            t0 = json.loads(Path(run_path).read_text(encoding="utf-8")).get("observe", {}).get(
                "wall_clock_start_unix_s")
        except (OSError, ValueError, AttributeError):
            pass
        log = steps_from_iteration_log(run, read_iteration_log(iteration_log), t0)
    else:
        log = steps_from_token_times(run)
    result = fit_steplog(log, heldout_fraction=heldout_fraction, seed=seed)
    fit = result.table.metadata["fit"]
    fit["steps_from"] = log.format
    fit["run"] = str(run_path)
    if iteration_log is not None:
        fit["iteration_log"] = str(iteration_log)
    return result, log
