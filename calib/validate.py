"""``cbsim validate X.yaml``: serve a scenario for real, simulate it with a measured table, compare.

The real side is :class:`calib.engine.RealEngine`: the scenario's policy chooses every step, the
model (random weights, the scenario's dimensions) runs it on ``device``, requests arrive on the
engine's clock. The simulated side is ``sim.runner.run_policy`` on the same requests
(``sim.workload.synthetic.build_workload``, same seed) with the ``table`` latency backend. Both are reduced
by :func:`sim.recorded.validate_against.request_metrics` (the definitions of ``vllm bench serve``) and
compared by :func:`sim.recorded.validate_against.relative_errors` (signed, (sim − real) / real), so the
result has the shape of ``cbsim validate --against``: ``{"real", "sim", "error", ...}``.

Without ``table`` the device is calibrated first (:mod:`calib.profile.calibrate`), over the scenario's own
engine limits, right before the real run: table and run then see the same machine in the same
state, which is what makes a comparison on a shared CPU meaningful. ``diagnostics.step_time_bias``
prices the real run's own steps with the table (as ``--against`` does): a latency-table error
shows there, a scheduling or queueing error does not.

Limits: one device, one replica (the real engine is one process on one GPU), tensor parallelism 1.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from calib.engine import EngineRun, RealEngine
from calib.executor import StepExecutor, make_executor
from calib.profile.calibrate import ProfileSpec, calibrate
from calib.step import BlockAllocator, make_runner, release, synthetic_batch
from sim.errors import CbsimError, nearest

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def pick_policy(scn, label: str | None):
    """The scenario's policy entry to validate: the one labelled ``label``, else the first."""
    labels = [e.label or e.name for e in scn.policies]
    if label is None:
        return scn.policies[0]
    if label not in labels:
        raise CbsimError(f"--policy {label!r} is not in the scenario{nearest(label, labels)}; its policies are: "
                         f"{', '.join(labels)}")
    return scn.policies[labels.index(label)]


def check_servable(scn) -> None:
    if scn.replicas.count != 1:
        raise CbsimError(f"validate runs ONE engine for real; the scenario has replicas.count {scn.replicas.count}: "
                         f"set --set replicas.count=1")
    if scn.hardware.tensor_parallel != 1:
        raise CbsimError(f"validate runs on one device; hardware.tensor_parallel is {scn.hardware.tensor_parallel} "
                         f"(calib times one shard but does not run the all-reduces of a TP group): set "
                         f"--set hardware.tensor_parallel=1")


def profile_spec_for(dep, policy, device: str, **overrides) -> ProfileSpec:
    """Calibration limits that cover what the scenario's engine can run."""
    scn, limits = dep.scenario, policy.limits
    budget = policy.token_budget or limits.max_num_batched_tokens
    return ProfileSpec(model=dep.model, device=device, tp=dep.tensor_parallel,
                       block_size=limits.block_size, max_num_batched_tokens=max(budget, limits.block_size),
                       max_model_len=limits.max_model_len, max_num_seqs=policy.max_slots,
                       gpu_memory_utilization=scn.hardware.gpu_memory_utilization, seed=scn.seed, **overrides)


