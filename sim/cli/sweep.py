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
    json_out: Path = typer.Option(None, "--json", help="also write sweep.parquet's rows to this JSON file (- for "
                                  "stdout, the table then on stderr)"),
):
    """Run a scenario at many arrival rates (or values of any field); skip points already in --out."""
    from sim.cli import search_options as shared
    from sim.cli.output import console_for, show_table
    from sim.planning.sweep import make_points, parse_rates, parse_vary, sweep
    from sim.scenario.schema import load_scenario

    console = console_for(shared.json_to_stdout(json_out))
    shared.check_json(json_out)
    points = make_points(parse_rates(rates) if rates else None, parse_vary(vary) if vary else None)
    scn = load_scenario(scenario, list(set_ or []))
    target = out or Path("results") / f"{scn.name}-sweep"
    res = sweep(scn, points, target, policies=policy or None, backend=backend, workers=workers,
                ray_address=ray_address, progress=not quiet and not shared.json_to_stdout(json_out), plot=not no_plot)
    t = sweep_table(res.table, scn)
    show_table(console, t)
    from sim.planning.crossing import speculation_crossings

    for crossing in speculation_crossings(res.table, scn):  # speculative entries vs their baselines
        console.print("speculation: " + crossing.sentence(), highlight=False)
    console.print(f"{res.ran} point(s) simulated, {res.skipped} already on disk; table: {target / 'sweep.parquet'}"
                  + (f"; plot: {res.plot}" if res.plot else ""), highlight=False, soft_wrap=True)
    import json

    # the rows of sweep.parquet, every column as numbers (NaN as null), not the table's text
    shared.write_json(console, json_out, {"scenario": scn.name, "table": str(target / "sweep.parquet"),
                                          "rows": json.loads(res.table.to_json(orient="records"))})


def sweep_table(table, scn):
    """One row per point and policy: steady-state latencies (warm-up and drain left out; the whole
    run's where a point's window is too short, marked *), offered vs achieved rate, the verdict."""
    from rich.table import Table

    from sim.planning.sweep import steady_column, verdicts

    t = Table(title=f"{scn.name}: sweep (steady state)", header_style="bold")
    extra = [c for c in table.columns[: list(table.columns).index("policy")] if c not in ("point", "key")]
    for c in extra:
        t.add_column(c, justify="right")
    t.add_column("policy")
    for c in ("TTFT p50/p99 (ms)", "TPOT p50/p99 (ms)", "offered / achieved (req/s)", "goodput (req/s)",
              "meets SLO"):
        t.add_column(c, justify="right")
    cols = {name: steady_column(table, name) for name in ("ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99",
                                                          "goodput_rps")}
    met = verdicts(table)
    short = table["steady.too_short"] if "steady.too_short" in table else None
    fmt = {c: _column_format(table[c]) for c in extra}
    for i, row in table.iterrows():
        mark = "*" if short is not None and bool(short[i]) else ""
        t.add_row(*[fmt[c](row[c]) for c in extra], str(row["policy"]),
                  f"{_ms(cols['ttft_s.p50'][i])} / {_ms(cols['ttft_s.p99'][i])}{mark}",
                  f"{_ms(cols['tpot_s.p50'][i])} / {_ms(cols['tpot_s.p99'][i])}{mark}",
                  f"{_fmt(row.get('steady.offered_rps'))} / {_fmt(row.get('steady.achieved_rps'))}",
                  _fmt(cols["goodput_rps"][i]),
                  {True: "yes", False: "NO"}.get(_bool(met[i]), "-") + mark)
    if short is not None and short.astype(bool).any():
        t.caption = ("* steady window too short (fewer than 10 service times or 200 requests after warm-up and "
                     "before drain): whole-run figures; raise workload.num_requests")
    return t


def _column_format(col):
    """One format for a whole column: integers as integers, otherwise the fewest decimals that
    show every value (a rate column reads 8, 12, 16 or 2.5, 5.0, 7.5, never 8 and 12.0)."""
    values = [v for v in col if isinstance(v, int | float) and not isinstance(v, bool) and v == v]
    if not values or len(values) != len([v for v in col if v is not None]):
        return _fmt
    for decimals in range(0, 5):
        if all(abs(round(v, decimals) - v) < 1e-9 * max(1.0, abs(v)) for v in values):
            return lambda v, d=decimals: "-" if v is None or v != v else f"{v:,.{d}f}"
    return _fmt


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
