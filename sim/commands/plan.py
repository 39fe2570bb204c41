"""``cbsim plan X.yaml --target-rate R``: replicas needed to meet the SLO at R, and their cost."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sim.cli import app


@app.command("plan")
def plan_cmd(
    scenario: Path = typer.Argument(..., help="scenario YAML file (with an slo: section)"),
    target_rate: float = typer.Option(..., "--target-rate", "-r", help="peak arrival rate to serve (req/s)"),
    max_replicas: int = typer.Option(64, "--max-replicas", help="give up above this many replicas"),
    policy: list[str] = typer.Option(None, "--policy", "-p", help="only this policy label (repeatable)"),
    json_out: Path = typer.Option(None, "--json", help="also write the plans to this JSON file"),
    set_: list[str] = typer.Option(None, "--set", help="override a field: a.b.c=value"),
    workers: int = typer.Option(None, "--workers", "-j", help="policies planned in parallel (default: min(policies, CPUs))"),
    backend: str = typer.Option("local", "--backend", help="local or ray"),
    ray_address: str = typer.Option(None, "--ray-address", help="an existing Ray cluster (with --backend ray)"),
):
    """Smallest number of replicas (with the scenario's router) meeting the SLO at --target-rate."""
    from rich.console import Console
    from rich.table import Table

    from sim.plan import plan
    from sim.scenario import load_scenario

    console = Console()
    scn = load_scenario(scenario, list(set_ or []))
    with console.status(f"planning for {target_rate:g} req/s ..."):
        plans = plan(scn, target_rate, policies=policy or None, max_replicas=max_replicas, workers=workers,
                     backend=backend, ray_address=ray_address)
    price = scn.cost_per_gpu_hour
    t = Table(title=f"{scn.name}: {target_rate:g} req/s on {scn.hardware.gpu} "
                    f"({scn.hardware.count} GPU(s) per replica, router {scn.replicas.router})",
              header_style="bold")
    cols = ["policy", "replicas", "GPUs", "GPU-h per h"]
    if price is not None:
        cols += ["cost per h", "cost per 1M req"]
    cols += ["p99 TTFT s", "p99 TPOT ms", "runs"]
    for c in cols:
        t.add_column(c, justify="left" if c == "policy" else "right")
    for label, p in plans.items():
        if p.replicas is None:
            row = [label, f"> {p.max_replicas}", "-", "-"] + (["-", "-"] if price is not None else []) + ["-", "-"]
        else:
            s = p.summary
            row = [label, str(p.replicas), str(p.gpus), f"{p.gpu_hours_per_hour:g}"]
            if price is not None:
                row += [f"{p.cost_per_hour:,.2f}", f"{p.cost_per_million_requests:,.2f}"]
            row += [f"{s['ttft_s']['p99']:.3g}", f"{s['tpot_s']['p99'] * 1e3:.3g}"]
        t.add_row(*row, str(p.runs))
    console.print(t)
    console.print(f"replicas = fewest meeting the SLO (one fewer was simulated too, and violates it). GPUs = replicas × "
                  f"hardware.count; cost = GPUs × cost_per_gpu_hour for each hour at {target_rate:g} req/s"
                  + ("" if price is not None else " (set cost_per_gpu_hour for money figures)"), highlight=False)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"scenario": scn.name, "target_rate_rps": target_rate,
                   "policies": {k: v.to_dict() for k, v in plans.items()}}
        json_out.write_text(json.dumps(payload, indent=2) + "\n")
        console.print(f"results: {json_out}", highlight=False)