def warm_up(executor: StepExecutor, limits, max_tokens: int) -> None:
    """Run a few steps before the clock starts (kernel compilation, allocator pools)."""
    runner = executor.runner
    allocator = BlockAllocator(runner.cache.num_blocks)
    bs = runner.block_size
    fits = allocator.num_free * bs
    shapes = [[(min(max_tokens, limits.max_model_len - 1, fits - 1), 0)],
              [(1, 16)] * max(1, min(4, limits.max_num_seqs)),
              [(min(32, max_tokens), 64), (1, 100)]]
    for batch_shapes in shapes:
        if sum(-(-(n + c + 1) // bs) for n, c in batch_shapes) > allocator.num_free:
            continue
        batch = synthetic_batch(batch_shapes, allocator, bs)
        executor.run(batch)
        release(batch, allocator)


def run_real(dep, entry, specs, device: str, *, check: bool = False,
             on_progress: Callable[[int], None] | None = None, clock=None) -> EngineRun:
    """Serve ``specs`` for real with the scenario's policy entry on ``device``."""
    from policies.registry import make_policy
    from sim.latency.base import LatencyModel
    from sim.runner import policy_knobs

    scn, model = dep.scenario, dep.model
    knobs = policy_knobs(scn, entry)
    limits = dep.limits_for(entry.name, knobs)  # the policy's own batch limits, as the simulation's
    policy = make_policy(entry.name, limits, **knobs)
    runner = make_runner(model, num_blocks=limits.num_gpu_blocks + 1, block_size=limits.block_size, device=device,
                         seed=scn.seed)
    executor, note = make_executor(runner, max_model_len=limits.max_model_len, max_batch=policy.max_slots)
    warm_up(executor, limits, policy.token_budget or limits.max_num_batched_tokens)
    flops = LatencyModel(model, dep.gpu, dep.tensor_parallel, limits.block_size)
    cpu_blocks = limits.num_cpu_blocks if getattr(policy, "preemption", None) == "swap" else 0
    engine = RealEngine(policy, executor, max_model_len=limits.max_model_len, latency=flops,
                        num_cpu_blocks=cpu_blocks, check=check, on_progress=on_progress, clock=clock)
    run = engine.run(specs, horizon_s=scn.horizon_s)
    run.info["graphs_note"] = note
    return run


def simulate(dep, entry, specs, table: Path):
    """The same requests through the simulator with the table backend; the requests frame."""
    from dataclasses import replace

    from sim.runner import run_policy
    from sim.scenario.schema import Latency

    latency = Latency(backend="table", path=str(Path(table).resolve()))
    on_table = replace(dep, scenario=dep.scenario.model_copy(update={"latency": latency}))
    requests, _steps, summary, _meta = run_policy(on_table, entry, specs)
    return requests, summary


def metrics_of(requests) -> dict[str, Any]:
    from sim.recorded.validate_against import request_metrics

    return request_metrics(requests["arrival_s"].tolist(), requests["token_times_s"].tolist(),
                           requests["preemptions"].tolist())


def step_time_bias(run: EngineRun, table: Path, dep) -> float:
    """The table's price of the real run's own steps (plus its step gap) over their measured sum
    (each step's start to the next one's, or its end plus its own gap for the last), minus 1."""
    import warnings

    from policies.base import StepPlan
    from sim.latency.base import step_shape
    from sim.latency.table import TableExtrapolationWarning, TableLatency

    lat = TableLatency.from_path(table, dep.model, dep.gpu, dep.tensor_parallel, dep.block_size)
    predicted = measured = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TableExtrapolationWarning)
        for i, step in enumerate(run.steps):
            if not step.batch:
                continue
            plan = StepPlan(num_new_tokens=[n for _, n, _ in step.batch], context=[c for _, _, c in step.batch])
            predicted += lat.price(step_shape(plan), plan)[0]
            nxt = run.steps[i + 1].start_s if i + 1 < len(run.steps) else step.end_s + step.gap_s
            measured += nxt - step.start_s
    return predicted / measured - 1 if measured > 0 else 0.0


def validate_scenario(scenario, *, device: str = "cpu", table: str | Path | None = None, policy: str | None = None,
                      overrides=(), out: str | Path | None = None, progress: Progress | None = None,
                      profile_overrides: dict | None = None) -> dict[str, Any]:
    """Run ``scenario`` for real on ``device`` and simulate it; ``{"real", "sim", "error", ...}``.

    ``table``: a table folder; None calibrates first (into ``out/table`` when ``out`` is given).
    ``profile_overrides``: ProfileSpec fields for that calibration (e.g. ``heldout``).
    """
    from sim.recorded.validate_against import relative_errors
    from sim.scenario.resolved import resolve
    from sim.scenario.schema import load_scenario
    from sim.workload.synthetic import build_workload

    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise CbsimError("--device cuda but torch sees no CUDA device; use --device cpu")
    scn = load_scenario(scenario, list(overrides))
    check_servable(scn)
    entry = pick_policy(scn, policy)
    label = entry.label or entry.name
    dep = resolve(scn)
    limits = dep.limits
    specs = build_workload(scn)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)

    tmp = None
    calibration = None
    if table is not None:  # a table that cannot price this scenario fails now, not after the real run
        from sim.latency.table import check_compatible
        from sim.latency.table_format import read_table

        check_compatible(read_table(table), dep.model, dep.tensor_parallel, limits.block_size)
    else:
        from policies.registry import make_policy
        from sim.runner import policy_knobs

        knobs = policy_knobs(scn, entry)
        probe = make_policy(entry.name, dep.limits_for(entry.name, knobs), **knobs)
        spec = profile_spec_for(dep, probe, device, **(profile_overrides or {}))
        if out is not None:
            table = Path(out) / "table"
        else:
            tmp = tempfile.TemporaryDirectory(prefix="cbsim-table-")
            table = Path(tmp.name)
        tick = (lambda done, total, what: progress("calibrating", done, total)) if progress else None
        made = calibrate(spec, table, tick)
        calibration = {"heldout_error": made.metadata["heldout_error"],
                       "profile_seconds": made.metadata["fit"]["profile_seconds"]}
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    try:
        done = [0]

        def on_progress(n: int) -> None:
            done[0] += n
            if progress is not None:
                progress("serving for real", done[0], len(specs))

        run = run_real(dep, entry, specs, device, on_progress=on_progress)
        real_frame = run.requests_frame()
        if progress is not None:
            progress("simulating", 0, 1)
        sim_frame, _summary = simulate(dep, entry, specs, Path(table))
        if progress is not None:
            progress("simulating", 1, 1)
        real, sim = metrics_of(real_frame), metrics_of(sim_frame)
        result = {
            "real": real,
            "sim": sim,
            "error": relative_errors(real, sim),
            "diagnostics": {
                "step_time_bias": step_time_bias(run, Path(table), dep),
                "real_steps": len(run.steps),
                "real_unfinished": int((real_frame["state"] != "finished").sum()),
                "sim_unfinished": int((sim_frame["state"] != "finished").sum()),
                "real_mean_step_s": sum(s.end_s - s.start_s for s in run.steps) / max(len(run.steps), 1),
                "real_mean_gap_s": sum(s.gap_s for s in run.steps) / max(len(run.steps), 1),
                "clock": run.info.get("clock"),
                "cuda_graphs": run.info.get("graphs"),
                "cuda_graphs_note": run.info.get("graphs_note"),
                "calibration": calibration,
            },
            "scenario": scn.name,
            "policy": label,
            "device": device,
            "table": str(table) if tmp is None else "(calibrated in a temporary folder)",
        }
        if out is not None:
            from sim.recorded.validate_against import write_json

            write_json(result, Path(out) / "validation.json")
            write_steplog(run, dep, Path(out) / "real_run.json")
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


