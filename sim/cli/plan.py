"""``cbsim plan X.yaml --target-rate R``: replicas needed to meet the SLO at R, and their cost."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli import search_options as shared
from sim.cli.app import app


@app.command("plan")
def plan_cmd(
    scenario: shared.ScenarioArg,
    target_rate: float = typer.Option(None, "--target-rate", "-r", help="peak arrival rate to serve (req/s); "
                                      "required unless the scenario's clients are closed-loop"),
    target_concurrency: int = typer.Option(None, "--target-concurrency", help="closed-loop clients to serve "
                                           "(workload.arrival.process: closed); default: "
                                           "workload.arrival.concurrency"),
    max_replicas: int = typer.Option(64, "--max-replicas", help="give up above this many replicas"),
    policy: shared.PolicyOpt = None,
    json_out: Path = typer.Option(None, "--json", help="also write the plans to this JSON file (- for stdout, "
                                  "the table then on stderr)"),
    set_: shared.SetOpt = None,
    workers: int = typer.Option(None, "--workers", "-j", help="policies planned in parallel (default: "
                                "min(policies, CPUs)); with --disaggregated, worker processes that run "
                                "independent probes beside the search (default 2; 1: one process)"),
    backend: shared.BackendOpt = "local",
    ray_address: shared.RayAddressOpt = None,
    seeds: shared.SeedsOpt = 3,
    disaggregated: bool = typer.Option(False, "--disaggregated", help="plan the scenario's disaggregation "
                                       "section: the cheapest xPyD split against its colocated policies on "
                                       "the same GPUs (--max-replicas bounds each pool)"),
    tp: str = typer.Option(None, "--tp", help="with --disaggregated: tensor-parallel sizes to try for each "
                           "pool and the colocated layouts, e.g. 1,2,4 (default: as the scenario sets them)"),
):
    """Smallest number of replicas (with the scenario's router) meeting the SLO at --target-rate."""
    from rich.table import Table

    from sim.cli.output import console_for, show_table, widen_when_piped
    from sim.planning.plan import plan

    console = console_for(shared.json_to_stdout(json_out))
    scn = shared.load(scenario, set_)
    shared.check_json(json_out)  # before the search: a bad path must not cost it
    from sim.planning.capacity import is_closed_loop

    if disaggregated or tp is not None:
        from sim.cli.plan_disaggregated import print_disaggregated_plan
        from sim.errors import CbsimError

        if is_closed_loop(scn) or target_rate is None:
            raise CbsimError("--disaggregated plans an open-loop --target-rate; closed-loop clients "
                             "(workload.arrival.process: closed) are planned without --disaggregated")
        print_disaggregated_plan(console, scn, target_rate, max_replicas, tp, policy, json_out, workers, seeds)
        return
    closed = is_closed_loop(scn)
    load = (f"{target_concurrency or scn.workload.arrival.concurrency} closed-loop clients" if closed
            else f"{target_rate:g} req/s" if target_rate is not None else "?")
    with shared.search_display(console, scn, policy, workers, backend, f"planning for {load}", seeds=seeds):
        plans = plan(scn, target_rate, policies=policy or None, max_replicas=max_replicas, workers=workers,
                     backend=backend, ray_address=ray_address, target_concurrency=target_concurrency,
                     seeds=seeds)
    price = scn.cost_per_gpu_hour
    t = Table(title=f"{scn.name}: {load} on {scn.hardware.gpu} "
                    f"({scn.hardware.count} GPU(s) per replica, router {scn.replicas.router})",
              header_style="bold")
    cols = ["policy", "replicas", "GPUs", "GPU-h per h"]
    if price is not None:
        cols += ["cost per h", "cost per 1M req"]
    cols += ["per replica req/s", "offered/achieved", "p99 TTFT s", "p99 TPOT ms", f"spread over {seeds} seed(s)",
             "runs"]
    for c in cols:
        t.add_column(c, justify="left" if c == "policy" else "right")
    for label, p in plans.items():
        if p.replicas is None:
            row = [label, f"> {p.max_replicas}", "-", "-"] + (["-", "-"] if price is not None else [])
            row += ["-", "-", "-", "-", "-"]
        else:
            s = p.summary.get("steady") or {}
            row = [label, str(p.replicas), str(p.gpus), f"{p.gpu_hours_per_hour:g}"]
            if price is not None:
                row += [f"{p.cost_per_hour:,.2f}", f"{p.cost_per_million_requests:,.2f}"]
            row += [_num(p.per_replica_rps), f"{_num(p.offered_rps)} / {_num(p.achieved_rps)}",
                    _num(s.get("ttft_s", {}).get("p99")), _num(s.get("tpot_s", {}).get("p99"), 1e3),
                    shared.spread_text(p.spread)]
        t.add_row(*row, str(p.runs))
    widen_when_piped(console, t)
    show_table(console, t)
    for label, p in plans.items():
        if closed:
            console.print(f"{label}: closed loop, served at {_num(p.achieved_rps)} req/s (steady finish rate; the "
                          f"cost figures use it)", highlight=False)
            continue
        sat = "not measurable" if p.saturated_rps is None else f"{p.saturated_rps:.4g} req/s"
        size = f"; verdict from runs of {p.probe_requests:,} requests" if p.probe_requests else ""
        console.print(f"{label}: saturated throughput per replica {sat}{size}", highlight=False)
        if p.replicas is not None:
            console.print(f"{label}: {p.replicas} replica(s) judged at {p.per_replica_rps:.4g} req/s each; spread "
                          f"{shared.spread_text(p.spread)}", highlight=False, soft_wrap=True)
    for n in plan_notes(plans) + [n for label, p in plans.items()
                                  for n in shared.spread_notes(label, p.spread, _bound(scn, p.spread))]:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
    if any(p.replicas and p.replicas > 1 for p in plans.values()):
        console.print(replicas_line(scn.replicas.router), highlight=False, soft_wrap=True)
    if seeds > 1:
        console.print(f"seeds: every count judged at seeds {scn.seed}-{scn.seed + seeds - 1} and met only when every "
                      f"seed met (in order: the first seed that missed ends a count's probe); spread = the binding "
                      f"percentile's min-max over them at the chosen count",
                      highlight=False, soft_wrap=True)
    console.print(f"replicas = fewest meeting the SLO in steady state (one fewer violates it: simulated, or each replica "
                  f"would get more than its saturated throughput). Latencies and offered/achieved rates: requests "
                  f"arriving after warm-up and before drain. GPUs = replicas × hardware.count; cost = GPUs × "
                  f"cost_per_gpu_hour for each hour at {load}"
                  + ("" if price is not None else " (set cost_per_gpu_hour for money figures)"), highlight=False,
                  soft_wrap=True)
    shared.write_json(console, json_out, {"scenario": scn.name, "target_rate_rps": target_rate,
                                          "target_concurrency": plans and next(iter(plans.values())).target_concurrency,
                                          "policies": {k: v.to_dict() for k, v in plans.items()}})


def replicas_line(router: str) -> str:
    """Why n replicas pass at a per-replica rate above one replica's capacity (sim.planning.plan)."""
    how = ("round-robin gives each replica every n-th arrival, whose gaps are far more regular (cv 1/√n) than "
           "one Poisson stream's" if router == "round-robin" else
           f"the {router} router sends each arrival where there is room, which evens the replicas' queues")
    return (f"replicas: {how}, so queues stay shorter and n replicas can each pass at a rate (per replica req/s, "
            f"the rate each was judged at) above what one replica alone sustains")


def _bound(scn, spread: dict | None):
    return getattr(scn.slo, spread["metric"], None) if spread else None


def _num(v, scale: float = 1.0) -> str:
    return "-" if v is None else f"{v * scale:.3g}"


def plan_notes(plans) -> list[str]:
    """One warning per policy whose verdict did not settle within the probe-size bound."""
    notes = []
    for label, p in plans.items():
        if not p.stable:
            counts = ", ".join(str(k) for k in p.unstable_counts)
            notes.append(f"{label}: with {counts} replica(s) the verdict still changed between the two largest probe "
                         "sizes (up to 32 × workload.num_requests): the count is uncertain; raise "
                         "workload.num_requests")
    return notes


def short_run_notes(scn, plans, target_rate: float) -> list[str]:
    """Say when each replica sees too few requests for one replica fewer to show its overload
    (the finite-run caveat of sim.planning.capacity, with the load step of removing one replica)."""
    from sim.planning.capacity import min_requests
    from sim.workload.synthetic import build_workload

    notes = []
    total = len(build_workload(scn))
    for label, p in plans.items():
        if not p.replicas or p.replicas < 2:
            continue
        per_replica = total / p.replicas
        step = 1 / (p.replicas - 1)  # load added per replica when one is removed
        need = min_requests(scn.slo, target_rate / (p.replicas - 1), step)
        if need is not None and per_replica < need:
            notes.append(f"{label}: each of the {p.replicas} replicas sees about {per_replica:.0f} requests; "
                         f"{p.replicas - 1} replicas need about {need} each to show their overload, so the "
                         "answer may be too low: raise workload.num_requests")
    return notes
