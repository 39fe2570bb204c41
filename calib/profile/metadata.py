"""The latency table's metadata: provenance, KV capacity, how it was measured, and the device.

Why a module of its own: the metadata is what lets a reader trust or reject a table (which
device, driver and torch, how many rounds, which points were extrapolated, the held-out error);
assembling it is bookkeeping apart from measuring, and its keys are read by
:mod:`sim.latency.table_format` and the reports.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from typing import Any

import torch

from calib.paged import PagedKVCache
from calib.profile.plan import GIB, ProfileSpec

CPU_ACTIVATION_RESERVE = 1 * GIB  # cbsim's hardware.activation_reserve_gib default


def profile_metadata(spec: ProfileSpec, model_spec, device: torch.device, table, *, dtype, bandwidth, raw_copy,
                     heldout, heldout_rows, activation, linear_probe, extrapolated, raw_steps, graphs_note,
                     seconds, num_blocks, clock: str, cuda_graphs: bool, attention: str,
                     rounds_cap: int | None) -> dict[str, Any]:
    """The table's ``metadata``: provenance, the KV block count, the fit and timing details."""
    from sim.latency.table_format import FORMAT_VERSION

    s = model_spec
    dtype_name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    per_block_full = PagedKVCache.bytes_per_block(s.num_layers, spec.block_size, s.kv_heads_per_rank(spec.tp),
                                                  s.head_dim, dtype)
    memory = device_memory(device)
    reserve = activation if activation is not None else CPU_ACTIVATION_RESERVE
    weights = s.weight_bytes(spec.tp)
    usable = int((memory * spec.gpu_memory_utilization - weights - reserve) // per_block_full) - 1
    model_dict = s.to_dict()
    model_dict["dtype"] = dtype_name
    if spec.num_layers is not None and spec.num_layers != s.num_layers:  # the table prices this depth
        model_dict["num_layers"] = spec.num_layers
        model_dict["name"] = f"{s.name}-{spec.num_layers}-layers"
    return {
        "format_version": FORMAT_VERSION,
        "source": "calib",
        "device": device_name(device),
        "model": model_dict,
        "dtype": dtype_name,
        "block_size": spec.block_size,
        "tensor_parallel": spec.tp,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "grid": table.grid(),
        "torch_version": torch.__version__,
        "driver_version": driver_version(device),
        "num_gpu_blocks": max(usable, 0),
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "bandwidth": {k: round(v, 1) for k, v in bandwidth.items()},
        "heldout_error": heldout,
        "fit": {
            "method": "measured: linear = forward pass with attention reduced to its K/V write (one sequence of "
                      "T tokens); prefill_attn(n, c) and decode_attn(b, c̄) = whole step - L; overhead = "
                      "intercept of L; step_gap = engine host time per step without the forward pass "
                      "(vllm-v1, synthetic workload); see calib/profile/calibrate.py",
            "limits": {"max_num_batched_tokens": spec.max_num_batched_tokens,
                       "max_model_len": spec.max_model_len, "max_num_seqs": spec.max_num_seqs},
            "timing": {"clock": clock, "warmup": spec.warmup, "rounds": spec.repeats,
                       "max_point_s": spec.max_point_s,
                       "statistic": "median over rounds; each round times every job once, in random order"},
            "time_budget_s": spec.time_budget_s,
            "rounds_cap": rounds_cap,
            "cuda_graphs": cuda_graphs,
            "cuda_graphs_note": graphs_note,
            "attention": attention,
            "num_layers": spec.num_layers or s.num_layers,
            "torch_threads": torch.get_num_threads(),
            "profile_cache_blocks": num_blocks,
            "memory_bytes": memory,
            "activation_peak_bytes": activation,
            "kv_capacity": (f"(memory {memory} B x {spec.gpu_memory_utilization} - weights {weights} B - "
                            f"{'measured activation peak' if activation is not None else 'reserve'} {reserve} B)"
                            f" // {per_block_full} B per block - 1 null block"),
            "bandwidth_path": ("calib.executor.HostKVPool swap out (gather, copy to pinned host memory) and in"
                               if device.type == "cuda" else
                               "calib.executor.HostKVPool on a CPU: host memory to host memory (a memcpy "
                               "figure, not PCIe)"),
            "bandwidth_detail": raw_copy,
            "linear_probe_s": {str(k): v for k, v in linear_probe.items()},
            "extrapolated": extrapolated,
            "measured_steps": [list(r) for r in raw_steps],
            "heldout_batches": heldout_rows,
            "profile_seconds": round(seconds, 1),
            "seed": spec.seed,
        },
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu ({cpu}, {torch.get_num_threads()} torch thread(s))"


def device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def driver_version(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - optional: NVML may be missing; then try nvidia-smi
        import subprocess

        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            return None
