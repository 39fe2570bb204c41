"""``cbsim models``: every model id cbsim knows, and every ``ORG/NAME`` that resolves locally."""

from __future__ import annotations

import typer

from sim.cli.app import app


def model_rows(all_: bool) -> tuple[list[dict], int]:
    """One mapping per model (built in, then every local config.json cbsim can price; with ``all_``
    also those it cannot, with the reason) and how many configs were left out."""
    from sim.errors import CbsimError
    from sim.hardware.model_sources import available_models
    from sim.hardware.models import MODELS, from_hf_config

    rows = [{"model": name, "source": "built in", "layers": spec.num_layers,
             "params_b": round(spec.num_params() / 1e9, 2), "experts": None, "experts_per_token": None,
             "notes": spec.dtype, "priced": True} for name, spec in MODELS.items()]
    skipped = 0
    for src in available_models():
        try:
            spec = from_hf_config(src.path, name=src.name)
        except CbsimError as exc:
            skipped += 1
            if all_:
                rows.append({"model": src.name, "source": src.origin, "layers": None, "params_b": None,
                             "experts": None, "experts_per_token": None, "priced": False,
                             "notes": f"not priced: {str(exc).split(': ', 1)[-1]}"})
            continue
        notes = ", ".join(x for x in (spec.dtype, spec.quantization,
                                      f"window {spec.sliding_window} on {spec.num_sliding_layers} layers"
                                      if spec.sliding_window else None) if x)
        rows.append({"model": src.name, "source": src.origin, "layers": spec.num_layers,
                     "params_b": round(spec.num_params() / 1e9, 2),
                     "experts": spec.num_experts if spec.is_moe else None,
                     "experts_per_token": spec.num_experts_per_tok if spec.is_moe else None,
                     "notes": notes, "priced": True})
    return rows, skipped


@app.command("models")
def models_cmd(
    all_: bool = typer.Option(False, "--all", help="also list local configs cbsim cannot price, with the reason"),
    json_: bool = typer.Option(False, "--json", help="print the list as JSON on stdout (nothing else there)"),
):
    """List model ids and the ORG/NAME configs found locally (aiconfigurator-core, Hugging Face cache)."""
    from rich.table import Table

    from sim.cli.output import console_for, print_json, show_table
    from sim.hardware.model_sources import aiconfigurator_configs_dir, hf_cache_dir

    rows, skipped = model_rows(all_)
    if json_:
        print_json(rows)
        return
    console = console_for(False)
    t = Table(title="models (scenario key model:)", title_justify="left", header_style="bold")
    for col in ("model", "source", "layers", "params", "experts", "notes"):
        # the id is never cut: it is what a scenario's model: key takes
        t.add_column(col, no_wrap=col == "model", overflow="fold" if col != "model" else "ignore")
    for r in rows:
        experts = f"{r['experts']} (top {r['experts_per_token']})" if r["experts"] else "-"
        t.add_row(r["model"], r["source"], "-" if r["layers"] is None else str(r["layers"]),
                  "-" if r["params_b"] is None else f"{r['params_b']:.2f}B", experts, r["notes"])
    show_table(console, t, stacked="line")
    folder = aiconfigurator_configs_dir()
    console.print(f"searched: {folder or 'aiconfigurator-core (not installed)'}; {hf_cache_dir()} (never the network)"
                  + (f"; {skipped} config(s) of architectures cbsim cannot price left out (--all lists them)"
                     if skipped and not all_ else ""), highlight=False, soft_wrap=True)
