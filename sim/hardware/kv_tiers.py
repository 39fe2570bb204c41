"""The KV tiers below the GPU of one replica, in blocks and bytes per second, from the scenario's
``engine.kv_offloading_size`` / ``kv_offloading_backend`` / ``kv_tiers`` (policies.kv.tiers).

Sizes: vLLM's ``kv_offloading_size`` is GiB over all TP ranks (``vllm/config/cache.py``
``CacheConfig.kv_offloading_size``: "the total buffer size summed across all TP ranks"), turned
into ``cpu_bytes_to_use = kv_offloading_size * (1 << 30)`` (``vllm/config/vllm.py``), so a tier
holds ``floor(GiB * 2**30 / bytes of one block over all ranks)`` blocks. The CPU tier's copies
cross PCIe at the GPU's host-link bandwidth in one direction (``GPUSpec.pcie_bandwidth``, the
datasheet's bidirectional figure halved: ``sim/hardware/gpus.py``); each rank copies its own
shard over its own link, so a block's copy takes ``bytes over all ranks / (tp * bandwidth)``.
A further tier's figures are its own (``read_gbps`` / ``write_gbps``, whole-node figures).
"""

from __future__ import annotations

from policies.kv.hiradix import HostLink
from policies.kv.tiers import OffloadConfig, TierSpec
from sim.errors import ScenarioError
from sim.hardware.gpus import GPUSpec
from sim.hardware.kv_capacity import GIB, block_bytes
from sim.hardware.models import ModelSpec

GB = 1e9


def offload_config(engine, model: ModelSpec, gpu: GPUSpec, tp: int) -> OffloadConfig | None:
    """The replica's tiers, or None without ``engine.kv_offloading_size``."""
    if engine.kv_offloading_size is None:
        return None
    per_block = block_bytes(model, engine.block_size, tp, engine.max_model_len) * tp  # all ranks

    def blocks(gib: float, key: str) -> int:
        n = int(int(gib * GIB) // per_block)
        if n < 1:
            raise ScenarioError(
                f"engine.{key}: {gib:g} GiB holds no KV block of {per_block:,} bytes; raise it"
            )
        return n

    link = gpu.pcie_bandwidth * tp
    tiers = [TierSpec("cpu", blocks(engine.kv_offloading_size, "kv_offloading_size"), link, link)]
    for i, t in enumerate(engine.kv_tiers):
        tiers.append(
            TierSpec(
                t.name,
                blocks(t.capacity_gib, f"kv_tiers[{i}].capacity_gib"),
                t.read_gbps * GB,
                t.write_gbps * GB,
            )
        )
    return OffloadConfig(engine.kv_offloading_backend, tuple(tiers), int(round(per_block)))


def host_link(model: ModelSpec, gpu: GPUSpec, tp: int) -> HostLink:
    """GPU <-> host copies of one replica (SGLang's HiCache, :mod:`policies.kv.hiradix`): a token's KV on
    one rank (``kv_bytes_per_token``, every layer, as SGLang's host pool ``get_size_per_token``), over
    all ranks, the host link in one direction times the ranks, and the layer count (the copies
    are issued layer by layer)."""
    rank = float(model.kv_bytes_per_token(tp))
    return HostLink(rank, rank * tp, gpu.pcie_bandwidth * tp, int(model.num_layers))
