"""``cbsim capacity X.yaml``: per policy, the highest arrival rate that meets the SLO."""

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
    json_out: Path = typer.Option(None, "--json", help="also write the results (with every probe) to this JSON file"),
    set_: shared.SetOpt = None,
    workers: int = shared.workers_option("searched"),
    backend: shared.BackendOpt = "local",
    ray_address: shared.RayAddressOpt = None,
):
    """Find each policy's capacity: bracketing and bisection over the arrival rate, to --tolerance."""
    from rich.console import Console
    from rich.table import Table

    from sim.planning.capacity import capacity

    console = Console()
    scn = shared.load(scenario, set_)
    with console.status(f"searching capacity to ±{tolerance:.1%} ..."):
        results = capacity(scn, policies=policy or None, tolerance=tolerance, workers=workers,
                           backend=backend, ray_address=ray_address)
    slo = scn.slo
    bounds = ", ".join(f"{k.removesuffix('_s').upper()} ≤ {getattr(slo, k):g} s"
                       for k in ("ttft_s", "tpot_s", "e2e_s") if getattr(slo, k) is not None)
    t = Table(title=f"{scn.name}: capacity under p{slo.percentile:g} {bounds} "
                    f"({scn.workload.num_requests} requests per run)", header_style="bold")
    for c in ("policy", "max rate (req/s)", "goodput there (req/s)", "throughput (req/s)",
              f"violated at +{tolerance:.0%}", "runs"):
        t.add_column(c, justify="left" if c == "policy" else "right")
    notes = []
    for label, r in results.items():
        t.add_row(label, f"{r.rate_rps:.4g}", f"{r.goodput_rps:.4g}", f"{r.throughput_rps:.4g}",
                  f"{r.violating_rate_rps:.4g}", str(r.runs))
        if not r.monotone:
            notes.append(f"{label}: a run at {r.rate_rps * (1 - tolerance):.4g} req/s (−{tolerance:.0%}) violates "
                         f"the SLO although {r.rate_rps:.4g} meets it: the meets-SLO curve is not monotone here")
        if r.min_requests is not None and r.num_requests < r.min_requests:
            notes.append(f"{label}: {r.num_requests} requests are too few for ±{tolerance:.0%} at this rate "
                         f"(about {r.min_requests} needed): a short run hides an overload, so this is the "
                         f"capacity for bursts of {r.num_requests}; raise workload.num_requests")
    console.print(t)
    console.print(f"each rate meets the SLO and was simulated; so was rate × {1 + tolerance:g}, which violates it",
                  highlight=False)
    for n in notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
    shared.write_json(console, json_out, {"scenario": scn.name, "tolerance": tolerance,
                                          "policies": {k: v.to_dict() for k, v in results.items()}})
