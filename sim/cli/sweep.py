"""``cbsim sweep X.yaml --rates 2:40:2``: one run per point, a table and a latency-versus-load plot."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app


@app.command("sweep")
def sweep_cmd(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    rates: str = typer.Option(None, "--rates", help="arrival rates: START:STOP:STEP (stop included) or R1,R2,..."),
    vary: str = typer.Option(None, "--vary", help="any field's values: FIELD=V1,V2,... (e.g. "
                             "engine.max_num_batched_tokens=2048,4096,8192); with --rates: every value at every rate"),
    out: Path = typer.Option(None, "--out", "-o", help="output folder (default: results/<scenario name>-sweep)"),
    backend: str = typer.Option("local", "--backend", help="local (processes on this machine) or ray"),
    ray_address: str = typer.Option(None, "--ray-address", help="an existing Ray cluster (with --backend ray); "
                                    "default: start a local Ray instance"),
    workers: int = typer.Option(None, "--workers", "-j", help="parallel runs (default: min(points, CPUs))"),
    set_: list[str] = typer.Option(None, "--set", help="override a field for every point: a.b.c=value"),
    policy: list[str] = typer.Option(None, "--policy", "-p", help="only this policy label (repeatable)"),
    no_plot: bool = typer.Option(False, "--no-plot", help="skip latency_vs_load.png"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
):
    """Run a scenario at many arrival rates (or values of any field); skip points already in --out."""
    from rich.console import Console

    from sim.planning.sweep import make_points, parse_rates, parse_vary, sweep
    from sim.scenario.schema import load_scenario

    console = Console()
    points = make_points(parse_rates(rates) if rates else None, parse_vary(vary) if vary else None)
    scn = load_scenario(scenario, list(set_ or []))
    target = out or Path("results") / f"{scn.name}-sweep"
    res = sweep(scn, points, target, policies=policy or None, backend=backend, workers=workers,
                ray_address=ray_address, progress=not quiet, plot=not no_plot)
    console.print(sweep_table(res.table, scn))
    console.print(f"{res.ran} point(s) simulated, {res.skipped} already on disk; table: {target / 'sweep.parquet'}"
                  + (f"; plot: {res.plot}" if res.plot else ""), highlight=False)


def sweep_table(table, scn):
    from rich.table import Table

    t = Table(title=f"{scn.name}: sweep", header_style="bold")
    extra = [c for c in table.columns[: list(table.columns).index("policy")] if c not in ("point", "key")]
    for c in extra:
        t.add_column(c, justify="right")
    t.add_column("policy")
    for c in ("TTFT p50/p99 (ms)", "TPOT p50/p99 (ms)", "throughput (req/s)", "goodput (req/s)", "meets SLO"):
        t.add_column(c, justify="right")
    for _, row in table.iterrows():
        t.add_row(*[_fmt(row[c]) for c in extra], str(row["policy"]),
                  f"{_ms(row['ttft_s.p50'])} / {_ms(row['ttft_s.p99'])}",
                  f"{_ms(row['tpot_s.p50'])} / {_ms(row['tpot_s.p99'])}",
                  _fmt(row["throughput_rps"]), _fmt(row["goodput_rps"]),
                  {True: "yes", False: "NO"}.get(_bool(row["slo_met"]), "-"))
    return t


def _bool(v):
    return None if v is None or v != v else bool(v)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return _readable(v) if isinstance(v, float) else str(v)


def _ms(v) -> str:
    return "-" if v is None or v != v else _readable(v * 1e3)


def _readable(x: float) -> str:
    """As `cbsim run` prints numbers: no exponents (a 100 s TTFT reads 100,000, not 1e+05)."""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.4g}"
