"""Predict a recorded run of a real engine and compare: ``cbsim validate --against RUN``.

RUN is either a **step log** (:mod:`sim.recorded.steplog`: every step and every token time) or a
**request-level run** (:mod:`sim.recorded.request_run`: per request its arrival, lengths, first
and last token times; a ``cbsim-request-run`` JSON or an LLMServingSim bench folder).

The simulator is given only what a user would know before the run: each request's arrival,
prompt length and output length (``max_tokens`` with ``ignore_eos``; the number of tokens it
produced otherwise), and the engine's config (block size, usable KV blocks, token budget,
``max_num_seqs``, ``max_model_len``, scheduling policy, prefix caching, chunked prefill, async
scheduling; vLLM V1's defaults for what a request-level run left unset, each listed in
``assumed``). The run's own timings are never used: they are what is predicted. The simulation
goes through the same path as ``cbsim run`` (a scenario with the requests written out,
``vllm-v1``, the ``table`` latency backend), so what is validated is what users run. KV capacity
is the run's ``num_gpu_blocks`` when it recorded one, else computed from the GPU's memory as for
any scenario.

Both sides are measured with one function (:func:`summary_metrics`) from arrivals, first and last
token times and token counts, with the definitions of ``vllm bench serve``: TTFT = first token −
arrival; TPOT = (last − first token) / (tokens − 1), over requests with more than one token; E2E
= last token − arrival; throughput = requests / (last token − first arrival); percentiles are the
order statistic at or above the percentile (numpy's ``higher``, the step logs' own ``summary``
convention). Errors are signed and relative: (sim − real) / real.

For a step log, ``diagnostics.step_time_bias`` also prices the run's own recorded steps with the
table and compares their sum with the measured sum (model time plus busy gaps). It uses the run's
timings, so it is not part of the prediction: it tells a latency-model error (the table misprices
these very batches, e.g. because the machine ran at another speed when the table was recorded)
apart from a simulation error (queueing, admission, preemption).

The JSON written by ``--json`` (and by ``cbsim validate X.yaml``) is ``{"real": METRICS, "sim":
METRICS, "error": {KEY: signed relative error}}`` with METRICS = :data:`METRICS` (seconds and
requests per second; ``preemptions`` is null when the run did not record them) and the error keys
:data:`ERROR_KEYS`, plus ``run``, ``table``, ``format`` and, for request-level runs, ``assumed``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import CbsimError
from sim.recorded.request_run import RequestRun
from sim.recorded.run_readers import is_request_level, read_run
from sim.recorded.steplog import StepLog, read_steplog

METRICS = ("requests", "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_mean", "tpot_p90", "e2e_mean",
           "e2e_p90", "throughput", "preemptions")
ERROR_KEYS = ("ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_mean", "tpot_p90", "e2e_mean", "e2e_p90",
              "throughput", "preemptions")


def _pct(x, q: float) -> float:
    return float(np.percentile(x, q, method="higher"))


def summary_metrics(arrivals, first, last, tokens, preemptions=None) -> dict[str, Any]:
    """The compared figures from per-request arrival, first and last token times and token counts,
    over requests that produced at least one token; ``preemptions`` None when not recorded."""
    arr = np.asarray(arrivals, dtype=float)
    first = np.asarray(first, dtype=float)
    last = np.asarray(last, dtype=float)
    tokens = np.asarray(tokens)
    keep = tokens > 0
    if not keep.any():
        raise CbsimError("no request produced a token: nothing to compare")
    arr0 = float(arr.min())
    arr, first, last, tokens = arr[keep], first[keep], last[keep], tokens[keep]
    multi = tokens > 1
    tpot = (last[multi] - first[multi]) / (tokens[multi] - 1)
    ttft = first - arr
    e2e = last - arr
    span = float(last.max() - arr0)
    return {
        "requests": int(keep.sum()),
        "ttft_mean": float(ttft.mean()),
        "ttft_p50": _pct(ttft, 50),
        "ttft_p90": _pct(ttft, 90),
        "ttft_p99": _pct(ttft, 99),
        "tpot_mean": float(tpot.mean()) if len(tpot) else None,
        "tpot_p90": _pct(tpot, 90) if len(tpot) else None,
        "e2e_mean": float(e2e.mean()),
        "e2e_p90": _pct(e2e, 90),
        "throughput": int(keep.sum()) / span if span > 0 else None,
        "preemptions": None if preemptions is None else int(sum(preemptions)),
    }


def request_metrics(arrivals, token_times, preemptions) -> dict[str, Any]:
    """:func:`summary_metrics` from per-request token-time lists (a step log, a simulation)."""
    times = [np.asarray(t, dtype=float) for t in token_times]
    first = [t[0] if len(t) else np.nan for t in times]
    last = [t[-1] if len(t) else np.nan for t in times]
    return summary_metrics(arrivals, first, last, [len(t) for t in times], preemptions)


def relative_errors(real: dict, sim: dict) -> dict[str, float | None]:
    """Signed (sim − real) / real per compared figure; None where real is 0 or missing (0.0 when
    both are 0)."""
    out: dict[str, float | None] = {}
    for key in ERROR_KEYS:
        r, s = real.get(key), sim.get(key)
        if r is None or s is None:
            out[key] = None
        elif r == 0:
            out[key] = 0.0 if s == 0 else None
        else:
            out[key] = (s - r) / r
    return out


def real_metrics(log: StepLog) -> dict[str, Any]:
    reqs = log.requests
    return request_metrics([r.arrival_s for r in reqs], [r.token_times_s for r in reqs],
                           [r.preemptions or 0 for r in reqs])


def scenario_for(log: StepLog, table: str | Path, gpu: str | None = None) -> dict[str, Any]:
    """A scenario (as a mapping) that replays the log's workload on its engine config."""
    from sim.hardware.models import MODELS

    if gpu is None:
        if log.device != "cpu":
            raise CbsimError(f"{log.path}: the log does not say which GPU recorded it ({log.device!r}); pass "
                             f"--gpu with one of the ids of `sim.hardware.gpus.GPUS` (it sets MFU/MBU and swap "
                             f"bandwidth, not step times)")
        gpu = "cpu"
    cfg = log.config
    name = log.model.get("name")
    model: Any = name if name in MODELS and MODELS[name].to_dict() == log.model else dict(log.model)
    requests = []
    for r in log.requests:
        produced = len(r.token_times_s)
        output = r.max_tokens if produced >= r.max_tokens else max(produced, 1)
        requests.append({"arrival_s": float(r.arrival_s), "prompt_tokens": r.prompt_tokens,
                         "output_tokens": output, "max_tokens": r.max_tokens})
    return {
        "name": f"validate-{log.path.stem}",
        "model": model,
        "hardware": {"gpu": gpu, "tensor_parallel": cfg.tensor_parallel},
        "latency": {"backend": "table", "path": str(Path(table).resolve())},
        "workload": {"requests": requests},
        "engine": {
            "block_size": cfg.block_size,
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_model_len": cfg.max_model_len,
            "num_gpu_blocks": cfg.num_gpu_blocks,
            "enable_prefix_caching": cfg.enable_prefix_caching,
        },
        "policies": [{"name": "vllm-v1", "scheduling_policy": cfg.scheduling_policy,
                      "enable_chunked_prefill": cfg.enable_chunked_prefill}],
    }


