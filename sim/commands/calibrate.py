"""``cbsim calibrate``: make a latency table folder (``sim.latency.table_format``).

One command, one output (``--out TABLE``, a table folder), several sources of measurements. Each
source is one function below; the command checks that exactly one was chosen and dispatches:

- ``--from-steplog FILE``: fit the table to an engine's recorded steps (``sim.latency.fit``), so
  cbsim predicts the engine a user actually runs, on their hardware.
- (device calibration, ``--model ID --device cpu|cuda``, runs real forward passes: ``calib``.)
"""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli import app


@app.command("calibrate")
def calibrate_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="latency table folder to write (table.csv + metadata.json)"),
    from_steplog: Path = typer.Option(None, "--from-steplog",
                                      help="fit to a recorded engine run (step log JSON, format: sim/steplog.py)"),
    heldout: float = typer.Option(0.2, "--heldout", help="share of the steps held out to measure the fit's error"),
    seed: int = typer.Option(0, "--seed", help="seed of the held-out split"),
):
    """Make a latency table: fit one to an engine's step log (or measure one on a device)."""
    from sim.errors import CbsimError

    if from_steplog is None:
        raise CbsimError("say where the measurements come from: --from-steplog FILE (a recorded engine run, "
                         "e.g. ../shared/reference/vllm-cpu-runs/fit.json)")
    calibrate_from_steplog(from_steplog, out, heldout, seed)


def calibrate_from_steplog(path: Path, out: Path, heldout: float, seed: int) -> None:
    from rich.console import Console

    from sim.latency.fit import fit_steplog
    from sim.latency.table_format import write_table
    from sim.steplog import read_steplog

    console = Console()
    log = read_steplog(path)
    busy = [s for s in log.steps if s.batch]
    console.print(f"step log {path}: {len(log.requests)} requests, {len(busy)} steps ({log.engine})",
                  highlight=False, markup=False)
    result = fit_steplog(log, heldout_fraction=heldout, seed=seed)
    write_table(out, result.table)
    t = result.table
    console.print(f"fitted on {result.train_steps} steps: overhead {t.scalar('overhead') * 1e3:.3f} ms, "
                  f"step gap {t.scalar('step_gap') * 1e3:.3f} ms", highlight=False)
    err = result.heldout
    if err["n"]:
        line = (f"held-out error on {err['n']} steps: mean |rel| {err['mean_abs_rel']:.1%}, "
                f"p90 |rel| {err['p90_abs_rel']:.1%}, bias of the sum {err['sum_rel']:+.1%}")
        if "mixed" in err:
            m = err["mixed"]
            line += f"; mixed prefill+decode steps ({m['n']}): mean |rel| {m['mean_abs_rel']:.1%}"
        console.print(line, highlight=False)
    console.print(f"table: {out}/ (table.csv, metadata.json)", highlight=False)