def write_steplog(run: EngineRun, dep, path: Path) -> Path:
    """The real run as a step log (``sim.recorded.steplog``'s vllm-json format), so it can be fitted
    (``cbsim calibrate --from-steplog``) or predicted (``cbsim validate --against``)."""
    import json

    limits, m = run.policy.limits, dep.model  # the limits the policy really ran with
    reqs = run.requests_frame()
    data = {
        "source": f"cbsim calib.engine ({run.policy.name}), {run.info.get('device', 'cpu')}, {m.dtype}, "
                  f"{run.info.get('clock', 'wall')} clock",
        "model": {"hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
                  "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
                  "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim, "vocab_size": m.vocab_size,
                  "dtype": m.dtype, "tie_word_embeddings": m.tied_embeddings},
        "config": {"block_size": limits.block_size, "num_blocks": limits.num_gpu_blocks + 1,
                   "max_num_batched_tokens": limits.max_num_batched_tokens, "max_num_seqs": limits.max_num_seqs,
                   "max_model_len": limits.max_model_len, "policy": "fcfs",
                   "enable_prefix_caching": bool(run.policy.knobs.get("enable_prefix_caching", False))},
        "requests": [{"id": r.id, "arrival_s": float(r.arrival_s), "prompt_tokens": int(r.prompt_tokens),
                      "max_tokens": int(r.max_tokens), "token_times_s": [float(t) for t in r.token_times_s],
                      "preemptions": int(r.preemptions)} for r in reqs.itertuples()],
        "steps": [{"start_s": s.start_s, "end_s": s.end_s, "scheduled": {i: n for i, n, _ in s.batch},
                   "context": {i: c for i, _, c in s.batch}, "preempted": list(s.preempted)}
                  for s in run.steps],
    }
    path.write_text(json.dumps(data) + "\n", encoding="utf-8")
    return path