def simulate_log(log: StepLog, table: str | Path, gpu: str | None = None):
    """Run the log's workload through cbsim; returns the RunResult."""
    from sim.runner import run

    return run(scenario_for(log, table, gpu))


def validate_against(run_path: str | Path, table: str | Path, gpu: str | None = None) -> dict[str, Any]:
    """{"real", "sim", "error"} for a recorded run (step log or request-level) and a latency table."""
    if is_request_level(run_path):
        return validate_request_run(read_run(run_path), table, gpu)
    log = read_steplog(run_path)
    real = real_metrics(log)
    result = simulate_log(log, table, gpu)
    reqs = result.requests
    unfinished = reqs[reqs["state"] != "finished"]
    if len(reqs) - len(unfinished) < real["requests"]:
        first = unfinished.iloc[0]
        raise CbsimError(f"the engine served {real['requests']} requests of {run_path} but cbsim finished only "
                         f"{len(reqs) - len(unfinished)} (e.g. {first['id']}: {first['state']}, {first['reason']}); "
                         f"check the log's config (blocks, max_model_len, token budget)")
    reqs = reqs[reqs["state"] == "finished"]
    sim = request_metrics(reqs["arrival_s"].tolist(), reqs["token_times_s"].tolist(), reqs["preemptions"].tolist())
    return {"real": real, "sim": sim, "error": relative_errors(real, sim),
            "diagnostics": {"step_time_bias": step_time_bias(log, table)},
            "run": str(run_path), "table": str(table), "format": log.format}


# ------------------------------------------------------------------------------------------------
# request-level runs
# ------------------------------------------------------------------------------------------------
def run_real_metrics(run: RequestRun) -> dict[str, Any]:
    rs = run.requests
    return summary_metrics([r.arrival_s for r in rs], [r.first_token_s for r in rs], [r.last_token_s for r in rs],
                           [r.output_tokens for r in rs])


