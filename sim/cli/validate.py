"""``cbsim validate``: how far is the simulation from a real engine?

Two ways to get the real side, one comparison (``sim.recorded.validate_against``: the same figures, the
same signed relative errors, the same ``--json``):

- ``--against RUN --table TABLE``: a run already recorded from an engine (a step log with
  per-request token times, or a request-level run: a ``cbsim-request-run`` JSON or an
  LLMServingSim bench folder); cbsim simulates its workload on its config with ``vllm-v1`` and the
  table.
- ``X.yaml --device cpu|cuda``: serve the scenario for real (``calib.validate``: the scenario's
  policy choosing every step, a real model executing it on the device) and simulate it with a
  table measured on that device (``--table``, or calibrated first). Needs torch
  (``pip install -e .[calib]``), imported only on this path.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app


@app.command("validate")
def validate_cmd(
    scenario: Path = typer.Argument(None, help="scenario YAML to run for real and simulate (not with --against)"),
    against: Path = typer.Option(None, "--against", help="a recorded engine run to predict: a step log JSON, a "
                                                         "request-level run (cbsim-request-run JSON) or an "
                                                         "LLMServingSim bench folder (vllm/requests.jsonl)"),
    table: Path = typer.Option(None, "--table", help="latency table folder (from `cbsim calibrate`); with a "
                                                     "scenario, default: calibrate the device first"),
    gpu: str = typer.Option(None, "--gpu", help="with --against: the GPU id the run used, when the run does not "
                                               "say (KV capacity when the run recorded none, MFU/MBU, swap "
                                               "bandwidth; never step times)"),
    device: str = typer.Option("cpu", "--device", help="with a scenario: where to serve it for real, cpu or cuda"),
    policy: str = typer.Option(None, "--policy", "-p", help="with a scenario: the policy label to validate "
                                                           "(default: its first)"),
    set_: list[str] = typer.Option(None, "--set", help="with a scenario: override a field, a.b.c=value"),
    out: Path = typer.Option(None, "--out", "-o", help="with a scenario: also write the table (when calibrated), "
                                                      "validation.json and the real run's step log here"),
    threads: int = typer.Option(1, "--threads", help="with --device cpu: torch threads (1: the engine's thread "
                                                      "CPU clock, robust on a shared machine)"),
    json_out: Path = typer.Option(None, "--json", help="also write {real, sim, error} as JSON here (- for stdout, "
                                  "the table then on stderr)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
):
    """Compare what a real engine measured with what cbsim predicts."""
    from sim.errors import CbsimError
    from sim.outputs import check_file, check_folder

    if json_out is not None and str(json_out) != "-":  # refused before the (possibly long) real run, not after it
        check_file(json_out, "the comparison", "--json")
    if out is not None:
        check_folder(out, "the validation", "--out")

    if against is not None:
        if scenario is not None:
            raise CbsimError(f"give either a scenario ({scenario}) or --against RUN.json, not both")
        result = validate_recorded_run(against, table, gpu)
        real_label = "engine (measured)"
        title = f"{against.name}: recorded run vs cbsim"
    elif scenario is not None:
        result = validate_scenario_run(scenario, device=device, table=table, policy=policy, overrides=set_ or [],
                                       out=out, threads=threads, quiet=quiet)
        real_label = f"calib engine ({device})"
        title = f"{result['scenario']} ({result['policy']}): served for real vs cbsim"
    else:
        raise CbsimError("nothing to validate: give a scenario X.yaml (served for real with --device cpu|cuda), or "
                         "--against RUN.json --table TABLE (a recorded engine run)")
    report(result, json_out, real_label, title)


def validate_scenario_run(scenario: Path, *, device: str, table: Path | None, policy: str | None, overrides,
                          out: Path | None, threads: int, quiet: bool) -> dict:
    from calib.device import require_torch, set_threads
    from sim.cli.calibrate import DeviceProgress
    from sim.errors import CbsimError

    if not scenario.exists():
        raise CbsimError(f"scenario {str(scenario)!r} does not exist")
    if table is not None:
        from sim.latency.table_format import table_folder

        table_folder(table)  # a missing or broken table fails before the real run, not after
    require_torch(device)
    set_threads(device, threads)
    from calib.validate import validate_scenario

    with DeviceProgress(not quiet) as bar:
        return validate_scenario(scenario, device=device, table=table, policy=policy, overrides=overrides, out=out,
                                 progress=bar)


def validate_recorded_run(run: Path, table: Path | None, gpu: str | None) -> dict:
    from sim.errors import CbsimError
    from sim.recorded.validate_against import validate_against

    if table is None:
        raise CbsimError(f"--against {run} needs --table TABLE: make one with `cbsim calibrate` (--from-steplog "
                         f"OTHER_RUN.json, --from-llmservingsim BUNDLE or --from-kernel-db)")
    return validate_against(run, table, gpu)


def report(result: dict, json_out: Path | None, real_label: str, title: str) -> None:
    from sim.cli.output import console_for, print_json, show_table
    from sim.recorded.validate_against import comparison_table, write_json

    to_stdout = json_out is not None and str(json_out) == "-"
    console = console_for(to_stdout)
    show_table(console, comparison_table(result, real_label=real_label, title=title))
    bias = (result.get("diagnostics") or {}).get("step_time_bias")
    if bias is not None:
        console.print(f"step-time check: the table prices this run's own recorded steps {bias:+.1%} off their "
                      f"measured total (a latency-table error; the rest of the gap is the simulation's)",
                      highlight=False)
    cal = (result.get("diagnostics") or {}).get("calibration")
    if cal:
        err = cal["heldout_error"]
        console.print(f"calibrated first ({cal['profile_seconds']} s): held-out error on {err['n']} mixed batches "
                      f"{err['mean_abs_rel']:.1%} mean |rel|", highlight=False)
    for note in result.get("assumed") or ():
        console.print(f"assumed: {note}", highlight=False, markup=False)
    if to_stdout:
        print_json(result)
    elif json_out is not None:
        write_json(result, json_out)
        console.print(f"json: {json_out}", highlight=False)
