"""``cbsim policies``: every policy with its knobs, defaults and what they mean."""

from __future__ import annotations

import typer

from sim.cli.app import app


@app.command("policies")
def policies_cmd(
    json_: bool = typer.Option(False, "--json", help="print every policy and its knobs as JSON on stdout"),
):
    """List the scheduling policies and their knobs (set them in a scenario's policy entry)."""
    from rich.console import Console
    from rich.table import Table

    from policies.registry import POLICIES
    from sim.cli.output import print_json, show_table

    if json_:
        print_json({name: {"summary": cls.summary, "engine_defaults": engine_defaults_line(name, cls),
                           "knobs": {knob: {"default": k.default, "help": k.help} for knob, k in cls.KNOBS.items()}}
                    for name, cls in POLICIES.items()})
        return
    console = Console()
    for name, cls in POLICIES.items():
        t = Table(title=f"{name}: {cls.summary}", title_justify="left", show_header=True, header_style="bold")
        t.add_column("knob")
        t.add_column("default")
        t.add_column("meaning")
        for knob, k in cls.KNOBS.items():
            t.add_row(knob, repr(k.default), k.help)
        if not cls.KNOBS:
            t.add_row("-", "-", "no knobs: engine settings only (engine.max_num_seqs, ...)")
        t.caption = engine_defaults_line(name, cls)
        t.caption_justify = "left"
        show_table(console, t)


def engine_defaults_line(name: str, cls) -> str:
    """What ``engine.max_num_seqs`` / ``max_num_batched_tokens`` left unset mean for this policy,
    per known GPU (at the default max_model_len), and where those defaults come from."""
    from sim.hardware.gpus import GPUS
    from sim.scenario.batch_limits import batch_limits
    from sim.scenario.schema import load_scenario

    values = {}
    for gpu_id, gpu in GPUS.items():
        scn = load_scenario({"hardware": {"gpu": gpu_id}, "policies": [{"name": name}]})
        values.setdefault(batch_limits(scn, gpu, name), []).append(gpu_id)
    if len(values) == 1:
        return f"engine defaults (engine.max_num_seqs / max_num_batched_tokens unset): {cls.engine_defaults_source}"
    per_gpu = "; ".join(f"{', '.join(ids)}: {s} / {t}" for (s, t), ids in values.items())
    return (f"engine defaults (engine.max_num_seqs / max_num_batched_tokens unset): {per_gpu}; "
            f"{cls.engine_defaults_source}")
