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
                             "notes": f"not priced: {_reason(str(exc))}"})
            continue
        notes = ", ".join(x for x in (
            spec.dtype, spec.quantization, spec.expert_quantization and f"{spec.expert_quantization} experts",
            spec.is_mla and f"MLA (latent {spec.kv_lora_rank} + rope {spec.qk_rope_head_dim})",
            spec.first_k_dense_layers and f"first {spec.first_k_dense_layers} layer(s) dense",
            f"window {spec.sliding_window} on {spec.num_sliding_layers} layers" if spec.sliding_window else None,
            spec.attention_sinks and "sinks",
            spec.mtp_layers and f"{spec.mtp_layers} MTP layer(s): a draft for speculative.method mtp") if x)
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
    from sim.hardware.hf_config import UNSUPPORTED
    from sim.hardware.model_sources import SHIPPED_DIR, aiconfigurator_configs_dir, hf_cache_dir

    rows, skipped = model_rows(all_)
    if json_:
        print_json(rows)
        return
    console = console_for(False)
    t = Table(title="models (scenario key model:)", title_justify="left", header_style="bold")
    for col in ("model", "source", "layers", "params", "experts", "notes"):
        t.add_column(col)
    for r in rows:
        experts = f"{r['experts']} (top {r['experts_per_token']})" if r["experts"] else "-"
        t.add_row(r["model"], r["source"], "-" if r["layers"] is None else str(r["layers"]),
                  "-" if r["params_b"] is None else f"{r['params_b']:.2f}B", experts, r["notes"])
    show_table(console, t, stacked="line")  # the id is never cut: it is what a scenario's model: key takes
    if all_:
        left = Table(title="architectures cbsim leaves out (config.json `architectures`)", title_justify="left",
                     header_style="bold")
        left.add_column("architecture")
        left.add_column("why")
        for arch, why in sorted(UNSUPPORTED.items()):
            left.add_row(arch, why)
        left.add_row("(any) with NVFP4, AWQ, GPTQ weights", "only FP8 (all linear layers) and, for routed experts, "
                     "MXFP4 and INT4 group-32 weights are priced")
        show_table(console, left)
    folder = aiconfigurator_configs_dir()
    console.print(f"searched: {folder or 'aiconfigurator-core (not installed)'}; {hf_cache_dir()}; {SHIPPED_DIR} "
                  f"(never the network)"
                  + (f"; {skipped} config(s) of architectures cbsim cannot price left out (--all lists them)"
                     if skipped and not all_ else ""), highlight=False, soft_wrap=True)


def _reason(message: str) -> str:
    """The why of a config cbsim cannot price, without the file's path."""
    return message.split(": ", 1)[-1].split("; supported: ")[0].split(". For another decoder")[0]
