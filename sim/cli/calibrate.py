"""``cbsim calibrate``: make a latency table folder (``sim.latency.table_format``).

One command, one output (``--out TABLE``, a table folder), several sources of measurements. Each
source is one function below; the command checks that exactly one was chosen and dispatches:

- ``--from-steplog FILE``: fit the table to an engine's recorded steps (``sim.latency.fit``), so
  cbsim predicts the engine a user actually runs, on their hardware.
- ``--model ID --device cpu|cuda``: measure it on a device with real forward passes of the model
  (random weights) over a paged KV cache (``calib.profile.calibrate``; needs torch: ``pip install -e .[calib]``).
- ``--from-llmservingsim BUNDLE [--tp N]``: compose it from an LLMServingSim profile bundle
  (per-layer kernel times measured inside vLLM on a GPU; ``calib.sources.llmservingsim``).
- ``--from-kernel-db --gpu GPU --model MODEL``: compose it from NVIDIA AIConfigurator's published
  kernel measurements (``calib.sources.kernel_db``; needs ``pip install 'cbsim[gpu-data]'``), so a
  GPU nobody lent us still gets a measured clock.

torch is imported only inside the device path, so ``cbsim`` itself never needs it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app

# options' defaults, read by the options below and by kernel_db_command, which leaves an option at
# its default out of the recorded command: one place, so a recorded command always rebuilds its table
DEFAULTS = {"tp": 1, "data_parallel": 1, "engine": "vllm", "block_size": 16, "allreduce": "custom",
            "moe_kernel": "database", "kv_cache_dtype": "auto"}


@app.command("calibrate")
def calibrate_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="latency table folder to write (table.csv + metadata.json)"),
    from_steplog: Path = typer.Option(None, "--from-steplog",
                                      help="fit to a recorded engine run (step log JSON, format: sim/recorded/steplog.py)"),
    from_run: Path = typer.Option(None, "--from-run",
                                  help="fit to a request-level run with every token's time (from `cbsim observe`; "
                                       "format: sim/recorded/request_run.py)"),
    iteration_log: Path = typer.Option(None, "--iteration-log",
                                       help="with --from-run: the server's log with vLLM's "
                                            "--enable-logging-iteration-details (exact step compositions and times)"),
    model: str = typer.Option(None, "--model", "-m", help="measure this model (id, e.g. tiny, llama-3-8b) on --device; "
                                                          "with --from-kernel-db also ORG/NAME or a config.json path"),
    from_llmservingsim: Path = typer.Option(None, "--from-llmservingsim",
                                            help="compose the table from an LLMServingSim profile bundle (a folder "
                                                 "with meta.yaml and tp<N>/; --tp picks the degree)"),
    allreduce_gbps: float = typer.Option(None, "--allreduce-gbps",
                                         help="with --from-llmservingsim --tp > 1: the GPUs' all-reduce bus "
                                              "bandwidth in GB/s (a bundle holds no all-reduce times)"),
    from_kernel_db: bool = typer.Option(False, "--from-kernel-db",
                                        help="compose the table from NVIDIA AIConfigurator's kernel database "
                                             "(needs --gpu and --model; pip install 'cbsim[gpu-data]')"),
    gpu: str = typer.Option(None, "--gpu", help="with --from-kernel-db: h100-sxm, h200, a100-80gb, l40s, b200, "
                                                "rtx-pro-6000 (or AIConfigurator's system names)"),
    engine: str = typer.Option(DEFAULTS["engine"], "--engine", help="with --from-kernel-db: the engine the kernels were measured "
                                                        "in: vllm, sglang or trtllm"),
    engine_version: str = typer.Option(None, "--engine-version",
                                       help="with --from-kernel-db: the engine version's measurements (default: "
                                            "the database's current one, e.g. vllm 0.24.0)"),
    allreduce: str = typer.Option(DEFAULTS["allreduce"], "--allreduce", help="with --from-kernel-db --tp > 1: the all-reduce "
                                  "kernel the engine runs: custom (its own peer-to-peer kernel, as AIConfigurator "
                                  "prices it) or nccl (the database's NCCL rows: TensorRT-LLM falls back to NCCL "
                                  "without peer access or NVLink; docs/trtllm.md)"),
    moe_kernel: str = typer.Option(DEFAULTS["moe_kernel"], "--moe-kernel", help="with --from-kernel-db: the "
                                   "kernel of the routed experts: database (the database's own rows for the model, "
                                   "as AIConfigurator prices them) or marlin (vLLM MXFP4 experts run with "
                                   "VLLM_MXFP4_USE_MARLIN=1, priced from the database's Marlin MXFP4 rows at the "
                                   "same tokens per expert; docs/calibration.md) or flashinfer-mxfp8 (vLLM MXFP4 "
                                   "experts on Blackwell run with VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, priced from "
                                   "the database's SGLang rows of the same FlashInfer kernel)"),
    kv_cache_dtype: str = typer.Option(DEFAULTS["kv_cache_dtype"], "--kv-cache-dtype", help="with --from-kernel-db: "
                                       "the KV cache dtype the engine runs (vLLM's --kv-cache-dtype): auto (the "
                                       "model's) or fp8 (the database's attention rows for an FP8 KV cache)"),
    draft: str = typer.Option(None, "--draft", help="with --from-kernel-db: the table of --model's speculative "
                                                    "head instead (eagle or eagle3: one layer at its width and "
                                                    "the head's LM head; mtp: the model's own multi-token-"
                                                    "prediction layer, one MLA + MoE layer and its LM head, at "
                                                    "--tp / --data-parallel / --expert-parallel), for "
                                                    "speculative.draft_table"),
    draft_vocab_size: int = typer.Option(None, "--draft-vocab-size", help="with --draft: rows of the head's LM "
                                         "head (default: the model's vocabulary for eagle, 32000 for eagle3)"),
    data_parallel: int = typer.Option(DEFAULTS["data_parallel"], "--data-parallel", help="with --from-kernel-db: data-parallel attention "
                                      "ranks of an MoE model, stepping together for the experts (the scenario's "
                                      "hardware.data_parallel)"),
    expert_parallel: bool = typer.Option(False, "--expert-parallel", help="with --from-kernel-db: experts split "
                                         "over tp × data-parallel GPUs, dispatch and combine priced from the "
                                         "engine's communication rows (hardware.expert_parallel)"),
    device: str = typer.Option("cpu", "--device", help="with --model: cpu or cuda"),
    tp: int = typer.Option(DEFAULTS["tp"], "--tp", help="tensor-parallel degree (with --model one shard is timed, without "
                                           "all-reduces; with --from-llmservingsim the bundle's tp<N>/)"),
    dtype: str = typer.Option(None, "--dtype", help="with --model: fp32, bf16 or fp16 (default: the model's); with "
                                            "--from-kernel-db: bf16, fp16 or fp8"),
    block_size: int = typer.Option(DEFAULTS["block_size"], "--block-size", help="with --model: tokens per KV block"),
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
    from sim.outputs import check_folder

    check_folder(out, "the latency table")  # a file, an unwritable folder: refused before any measuring

    if moe_kernel != DEFAULTS["moe_kernel"] and not from_kernel_db:
        raise CbsimError("--moe-kernel goes with --from-kernel-db (the kernel database's MoE rows)")
    if kv_cache_dtype != DEFAULTS["kv_cache_dtype"] and not from_kernel_db:
        raise CbsimError("--kv-cache-dtype goes with --from-kernel-db (the kernel database's attention rows for "
                         "that KV dtype); a scenario sets engine.kv_cache_dtype")
    if allreduce != "custom" and not from_kernel_db:
        raise CbsimError("--allreduce goes with --from-kernel-db (the kernel database's all-reduce rows; "
                         "--from-llmservingsim takes --allreduce-gbps)")
    if from_run is not None:  # a request-level run (cbsim observe)
        if from_steplog is not None or from_llmservingsim is not None or from_kernel_db or model is not None:
            raise CbsimError("give one source of measurements: --from-run RUN is used alone (with "
                             "--iteration-log LOG), not with --from-steplog, --from-llmservingsim, "
                             "--from-kernel-db or --model")
        calibrate_from_run(from_run, iteration_log, out, heldout, seed)
        return
    if iteration_log is not None:
        raise CbsimError("--iteration-log LOG goes with --from-run RUN (the observed run the log belongs to)")
    if (draft is not None or draft_vocab_size is not None) and not from_kernel_db:
        raise CbsimError("--draft / --draft-vocab-size go with --from-kernel-db (the head's table is composed "
                         "from the kernel database)")
    if draft_vocab_size is not None and draft is None:
        raise CbsimError("--draft-vocab-size goes with --draft eagle or eagle3")

    if from_llmservingsim is not None:
        if from_steplog is not None or from_kernel_db:
            raise CbsimError("give one source of measurements: --from-llmservingsim, --from-kernel-db or "
                             "--from-steplog, not several")
        calibrate_from_llmservingsim(from_llmservingsim, out, tp=tp, model=model, allreduce_gbps=allreduce_gbps)
        return
    if from_kernel_db:
        if from_steplog is not None:
            raise CbsimError("give one source of measurements: --from-kernel-db or --from-steplog, not both")
        calibrate_from_kernel_db(out, model=model, gpu=gpu, tp=tp, dtype=dtype, engine=engine,
                                 engine_version=engine_version, block_size=block_size,
                                 max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                                 max_num_seqs=max_num_seqs, data_parallel=data_parallel,
                                 expert_parallel=expert_parallel, draft=draft, draft_vocab_size=draft_vocab_size,
                                 allreduce=allreduce, moe_kernel=moe_kernel, kv_cache_dtype=kv_cache_dtype)
        return
    if data_parallel != 1 or expert_parallel:
        raise CbsimError("--data-parallel and --expert-parallel go with --from-kernel-db (the layout the kernel "
                         "database composes)")
    if from_steplog is not None and model is not None:
        raise CbsimError("give one source of measurements: --from-steplog FILE or --model ID --device cpu|cuda, "
                         "not both")
    if from_steplog is not None:
        calibrate_from_steplog(from_steplog, out, heldout, seed)
        return
    if model is None:
        raise CbsimError("say where the measurements come from: --model ID --device cpu|cuda (measure the model "
                         "on this machine), --from-steplog FILE (a recorded engine run, e.g. "
                         "../shared/reference/vllm-cpu-runs/fit.json), or --from-kernel-db --gpu GPU --model MODEL "
                         "(published kernel measurements)")
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


def calibrate_from_kernel_db(out: Path, *, model: str | None, gpu: str | None, tp: int, dtype: str | None, engine: str,
                             engine_version: str | None, block_size: int, max_num_batched_tokens: int | None,
                             max_model_len: int | None, max_num_seqs: int | None, data_parallel: int = 1,
                             expert_parallel: bool = False, draft: str | None = None,
                             draft_vocab_size: int | None = None, allreduce: str = "custom",
                             moe_kernel: str = "database", kv_cache_dtype: str = "auto") -> None:
    from rich.console import Console

    from calib.sources import kernel_db_moe
    from calib.sources.kernel_db import build_table
    from calib.sources.kernel_db_comm import check_kind
    from calib.sources.kernel_db_marlin import check_moe_kernel
    from sim.errors import CbsimError
    from sim.latency.table_format import write_table

    if model is None or gpu is None:
        raise CbsimError("--from-kernel-db needs --gpu GPU and --model MODEL, e.g. --from-kernel-db --gpu h100-sxm "
                         "--model llama-3-8b")
    limits = {k: v for k, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_model_len", max_model_len),
                                ("max_num_seqs", max_num_seqs)) if v is not None}
    layout = kernel_db_moe.Layout(tp, data_parallel, expert_parallel)
    check_kind(allreduce)
    check_moe_kernel(moe_kernel)
    if moe_kernel != DEFAULTS["moe_kernel"] and draft is not None:
        raise CbsimError(f"--moe-kernel {moe_kernel} prices the target's routed experts; drop it for --draft")
    if kv_cache_dtype not in ("auto", "fp8"):
        raise CbsimError(f"--kv-cache-dtype {kv_cache_dtype!r}: give auto (the model's dtype) or fp8")
    if kv_cache_dtype != DEFAULTS["kv_cache_dtype"] and draft is not None:
        raise CbsimError(f"--kv-cache-dtype {kv_cache_dtype} prices the target's attention; drop it for --draft")
    if allreduce != "custom" and (draft is not None or kernel_db_moe.takes(model, layout)):
        raise CbsimError(f"--allreduce {allreduce} prices dense models' tensor-parallel tables; drop it for "
                         "--draft and for MLA, 4-bit-expert, expert- or data-parallel tables")
    if draft == "mtp":  # the model's own MTP layer (one MLA + MoE layer), in the target's layout
        if draft_vocab_size is not None:
            raise CbsimError("--draft-vocab-size goes with --draft eagle or eagle3 (an MTP layer predicts over "
                             "the target's own vocabulary with the target's LM head)")
        from calib.sources import kernel_db_mtp

        comp = kernel_db_mtp.build_table(model, gpu, layout, dtype=dtype, engine=engine,
                                         engine_version=engine_version, block_size=block_size, **limits)
    elif draft is not None:  # the speculative head's table (dense: one layer at the model's width)
        comp = build_table(model, gpu, tp=tp, dtype=dtype, engine=engine, engine_version=engine_version,
                           block_size=block_size, draft=draft, draft_vocab_size=draft_vocab_size, **limits)
    elif moe_kernel != DEFAULTS["moe_kernel"] or kernel_db_moe.takes(model, layout):
        # MLA, 4-bit experts, expert or data parallelism, or another experts' kernel (which refuses the
        # models and engines it does not apply to)
        comp = kernel_db_moe.build_table(model, gpu, layout, dtype=dtype, engine=engine,
                                         engine_version=engine_version, block_size=block_size,
                                         moe_kernel=moe_kernel, kv_cache_dtype=kv_cache_dtype, **limits)
    else:
        comp = build_table(model, gpu, tp=tp, dtype=dtype, engine=engine, engine_version=engine_version,
                           block_size=block_size, allreduce=allreduce, kv_cache_dtype=kv_cache_dtype, **limits)
    meta = comp.table.metadata
    meta["provenance"] = {"command": kernel_db_command(
        out, model=model, gpu=gpu, tp=tp, dtype=dtype, engine=engine, engine_version=engine_version,
        block_size=block_size, limits=limits, data_parallel=data_parallel, expert_parallel=expert_parallel,
        draft=draft, draft_vocab_size=draft_vocab_size, allreduce=allreduce, moe_kernel=moe_kernel,
        kv_cache_dtype=kv_cache_dtype),
        **meta["provenance"]}
    write_table(out, comp.table)
    t = comp.table
    prov, err = meta["provenance"], meta.get("aic_agreement") or meta["heldout_error"]
    console = Console()
    par = meta.get("parallel") or {}
    layout_words = (f", data_parallel {par['data_parallel']}, expert_parallel {par['expert_parallel']}"
                    if par else "")
    console.print(f"{meta['model']['name']} on {meta['device']} (tp {meta['tensor_parallel']}{layout_words}, "
                  f"{meta['dtype']}): "
                  f"kernels measured in {prov['engine']} {prov['engine_version']} by {prov['package']} "
                  f"{prov['package_version']}", highlight=False, markup=False)
    lin = t.components["linear"]
    axis = list(lin.axes[0])
    ref = 1024 if 1024 in axis else int(axis[len(axis) // 2])
    console.print(f"linear({ref} tokens) {float(lin.values[axis.index(ref)]) * 1e3:.3f} ms; agreement with "
                  f"{prov['package']}'s own step predictions on {err['n']} steps: mean |rel| "
                  f"{err['mean_abs_rel']:.1%}, p90 {err['p90_abs_rel']:.1%}", highlight=False, markup=False)
    console.print(f"known limits: {prov['known_limits']}", highlight=False, markup=False)
    console.print(f"table: {out}/ (table.csv, metadata.json)", highlight=False, markup=False)


def kernel_db_command(out: Path, *, model: str, gpu: str, tp: int, dtype: str | None, engine: str,
                      engine_version: str | None, block_size: int, limits: dict, data_parallel: int,
                      expert_parallel: bool, draft: str | None, draft_vocab_size: int | None,
                      allreduce: str, moe_kernel: str = "database", kv_cache_dtype: str = "auto") -> str:
    """The ``cbsim calibrate --from-kernel-db`` command that builds this table again (metadata
    ``provenance.command``): the options as given, those left at their default omitted, ``--out`` as
    given (relative to the folder it was run from). tests/test_shipped_tables.py runs each shipped
    table's command and compares what it builds with the committed table."""
    import shlex

    opts: list[tuple[str, object]] = [("--gpu", gpu), ("--model", model)]
    opts += [(flag, value) for flag, value, default in (
        ("--tp", tp, DEFAULTS["tp"]), ("--data-parallel", data_parallel, DEFAULTS["data_parallel"]),
        ("--dtype", dtype, None), ("--engine", engine, DEFAULTS["engine"]), ("--engine-version", engine_version, None),
        ("--block-size", block_size, DEFAULTS["block_size"]), ("--allreduce", allreduce, DEFAULTS["allreduce"]),
        ("--moe-kernel", moe_kernel, DEFAULTS["moe_kernel"]), ("--kv-cache-dtype", kv_cache_dtype, DEFAULTS["kv_cache_dtype"]),
        ("--draft", draft, None),
        ("--draft-vocab-size", draft_vocab_size, None),
        *((f"--{k.replace('_', '-')}", v, None) for k, v in limits.items())) if value != default]
    words = ["cbsim", "calibrate", "--from-kernel-db"]
    for flag, value in opts:
        words += [flag, str(value)]
    if expert_parallel:
        words.append("--expert-parallel")
    return shlex.join([*words, "--out", str(out)])


