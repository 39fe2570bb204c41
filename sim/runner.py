"""From a scenario to results: build the workload, the KV pool, the latency model and one
simulation per policy entry, run them, and gather a :class:`sim.results.RunResult`.

This is the one code path behind ``cbsim run``, ``sim.run()`` in notebooks, sweeps and capacity
search.

Where simulated time stops: at ``horizon_s`` when the scenario sets one; otherwise when every
request has ended, but never later than a *default cap* of ``last arrival + max(DEFAULT_DRAIN_S,
arrival span)``: one more hour, or as long again as the requests took to arrive, to drain what
is queued. A system that needs longer than that to serve its backlog is overloaded, the latencies
of its last requests mean nothing, and simulating the drain step by step would only cost time
(and, for a policy that livelocks, never end). Requests left at the cap count as unfinished,
with the reason saying so; set ``horizon_s`` to choose another end. Either way the summary
reports the *backlog* at the end (``backlog``: requests queued, started but unfinished, and not
yet arrived) and why requests were left (``unfinished_reasons``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from policies.registry import POLICIES, make_policy
from sim.engine import Simulation
from sim.errors import CbsimError
from sim.metrics.kv_tiers import kv_tiers_report, returning_turn_ttft, tier_store_of
from sim.metrics.recorder import HORIZON_REACHED
from sim.metrics.summary import summarize
from sim.results import RunResult
from sim.routing import make_router
from sim.scenario.resolved import Deployment, resolve
from sim.scenario.schema import Scenario, load_scenario
from sim.speculative.report import speculative_report
from sim.speculative.setup import speculation_for
from sim.workload.closed_loop import send_plan
from sim.workload.synthetic import build_workload


def policy_knobs(scn: Scenario, entry) -> dict:
    """The entry's knobs, plus engine-level settings a policy exposes as knobs
    (``engine.enable_prefix_caching``) when the entry does not set them itself."""
    knobs = dict(entry.knobs())
    cls = POLICIES[entry.name]
    caching = scn.engine.enable_prefix_caching  # null: the policy's own default (on in vllm-v1)
    if "enable_prefix_caching" in cls.KNOBS and "enable_prefix_caching" not in knobs and caching is not None:
        knobs["enable_prefix_caching"] = caching
    if "enable_block_reuse" in cls.KNOBS and "enable_block_reuse" not in knobs and caching is not None:
        knobs["enable_block_reuse"] = caching  # trtllm's name for it
    return knobs


DEFAULT_DRAIN_S = 3600.0


def time_limit(scn: Scenario, specs) -> tuple[float | None, bool]:
    """(where simulated time stops, whether that is the default cap rather than ``horizon_s``).
    Closed-loop clients or sessions (requests sent during the run) without ``horizon_s``: (None,
    True), the cap moving with the sends (:mod:`sim.clients`)."""
    if scn.horizon_s is not None:
        return float(scn.horizon_s), False
    if send_plan(scn, specs) is not None:
        return None, True
    if not specs:
        return DEFAULT_DRAIN_S, True
    arrivals = getattr(specs, "arrival_s", None)  # sim.workload.spec_columns: no spec made for this
    if arrivals is not None and not np.isnan(arrivals).any():
        first, last = float(arrivals.min()), float(arrivals.max())
    else:
        first = min(s.arrival_s for s in specs)
        last = max(s.arrival_s for s in specs)
    return last + max(DEFAULT_DRAIN_S, last - first), True


CAP_HINT = (f"horizon_s is null, so simulated time stops at the last arrival + max({DEFAULT_DRAIN_S:.0f} s, "
            f"arrival span); set horizon_s to choose the end")


def cap_reason(cap_s: float) -> str:
    return f"simulated-time cap of {cap_s:,.0f} s reached"  # per request; the summary counts them


def backlog(requests: pd.DataFrame, end_s: float | None) -> dict:
    """What was left when simulated time stopped: requests that had arrived and never started
    (``queued``), had started and not finished (``running``: running, preempted or swapped), or
    had not arrived yet (``not_arrived``, only with a horizon before the last arrival)."""
    left = requests.loc[requests["state"] == "unfinished", ["arrival_s", "admitted_s"]]  # not every column
    arrived = left["arrival_s"] < end_s if end_s is not None else left["arrival_s"] == left["arrival_s"]
    started = left["admitted_s"].notna()
    return {
        "queued": int((arrived & ~started).sum()),
        "running": int((arrived & started).sum()),
        "not_arrived": int((~arrived).sum()),
    }


def run_policy(dep: Deployment, entry, specs, on_progress: Callable[[int], None] | None = None,
               release: bool = False):
    """Simulate one policy entry of a resolved scenario; returns (requests, steps, summary, meta).
    Once the frames are built the per-request records are let go before the summary is computed
    (a long run's peak memory is then the frames, not the frames and every record beside them);
    ``release``: the caller is done with ``specs`` too, and the list is emptied with them."""
    scn, gpu = dep.scenario, dep.gpu
    knobs = policy_knobs(scn, entry)
    limits = dep.limits_for(entry.name, knobs)  # unset batch limits: this policy's engine defaults
    if scn.engine.kv_offloading_size is not None and entry.name != "vllm-v1":
        hint = ("; SGLang's own host tier is the policy knob enable_hierarchical_cache (HiCache)"
                if entry.name == "sglang" else "")
        raise CbsimError(f"engine.kv_offloading_size: vLLM's KV offloading is modelled for vllm-v1 only, not "
                         f"{entry.name!r}; drop that policy entry or unset engine.kv_offloading_size{hint}")
    if (scn.engine.kv_offloading_size is not None and knobs.get("kv_offload", True)
            and knobs.get("enable_prefix_caching") is False):
        raise CbsimError(f"policy {entry.label or entry.name!r}: KV offloading finds blocks by their prefix hash, so it "
                         f"needs enable_prefix_caching on; set kv_offload: false on that entry or turn caching on")
    if knobs.get("attention_dp_enable_balance") and dep.lockstep <= 1:
        import warnings

        from sim.errors import SettingIgnored

        warnings.warn(SettingIgnored(
            f"policy {entry.label or entry.name!r}: attention_dp_enable_balance does nothing here: it balances the "
            f"ranks of an attention-DP group, which needs an MoE model and hardware.data_parallel > 1 (model "
            f"{dep.model.name!r}, data_parallel {dep.data_parallel}); drop the knob or set hardware.data_parallel"),
            stacklevel=2)
    speculation = speculation_for(dep, entry)  # policies[].speculative: drafts scheduled, drafter priced
    if speculation is not None:
        limits = speculation.limits(limits, dep)  # the drafter's weights and KV share the GPU
    replicas = [(make_policy(entry.name, limits, **knobs), dep.latency()) for _ in range(dep.replicas)]
    if speculation is not None:
        for pol, _lat in replicas:
            speculation.enable(pol)
        replicas = [(pol, speculation.wrap(lat)) for pol, lat in replicas]
    end_s, capped = time_limit(scn, specs)
    sim = Simulation(specs, replicas, limits.max_model_len, router=make_router(scn.replicas.router),
                     horizon_s=end_s, on_progress=on_progress,
                     horizon_reason=cap_reason(end_s) if capped and end_s is not None else HORIZON_REACHED,
                     clients=send_plan(scn, specs), drain_s=DEFAULT_DRAIN_S, cap_reason=cap_reason,
                     acceptance=speculation.acceptance if speculation is not None else None,
                     lockstep=dep.lockstep, compact=True, release_specs=release)
    recorder = sim.run()
    if end_s is None:  # closed loop: where the moving cap stopped it, if it did
        end_s = sim.end_s
    itl = recorder.itl_stats()  # from the records' token-time runs, before they are let go
    requests = recorder.requests_frame()
    sim.release_records()
    if release:
        specs.clear()
    del sim
    steps = recorder.steps_frame()
    pol = replicas[0][0]
    meta = {
        "policy": entry.name,
        "max_slots": pol.max_slots,
        "token_budget": pol.token_budget,
        "kv_blocks_total": pol.kv_blocks_total(),
        "kv_tokens": pol.kv_tokens_total(),  # the pool in tokens, the same unit for every policy
        "cpu_blocks_total": limits.num_cpu_blocks,
        "block_size": limits.block_size,
        "max_num_seqs": pol.max_slots,  # the resolved running cap (sglang: max_running_requests)
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "latency": replicas[0][1].name,
        "swap_s_per_block": replicas[0][1].swap_time(1),
        "kv_sizing": dep.kv_sizing(entry.name, knobs),
    }
    summary = summarize(
        requests, steps,
        max_slots=pol.max_slots * dep.replicas,
        token_budget=meta["token_budget"] * dep.replicas if meta["token_budget"] else None,
        kv_blocks_total=meta["kv_blocks_total"] * dep.replicas,
        peak_flops=gpu.peak_flops * dep.replicas,
        hbm_bandwidth=gpu.hbm_bandwidth * dep.replicas,
        slo=scn.slo,
        num_replicas=dep.replicas,
        kv_tokens_per_replica=meta["kv_tokens"],
        max_model_len=limits.max_model_len,
        # ITL from the recorder's runs of token times (sim.metrics.recorder): the same order statistics
        # without a list of every gap (and runs too large to keep token times in memory have none)
        itl=itl,
    )
    summary.update(end_report(requests, end_s, capped))
    summary["communication"] = communication_report(dep, replicas[0][1], steps)
    summary["speculative"] = speculative_report(getattr(entry, "speculative", None), requests, steps)
    summary["kv_tiers"] = kv_tiers_report([tier_store_of(p) for p, _ in replicas],
                                          limits.block_size, requests)
    summary["sessions"] = returning_turn_ttft(requests)
    return requests, steps, summary, meta


def communication_report(dep: Deployment, latency, steps: pd.DataFrame) -> dict:
    """The parallel layout and the time its collectives took (``comm_s``: summed over every step
    of every replica; ``comm_share``: of all step time). Null times where the latency source does
    not separate communication (constant; a table folds it into its components)."""
    hw = dep.scenario.hardware
    out = {"tensor_parallel": hw.tensor_parallel, "data_parallel": hw.data_parallel,
           "expert_parallel": hw.expert_parallel, "comm_s": None, "comm_share": None}
    seconds = getattr(latency, "comm_seconds", None)
    if seconds is None or steps.empty:
        return out
    comm = float(seconds(steps["batch_tokens"].to_numpy()).sum())
    busy = float(steps["duration_s"].sum())
    out["comm_s"] = comm
    out["comm_share"] = comm / busy if busy > 0 else 0.0
    return out


def run_disaggregation(scn: Scenario, specs, on_progress: Callable[[int], None] | None = None):
    """Simulate the scenario's ``disaggregation`` section (sim.disaggregation); returns
    (requests, steps, summary, meta) as :func:`run_policy` does."""
    from sim.disaggregation.run import run_disaggregated

    end_s, capped = time_limit(scn, specs)
    requests, steps, summary, meta, top = run_disaggregated(
        scn, specs, knobs_of=policy_knobs, end_s=end_s, on_progress=on_progress,
        horizon_reason=cap_reason(end_s) if capped and end_s is not None else HORIZON_REACHED,
        clients=send_plan(scn, specs), drain_s=DEFAULT_DRAIN_S, cap_reason=cap_reason)
    if end_s is None:
        end_s = top.end_s
    summary.update(end_report(requests, end_s, capped))
    return requests, steps, summary, meta


def end_report(requests: pd.DataFrame, end_s: float, capped: bool) -> dict:
    """How the run ended, for the summary (fixed keys, so sweep tables keep one schema):

    * ``stopped``: ``drained`` (every request ended), ``horizon`` (horizon_s reached), ``time cap``
      (the default cap reached) or ``stuck`` (the policy could not schedule what was left);
    * ``end_s``: the simulated time it stopped at (null when drained or stuck);
    * ``backlog``: what was left (:func:`backlog`);
    * ``unfinished_reasons``: unfinished requests counted by why: ``horizon``, ``time_cap``,
      ``stuck``.
    """
    reasons = requests.loc[requests["state"] == "unfinished", "reason"]
    timed_out = (reasons == HORIZON_REACHED) | reasons.str.startswith("simulated-time cap")
    n_out, n_stuck = int(timed_out.sum()), int((~timed_out).sum())
    if reasons.empty:
        stopped = "drained"
    elif n_out:
        stopped = "time cap" if capped else "horizon"
    else:
        stopped = "stuck"
    stop_s = end_s if stopped in ("horizon", "time cap") else None
    return {
        "stopped": stopped,
        "end_s": stop_s,
        "backlog": backlog(requests, stop_s),
        "unfinished_reasons": {"horizon": 0 if capped else n_out, "time_cap": n_out if capped else 0,
                               "stuck": n_stuck},
    }


def run(scenario, overrides=(), policies: list[str] | None = None, progress=False) -> RunResult:
    """Run every policy entry of a scenario (or only the given labels) on the same workload.
    ``progress``: True shows a bar; a search passes its reporter (``sim.planning.progress``)."""
    scn = load_scenario(scenario, list(overrides))
    entries = [e for e in scn.policies if policies is None or (e.label or e.name) in policies]
    if policies is not None:
        from sim.errors import CbsimError, nearest

        known = [e.label or e.name for e in scn.policies]
        if scn.disaggregation is not None:
            known.append(scn.disaggregation.name)
        for label in policies:
            if label not in known:
                raise CbsimError(f"--policy {label!r} is not in the scenario{nearest(label, known)}; "
                                 f"its policies are: {', '.join(known)}")
    specs = build_workload(scn)
    cuts = workload_cuts(specs)
    dep = resolve(scn)
    req_frames, step_frames, summaries, meta = [], [], {}, {}
    dis = scn.disaggregation
    with_dis = dis is not None and (policies is None or dis.name in policies)
    runs = len(entries) + with_dis
    bar = _progress(progress, len(specs) * runs)
    with bar as tracker:
        for i, entry in enumerate([*entries, *([dis] if with_dis else [])]):
            label = dis.name if entry is dis else entry.label or entry.name
            tick = tracker.ticker(f"{label} (policy {i + 1} of {runs})") if tracker else None
            if entry is dis:
                requests, steps, summary, m = run_disaggregation(scn, specs, tick)
            else:
                # the last entry's run lets the workload go once its frames are built
                requests, steps, summary, m = run_policy(dep, entry, specs, tick, release=i == runs - 1)
            if tracker:
                tracker.flush()
            requests.insert(0, "policy", label)
            steps.insert(0, "policy", label)
            req_frames.append(requests)
            step_frames.append(steps)
            summary["workload_cuts"] = cuts
            summaries[label] = summary
            meta[label] = m
    return RunResult(
        scenario=scn,
        requests=_concat(req_frames),
        steps=_concat(step_frames),
        summaries=summaries,
        meta=meta,
    )


def workload_cuts(specs) -> dict[str, int]:
    """What the workload changed in its requests, and in how many (``RequestSpec.cut``: synthetic
    prompts clipped to the context), so a run never changes a request without saying so."""
    from collections import Counter

    cut = getattr(specs, "cut", None)  # sim.workload.spec_columns: one reason, a mask
    if cut is not None:
        return {specs.cut_reason: int(cut.sum())} if cut.any() else {}
    return dict(Counter(s.cut for s in specs if s.cut))


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The policies' frames one after another; one frame as it is (``pd.concat`` would copy every
    column: the largest allocation of a long run, at its peak)."""
    if len(frames) == 1:
        return frames[0]
    return pd.concat(frames, ignore_index=True)


class _NoProgress:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class _RichProgress:
    """A rich progress bar over requests ended, one line per run."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Column

        # On a narrow terminal the label is cut (ellipsis) and the bar shrinks; the count never is:
        # "2000/20..." reads as a wrong total.
        count = len(f"{total}/{total}")
        self.progress = Progress(
            TextColumn("{task.description}", table_column=Column(overflow="ellipsis", no_wrap=True, ratio=1)),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
            MofNCompleteColumn(table_column=Column(no_wrap=True, min_width=count)),
            TextColumn("requests", table_column=Column(no_wrap=True, min_width=8)),
            TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=7)), transient=False)
        self.task = None
        self.total = total

    def __enter__(self):
        self.progress.__enter__()
        self.task = self.progress.add_task("simulating", total=self.total)  # requests × policies
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def ticker(self, label: str):
        self.progress.update(self.task, description=f"simulating {label}")
        self.pending = 0

        def tick(n: int) -> None:
            self.pending += n
            if self.pending >= 256:
                self.flush()

        return tick

    def flush(self) -> None:
        self.progress.advance(self.task, self.pending)
        self.pending = 0


def _progress(enabled, total: int):
    """True: this run's own bar; a search's reporter (``sim.planning.progress.Reporter``): its bar."""
    if hasattr(enabled, "run_bar"):
        return enabled.run_bar(total) or _NoProgress()
    return _RichProgress(total) if enabled else _NoProgress()
