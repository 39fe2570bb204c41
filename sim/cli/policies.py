"""``cbsim policies``: every policy with its knobs, defaults and what they mean."""

from __future__ import annotations

from sim.cli.app import app


@app.command("policies")
def policies_cmd():
    """List the scheduling policies and their knobs (set them in a scenario's policy entry)."""
    from rich.console import Console
    from rich.table import Table

    from policies.registry import POLICIES

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
        console.print(t)
