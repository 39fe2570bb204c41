"""``cbsim calibrate``: make a latency table folder (``sim.latency.table_format``).

One command, one output (``--out TABLE``, a table folder), several sources of measurements. Each
source is one function below; the command checks that exactly one was chosen and dispatches:

- ``--from-steplog FILE``: fit the table to an engine's recorded steps (``sim.latency.fit``), so
  cbsim predicts the engine a user actually runs, on their hardware.
- ``--model ID --device cpu|cuda``: measure it on a device with real forward passes of the model
  (random weights) over a paged KV cache (``calib.profile.calibrate``; needs torch: ``pip install -e .[calib]``).

torch is imported only inside the device path, so ``cbsim`` itself never needs it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app


@app.command("calibrate")
def calibrate_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="latency table folder to write (table.csv + metadata.json)"),
    from_steplog: Path = typer.Option(None, "--from-steplog",
                                      help="fit to a recorded engine run (step log JSON, format: sim/recorded/steplog.py)"),
    model: str = typer.Option(None, "--model", "-m", help="measure this model (id, e.g. tiny, llama-3-8b) on --device"),
    device: str = typer.Option("cpu", "--device", help="with --model: cpu or cuda"),
    tp: int = typer.Option(1, "--tp", help="with --model: tensor-parallel degree (one shard is timed; all-reduces "
                                           "are not included)"),
    dtype: str = typer.Option(None, "--dtype", help="with --model: fp32, bf16 or fp16 (default: the model's)"),
    block_size: int = typer.Option(16, "--block-size", help="with --model: tokens per KV block"),
    max_num_batched_tokens: int = typer.Option(None, "--max-num-batched-tokens",
                                               help="with --model: largest step (tokens) the grid covers "
                                                    "(default: cpu 512, cuda 8192)"),
    max_model_len: int = typer.Option(None, "--max-model-len",
                                      help="with --model: longest context the grid covers (default: cpu 2048, "
                                           "cuda 8192)"),
    max_num_seqs: int = typer.Option(None, "--max-num-seqs",
                                     help="with --model: largest decode batch the grid covers (default: cpu 64, "
                                          "cuda 256)"),
    gpu_memory_utilization: float = typer.Option(0.92, "--gpu-memory-utilization",
                                                 help="with --model: the fraction the KV block capacity in the "
                                                      "metadata is computed at"),
    rounds: int = typer.Option(None, "--rounds", help="with --model: timed runs per grid point (median; default: "
                                                      "cpu 5, cuda 10)"),
    heldout_batches: int = typer.Option(24, "--heldout-batches",
                                        help="with --model: random mixed batches measured whole to report the "
                                             "table's error"),
    threads: int = typer.Option(1, "--threads", help="with --device cpu: torch threads (1: time on the thread's CPU "
                                                      "clock, robust on a shared machine)"),
    time_budget: float = typer.Option(None, "--time-budget", help="with --model: seconds the whole measurement may "
                                                                  "take (fewer rounds when needed)"),
    heldout: float = typer.Option(0.2, "--heldout", help="with --from-steplog: share of the steps held out to "
                                                          "measure the fit's error"),
    seed: int = typer.Option(0, "--seed", help="seed of the held-out split (steplog) or of the profile's batches"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
):
    """Make a latency table: fit one to an engine's step log, or measure one on a device."""
    from sim.errors import CbsimError

    if from_steplog is not None and model is not None:
        raise CbsimError("give one source of measurements: --from-steplog FILE or --model ID --device cpu|cuda, "
                         "not both")
    if from_steplog is not None:
        calibrate_from_steplog(from_steplog, out, heldout, seed)
        return
    if model is None:
        raise CbsimError("say where the measurements come from: --model ID --device cpu|cuda (measure the model "
                         "on this machine), or --from-steplog FILE (a recorded engine run, e.g. "
                         "../shared/reference/vllm-cpu-runs/fit.json)")
    calibrate_on_device(
        out, model=model, device=device, tp=tp, dtype=dtype, block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization, rounds=rounds, heldout_batches=heldout_batches,
        threads=threads, seed=seed, quiet=quiet, time_budget=time_budget)


class DeviceProgress:
    """A rich progress bar fed with (phase, done, total)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.task = None
        self.phase = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn())
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            return self.bar.__exit__(*exc)
        return False

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.bar is None:
            return
        if phase != self.phase:
            self.phase = phase
            self.task = self.bar.add_task(phase, total=total)
        self.bar.update(self.task, completed=done, total=total)


def calibrate_on_device(out: Path, *, model: str, device: str, tp: int, dtype: str | None, block_size: int,
                        max_num_batched_tokens: int | None, max_model_len: int | None, max_num_seqs: int | None,
                        gpu_memory_utilization: float, rounds: int | None, heldout_batches: int, threads: int,
                        seed: int, quiet: bool, time_budget: float | None = None) -> None:
    from rich.console import Console

    from calib.device import require_torch, set_threads
    from sim.errors import CbsimError
    from sim.hardware.models import get_model

    require_torch(device)
    set_threads(device, threads)
    from calib.profile.calibrate import ProfileSpec, calibrate

    spec_model = get_model(model)
    if rounds is not None and rounds < 3:
        raise CbsimError(f"--rounds must be at least 3 (a median needs a few runs), got {rounds}")
    spec = ProfileSpec(model=spec_model, device=device, dtype=dtype, tp=tp, block_size=block_size,
                       max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization, repeats=rounds,
                       heldout=heldout_batches, seed=seed, time_budget_s=time_budget)
    console = Console()
    console.print(f"measuring {spec_model.name} on {device} (tp {tp}, block size {block_size})", highlight=False)
    with DeviceProgress(not quiet) as bar:
        table = calibrate(spec, out, lambda done, total, what: bar("measuring", done, total))
    meta = table.metadata
    err = meta["heldout_error"]
    fit = meta["fit"]
    bw = meta["bandwidth"]
    console.print(f"{meta['device']}: overhead {table.scalar('overhead') * 1e3:.3f} ms, step gap "
                  f"{table.scalar('step_gap') * 1e3:.3f} ms, swap {bw['h2d_bytes_per_s'] / 1e9:.2f} GB/s in, "
                  f"{bw['d2h_bytes_per_s'] / 1e9:.2f} GB/s out; KV capacity {meta['num_gpu_blocks']} blocks at "
                  f"gpu_memory_utilization {meta['gpu_memory_utilization']}", highlight=False)
    console.print(f"held-out error on {err['n']} mixed batches: mean |rel| {err['mean_abs_rel']:.1%}, p90 |rel| "
                  f"{err['p90_abs_rel']:.1%}, bias of the sum {err['sum_rel']:+.1%} ({fit['profile_seconds']} s)",
                  highlight=False)
    console.print(f"table: {out}/ (table.csv, metadata.json)", highlight=False)


def calibrate_from_steplog(path: Path, out: Path, heldout: float, seed: int) -> None:
    from rich.console import Console

    from sim.latency.fit import fit_steplog
    from sim.latency.table_format import write_table
    from sim.recorded.steplog import read_steplog

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
