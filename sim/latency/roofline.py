"""Roofline step time: the larger of compute time and memory time, plus a fixed overhead.

Per step, FLOPs (linear layers, attention) over the GPU's dense peak and bytes (weights read once
per step, KV cache read and written, activations) over HBM bandwidth, each divided by an
achievable-efficiency factor, take the max, and add a per-step overhead (scheduling, sampling,
kernel launch). It needs no measurements, so it is the default until a calibrated table exists.

Efficiency factors (documented assumptions, replace them with a measured table when you can):
- ``compute_efficiency`` 0.6: large bf16 GEMMs on Hopper reach roughly 60-75 % of the dense peak.
- ``memory_efficiency`` 0.8: streaming reads reach about 80 % of datasheet HBM bandwidth.
- ``overhead_s`` 2 ms: host-side scheduling, input preparation, sampling and launches per step
  (the CPU-side gap measured between steps of a real engine is of this order).
"""

from __future__ import annotations

from sim.latency.base import LatencyModel


class RooflineLatency(LatencyModel):
    name = "roofline"

    def __init__(
        self,
        model,
        gpu,
        tensor_parallel: int,
        block_size: int,
        compute_efficiency: float = 0.6,
        memory_efficiency: float = 0.8,
        overhead_s: float = 2e-3,
    ) -> None:
        super().__init__(model, gpu, tensor_parallel, block_size)
        self.compute_rate = gpu.peak_flops * compute_efficiency
        self.memory_rate = gpu.hbm_bandwidth * memory_efficiency
        self.overhead_s = overhead_s

    def price(self, shape, plan=None):
        flops, bytes_ = self.step_flops_bytes(shape)
        t = max(flops / self.compute_rate, bytes_ / self.memory_rate) + self.overhead_s
        return t, self.useful_flops(shape, flops), bytes_
