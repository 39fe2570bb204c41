"""``cbsim capacity X.yaml``: per policy, the highest arrival rate that meets the SLO; a scenario's
disaggregated entry (``disaggregation.label``) gets a row of its own, its whole topology searched
as one unit."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli import search_options as shared
from sim.cli.app import app


@app.command("capacity")
def capacity_cmd(
    scenario: shared.ScenarioArg,
    tolerance: float = typer.Option(0.02, "--tolerance", help="relative precision of the answer (0.02 = 2 %)"),
    policy: shared.PolicyOpt = None,
    json_out: Path = typer.Option(None, "--json", help="also write the results (with every probe) to this JSON file "
                                  "(- for stdout, the table then on stderr)"),
    set_: shared.SetOpt = None,
    workers: int = shared.workers_option("searched"),
    backend: shared.BackendOpt = "local",
    ray_address: shared.RayAddressOpt = None,
    seeds: shared.SeedsOpt = 3,
):
    """Find each policy's capacity (and the disaggregated topology's): bracketing and bisection over the
    arrival rate, to --tolerance."""
    from rich.table import Table

    from sim.cli.output import console_for, show_table, widen_when_piped
    from sim.planning.capacity import capacity

    console = console_for(shared.json_to_stdout(json_out))
    scn = shared.load(scenario, set_)
    shared.check_json(json_out)  # before the search: a bad path must not cost it
    with shared.search_display(console, scn, policy, workers, backend, f"searching capacity to ±{tolerance:.1%}",
                               disaggregated=True, seeds=seeds):
        results = capacity(scn, policies=policy or None, tolerance=tolerance, workers=workers,
                           backend=backend, ray_address=ray_address, seeds=seeds)
    slo = scn.slo
    bounds = ", ".join(f"{k.removesuffix('_s').upper()} ≤ {getattr(slo, k):g} s"
                       for k in ("ttft_s", "tpot_s", "e2e_s") if getattr(slo, k) is not None)
    t = Table(title=f"{scn.name}: steady-state capacity under p{slo.percentile:g} {bounds}", header_style="bold")
    if any(r.concurrency is not None for r in results.values()):
        _closed_loop_table(console, t, scn, results, json_out, tolerance)
        return
    for c in ("policy", "GPUs", "max rate (req/s)", "offered / achieved there", "goodput there (req/s)",
              "saturated (req/s)", f"violated at +{tolerance:.0%}", f"spread over {seeds} seed(s)",
              "probe requests", "runs"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    notes = []
    for label, r in results.items():
        t.add_row(f"{label} (disaggregated)" if r.disaggregated else label, "-" if r.gpus is None else str(r.gpus), f"{r.rate_rps:.4g}", f"{_rate(r.offered_rps)} / {_rate(r.achieved_rps)}",
                  f"{r.goodput_rps:.4g}", _rate(r.saturated_rps), f"{r.violating_rate_rps:.4g}",
                  shared.spread_text(r.spread), f"{r.probe_requests:,}", str(r.runs))
        notes += capacity_notes(label, r, tolerance)
        notes += shared.spread_notes(label, r.spread, getattr(scn.slo, r.spread["metric"], None) if r.spread else None)
    widen_when_piped(console, t)
    show_table(console, t)
    for label, r in results.items():
        if seeds > 1:
            console.print(f"{label}: spread at {r.rate_rps:.4g} req/s {shared.spread_text(r.spread)}",
                          highlight=False, soft_wrap=True)
    console.print(steady_rule_line(scn.workload.num_requests), highlight=False)
    if seeds > 1:
        console.print(f"seeds: every probed rate judged at seeds {scn.seed}-{scn.seed + seeds - 1} and met only when "
                      f"every seed met (in order: the first seed that missed ends a rate's probe); spread = the binding "
                      f"percentile's min-max over them at the max rate",
                      highlight=False)
    if scn.replicas.count > 1 or any(r.disaggregated for r in results.values()):
        console.print("saturated: one replica's burst finish rate × replicas.count (colocated); the burst's finish "
                      "rate through the whole topology, prefill pool, links and decode pool (disaggregated)",
                      highlight=False)
    for n in notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
    shared.write_json(console, json_out, {"scenario": scn.name, "tolerance": tolerance,
                                          "policies": {k: v.to_dict() for k, v in results.items()}})


def _rate(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def steady_rule_line(num_requests) -> str:
    """How every figure above was measured (sim.metrics.steady, sim.planning.probe)."""
    return ("steady state: latencies, goodput and offered/achieved rates are those of requests arriving after "
            "warm-up and before drain (cut = max(10 % of the arrival span, median service time)); each probe "
            f"doubles from {num_requests} requests until its window spans 10 service times and two sizes agree; "
            "rates at or above the saturated throughput (all requests at once) violate without a run")


def capacity_notes(label: str, r, tolerance: float) -> list[str]:
    """Warnings a planner must read: a non-monotone boundary, probes whose verdict never settled."""
    notes = []
    if not r.monotone:
        notes.append(f"{label}: a run at {r.rate_rps * (1 - tolerance):.4g} req/s (−{tolerance:.0%}) violates "
                     f"the SLO although {r.rate_rps:.4g} meets it: the meets-SLO curve is not monotone here")
    if not r.stable:
        rates = ", ".join(f"{x:.4g}" for x in r.unstable_rates)
        notes.append(f"{label}: the verdict at {rates} req/s still changed between the two largest probe sizes "
                     f"(up to 32 × workload.num_requests): the answer is uncertain near there; raise "
                     f"workload.num_requests")
    return notes


def _closed_loop_table(console, t, scn, results, json_out, tolerance: float) -> None:
    """Closed-loop clients: the highest concurrency meeting the SLO (sim.planning.concurrency)."""
    for c in ("policy", "GPUs", "max concurrency", "violated at", "throughput there (req/s)",
              "goodput there (req/s)", "probe requests", "runs"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    notes = []
    for label, r in results.items():
        t.add_row(f"{label} (disaggregated)" if r.disaggregated else label, "-" if r.gpus is None else str(r.gpus),
                  str(r.concurrency), str(r.violating_concurrency), _rate(r.achieved_rps or r.throughput_rps),
                  f"{r.goodput_rps:.4g}", f"{r.probe_requests:,}", str(r.runs))
        if not r.stable:
            notes.append(f"{label}: the verdict at {', '.join(f'{x:g}' for x in r.unstable_rates)} clients still "
                         f"changed between the two largest probe sizes: raise workload.num_requests")
    console.print(t)
    console.print("closed loop: each probe runs workload.arrival.concurrency clients (at least 8 requests each), "
                  "judged on its steady window (warm-up and drain left out); the search doubles or halves the "
                  f"concurrency, then bisects to ±{tolerance:.0%} (at least one client)", highlight=False)
    for n in notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
    shared.write_json(console, json_out, {"scenario": scn.name, "tolerance": tolerance,
                                          "policies": {k: v.to_dict() for k, v in results.items()}})