def scenario_for_run(run: RequestRun, table: str | Path, gpu: str | None = None) -> dict[str, Any]:
    """A scenario (as a mapping) that replays a request-level run's workload on its engine config."""
    gpu = gpu or run.gpu
    if gpu is None:
        raise CbsimError(f"{run.path}: the run does not say which GPU served it; pass --gpu with a cbsim GPU id "
                         f"(`sim.hardware.gpus.GPUS`; it sets the KV capacity when the run recorded no "
                         f"num_gpu_blocks, MFU/MBU and swap bandwidth, not step times)")
    c = run.config
    return {
        "name": "validate-run",
        "model": run.model,
        "hardware": {"gpu": gpu, "tensor_parallel": c.tensor_parallel,
                     "gpu_memory_utilization": c.gpu_memory_utilization},
        "latency": {"backend": "table", "path": str(Path(table).resolve())},
        "workload": {"requests": [{"arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
                                   "output_tokens": r.output_tokens, "max_tokens": r.max_tokens}
                                  for r in run.requests]},
        "engine": {
            "block_size": c.block_size,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "max_model_len": c.max_model_len,
            "num_gpu_blocks": c.num_gpu_blocks,
            "enable_prefix_caching": c.enable_prefix_caching,
            "async_scheduling": c.async_scheduling,
        },
        "policies": [{"name": "vllm-v1", "scheduling_policy": c.scheduling_policy,
                      "enable_chunked_prefill": c.enable_chunked_prefill}],
    }


def validate_request_run(run: RequestRun, table: str | Path, gpu: str | None = None) -> dict[str, Any]:
    """{"real", "sim", "error", "assumed", ...} for a request-level run and a latency table."""
    from sim.runner import run as simulate

    real = run_real_metrics(run)
    result = simulate(scenario_for_run(run, table, gpu))
    reqs = result.requests
    done = reqs[reqs["state"] == "finished"]
    if len(done) < real["requests"]:
        first = reqs[reqs["state"] != "finished"].iloc[0]
        raise CbsimError(f"the engine served {real['requests']} requests of {run.path} but cbsim finished only "
                         f"{len(done)} (e.g. {first['id']}: {first['state']}, {first['reason']}); check the run's "
                         f"config (blocks, max_model_len, token budget)")
    sim = summary_metrics(done["arrival_s"], done["first_token_s"], done["finish_s"], done["generated"],
                          done["preemptions"].tolist())
    return {"real": real, "sim": sim, "error": relative_errors(real, sim), "run": str(run.path),
            "table": str(table), "format": run.format, "source": run.source, "assumed": list(run.assumed),
            "diagnostics": {"kv_blocks": int(next(iter(result.meta.values()))["kv_blocks_total"])}}


def step_time_bias(log: StepLog, table: str | Path) -> float:
    """Sum of the table's prices of the log's own steps (plus its step gap after each step followed
    by a busy gap) over the measured sum, minus 1."""
    from sim.latency.fit import predict_steps
    from sim.latency.table_format import read_table

    tab = read_table(table)
    gaps = log.busy_gaps()
    steps = [(s, g) for s, g in zip(log.steps, gaps) if s.batch]
    pred = predict_steps(tab, log.model, log.config.block_size, [s for s, _ in steps])
    gap_s = tab.scalar("step_gap")
    predicted = float(pred.sum()) - gap_s * sum(g is None for _, g in steps)
    measured = sum(s.duration_s + (g or 0.0) for s, g in steps)
    return predicted / measured - 1


def write_json(result: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return p


def comparison_table(result: dict[str, Any], real_label: str = "engine (measured)", title: str | None = None):
    """A rich table: each figure measured, predicted, and the signed relative error."""
    from rich.table import Table

    t = Table(title=title, header_style="bold")
    t.add_column("metric")
    t.add_column(real_label, justify="right")
    t.add_column("cbsim (predicted)", justify="right")
    t.add_column("error", justify="right")
    real, sim, err = result["real"], result["sim"], result["error"]
    rows = [
        ("TTFT mean (s)", "ttft_mean", "{:.3f}"),
        ("TTFT p50 (s)", "ttft_p50", "{:.3f}"),
        ("TTFT p90 (s)", "ttft_p90", "{:.3f}"),
        ("TTFT p99 (s)", "ttft_p99", "{:.3f}"),
        ("TPOT mean (ms)", "tpot_mean", "ms"),
        ("TPOT p90 (ms)", "tpot_p90", "ms"),
        ("E2E mean (s)", "e2e_mean", "{:.3f}"),
        ("E2E p90 (s)", "e2e_p90", "{:.3f}"),
        ("throughput (req/s)", "throughput", "{:.3f}"),
        ("preemptions", "preemptions", "{:d}"),
    ]
    for label, key, fmt in rows:
        t.add_row(label, _show(real.get(key), fmt), _show(sim.get(key), fmt), _signed(err.get(key, _rel(real, sim, key))))
    return t


def _rel(real, sim, key):
    r, s = real.get(key), sim.get(key)
    return (s - r) / r if r and s is not None else None


def _show(v, fmt: str) -> str:
    if v is None:
        return "-"
    if fmt == "ms":
        return f"{v * 1e3:.2f}"
    return fmt.format(v)


def _signed(e) -> str:
    if e is None:
        return "-"
    colour = "green" if abs(e) <= 0.15 else "red"
    return f"[{colour}]{e:+.1%}[/]"
