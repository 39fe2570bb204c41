"""``cbsim models``: every model id cbsim knows, and every ``ORG/NAME`` that resolves locally."""

from __future__ import annotations

import typer

from sim.cli.app import app


@app.command("models")
def models_cmd(
    all_: bool = typer.Option(False, "--all", help="also list local configs cbsim cannot price, with the reason"),
):
    """List model ids and the ORG/NAME configs found locally (aiconfigurator-core, Hugging Face cache)."""
    from rich.console import Console
    from rich.table import Table

    from sim.errors import CbsimError
    from sim.hardware.hf_config import UNSUPPORTED
    from sim.hardware.model_sources import (
        SHIPPED_DIR,
        aiconfigurator_configs_dir,
        available_models,
        hf_cache_dir,
    )
    from sim.hardware.models import MODELS, from_hf_config

    console = Console()
    t = Table(title="models (scenario key model:)", title_justify="left", header_style="bold")
    for col in ("model", "source", "layers", "params", "experts", "notes"):
        t.add_column(col)
    for name, spec in MODELS.items():
        t.add_row(name, "built in", str(spec.num_layers), f"{spec.num_params() / 1e9:.2f}B", "-", spec.dtype)
    skipped = 0
    for src in available_models():
        try:
            spec = from_hf_config(src.path, name=src.name)
        except CbsimError as exc:
            skipped += 1
            if all_:
                t.add_row(src.name, src.origin, "-", "-", "-", f"not priced: {_reason(str(exc))}")
            continue
        experts = f"{spec.num_experts} (top {spec.num_experts_per_tok})" if spec.is_moe else "-"
        notes = ", ".join(x for x in (
            spec.dtype, spec.quantization, spec.expert_quantization and f"{spec.expert_quantization} experts",
            spec.is_mla and f"MLA (latent {spec.kv_lora_rank} + rope {spec.qk_rope_head_dim})",
            spec.first_k_dense_layers and f"first {spec.first_k_dense_layers} layer(s) dense",
            f"window {spec.sliding_window} on {spec.num_sliding_layers} layers" if spec.sliding_window else None,
            spec.attention_sinks and "sinks",
            spec.mtp_layers and f"{spec.mtp_layers} MTP layer(s): a draft for speculative.method mtp") if x)
        t.add_row(src.name, src.origin, str(spec.num_layers), f"{spec.num_params() / 1e9:.2f}B", experts, notes)
    console.print(t)
    if all_:
        left = Table(title="architectures cbsim leaves out (config.json `architectures`)", title_justify="left",
                     header_style="bold")
        left.add_column("architecture")
        left.add_column("why")
        for arch, why in sorted(UNSUPPORTED.items()):
            left.add_row(arch, why)
        left.add_row("(any) with NVFP4, AWQ, GPTQ weights", "only FP8 (all linear layers) and, for routed experts, "
                     "MXFP4 and INT4 group-32 weights are priced")
        console.print(left)
    folder = aiconfigurator_configs_dir()
    console.print(f"searched: {folder or 'aiconfigurator-core (not installed)'}; {hf_cache_dir()}; {SHIPPED_DIR} "
                  f"(never the network)"
                  + (f"; {skipped} config(s) of architectures cbsim cannot price left out (--all lists them)"
                     if skipped and not all_ else ""))


def _reason(message: str) -> str:
    """The why of a config cbsim cannot price, without the file's path."""
    return message.split(": ", 1)[-1].split("; supported: ")[0].split(". For another decoder")[0]