def calibrate_from_llmservingsim(bundle: Path, out: Path, *, tp: int, model: str | None,
                                 allreduce_gbps: float | None) -> None:
    from rich.console import Console

    from calib.sources.llmservingsim import calibrate_from_bundle

    table = calibrate_from_bundle(bundle, out, tp=tp, model=model, allreduce_gbps=allreduce_gbps)
    meta = table.metadata
    lin = table.components["linear"]
    axis = list(lin.axes[0])
    ref = 1024 if 1024 in axis else int(axis[-1])
    console = Console()
    par = meta.get("parallel") or {}
    layout_words = (f", data_parallel {par['data_parallel']}, expert_parallel {par['expert_parallel']}"
                    if par else "")
    console.print(f"{meta['model']['name']} on {meta['device']} (tp {meta['tensor_parallel']}{layout_words}, "
                  f"{meta['dtype']}): "
                  f"per-layer kernels measured in vLLM {meta['engine']['version']} (LLMServingSim bundle)",
                  highlight=False, markup=False)
    console.print(f"linear({ref} tokens) {float(lin.values[axis.index(ref)]) * 1e3:.3f} ms, decode skew alpha "
                  f"{meta['decode_skew_alpha']:g}; modelled, not measured: see metadata.json fit.modelled",
                  highlight=False, markup=False)
    console.print(f"table: {out}/ (table.csv, metadata.json)", highlight=False, markup=False)


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


def calibrate_from_run(run: Path, iteration_log: Path | None, out: Path, heldout: float, seed: int) -> None:
    """Fit a table to an observed run's steps (:mod:`sim.recorded.run_steps`) with the step-log fitter."""
    from rich.console import Console

    from sim.latency.table_format import write_table
    from sim.recorded.run_steps import fit_run

    console = Console()
    result, log = fit_run(run, iteration_log, heldout_fraction=heldout, seed=seed)
    write_table(out, result.table)
    t = result.table
    console.print(f"run {run}: {len(log.requests)} requests, {len(log.steps)} steps from {log.format}",
                  highlight=False, markup=False)
    console.print(f"fitted on {result.train_steps} steps: overhead {t.scalar('overhead') * 1e3:.3f} ms, "
                  f"step gap {t.scalar('step_gap') * 1e3:.3f} ms", highlight=False)
    err = result.heldout
    if err["n"]:
        console.print(f"held-out error on {err['n']} steps: mean |rel| {err['mean_abs_rel']:.1%}, p90 |rel| "
                      f"{err['p90_abs_rel']:.1%}, bias of the sum {err['sum_rel']:+.1%}", highlight=False)
    console.print(f"table: {out}/ (table.csv, metadata.json)", highlight=False)
