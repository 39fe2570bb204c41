"""``cbsim validate``: how far is the simulation from a real engine?

Two ways to get the real side, one comparison (``sim.validate_against``: the same figures, the
same signed relative errors, the same ``--json``):

- ``--against RUN.json --table TABLE``: a run already recorded from an engine (a step log with
  per-request token times); cbsim simulates its workload on its config with ``vllm-v1`` and the
  table.
- ``X.yaml`` (the positional scenario): run the scenario for real (``calib.engine``) and simulate it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli import app


@app.command("validate")
def validate_cmd(
    scenario: Path = typer.Argument(None, help="scenario YAML to run for real and simulate (not with --against)"),
    against: Path = typer.Option(None, "--against", help="a recorded engine run (step log JSON) to predict"),
    table: Path = typer.Option(None, "--table", help="latency table folder (from `cbsim calibrate`)"),
    gpu: str = typer.Option(None, "--gpu", help="with --against: the GPU id the run used, when its log does not "
                                               "say (sets MFU/MBU and swap bandwidth only)"),
    json_out: Path = typer.Option(None, "--json", help="also write {real, sim, error} as JSON here"),
):
    """Compare what a real engine measured with what cbsim predicts."""
    from sim.errors import CbsimError

    if against is not None:
        if scenario is not None:
            raise CbsimError(f"give either a scenario ({scenario}) or --against RUN.json, not both")
        result = validate_recorded_run(against, table, gpu)
        real_label = "engine (measured)"
        title = f"{against.name}: recorded run vs cbsim"
    elif scenario is not None:
        raise CbsimError(f"validating {scenario} needs a real run of it (calib.engine), which this build does not "
                         f"have yet; to validate against a recorded engine run use --against RUN.json --table TABLE")
    else:
        raise CbsimError("nothing to validate: give --against RUN.json --table TABLE (a recorded engine run), "
                         "or a scenario X.yaml")
    report(result, json_out, real_label, title)


def validate_recorded_run(run: Path, table: Path | None, gpu: str | None) -> dict:
    from sim.errors import CbsimError
    from sim.validate_against import validate_against

    if table is None:
        raise CbsimError(f"--against {run} needs --table TABLE: make one from another run of the same engine with "
                         f"`cbsim calibrate --from-steplog OTHER_RUN.json --out TABLE`")
    return validate_against(run, table, gpu)


def report(result: dict, json_out: Path | None, real_label: str, title: str) -> None:
    from rich.console import Console

    from sim.validate_against import comparison_table, write_json

    console = Console()
    console.print(comparison_table(result, real_label=real_label, title=title))
    bias = (result.get("diagnostics") or {}).get("step_time_bias")
    if bias is not None:
        console.print(f"step-time check: the table prices this run's own recorded steps {bias:+.1%} off their "
                      f"measured total (a latency-table error; the rest of the gap is the simulation's)",
                      highlight=False)
    if json_out is not None:
        write_json(result, json_out)
        console.print(f"json: {json_out}", highlight=False)
