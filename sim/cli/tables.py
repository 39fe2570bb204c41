"""``cbsim tables``: the latency tables shipped with cbsim, by the name a scenario gives them."""

from __future__ import annotations

import typer

from sim.cli.app import app


@app.command("tables")
def tables_cmd(
    json_: bool = typer.Option(False, "--json", help="print every shipped table's facts as JSON on stdout"),
):
    """List the shipped latency tables (latency: {backend: table, name: NAME}) with GPU, model, TP, dtype,
    engine version and measured error."""
    from rich.table import Table

    from sim.cli.output import console_for, print_json, show_table
    from sim.latency.shipped import shipped_tables, shipped_tables_dir

    facts = [t.facts() for t in shipped_tables()]
    if json_:
        print_json(facts)
        return
    console = console_for(False)
    t = Table(title="shipped latency tables (scenario key latency: {backend: table, name: NAME})",
              title_justify="left", header_style="bold")
    for col in ("name", "GPU", "model", "TP", "dtype", "source", "engine", "held-out error or AIConfigurator agreement (mean / p90)",
                "real serving runs, median |error| TTFT / TPOT"):
        t.add_column(col, justify="right" if col == "TP" else "left")
    for f in facts:
        engine = " ".join(str(x) for x in (f["engine"], f["engine_version"]) if x) or "-"
        err = ("-" if f["heldout_mean_abs_rel"] is None else
               f"{100 * f['heldout_mean_abs_rel']:.1f} % / {100 * (f['heldout_p90_abs_rel'] or 0):.1f} % "
               f"(n={f['heldout_n']})")
        corpus = ("-" if f["corpus_rows"] is None else
                  f"{100 * (f['corpus_ttft_median_abs'] or 0):.0f} % / {100 * (f['corpus_tpot_median_abs'] or 0):.0f} % "
                  f"(n={f['corpus_rows']})")
        t.add_row(f["name"], str(f["gpu"] or "-"), str(f["model"] or "-"), str(f["tensor_parallel"] or "-"),
                  str(f["dtype"] or "-"), str(f["source"] or "-"), engine, err, corpus)
    show_table(console, t)
    say = {"highlight": False, "soft_wrap": True, "markup": False}
    for on in sorted({f["heldout_measured_on"] for f in facts if f["heldout_measured_on"]}):
        console.print(f"held-out error (or agreement) measured on: {on}", **say)
    for lim in sorted({f["known_limits"] for f in facts if isinstance(f["known_limits"], str)}):
        console.print(f"known limits: {lim}", **say)
    console.print(f"folder: {shipped_tables_dir() or '(none: calib/tables/ is missing from this install)'}; "
                  "accuracy against real GPU runs: docs/accuracy.md; against the serving corpus (other models "
                  "on the table's GPU and engine): docs/accuracy-corpus.md", **say)
