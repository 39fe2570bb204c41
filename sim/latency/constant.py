"""A fixed time per step: for teaching (the seed's toy) and for exact tests."""

from __future__ import annotations

from sim.latency.base import LatencyModel


class ConstantLatency(LatencyModel):
    name = "constant"

    def __init__(self, step_s: float, model, gpu, tensor_parallel: int, block_size: int) -> None:
        super().__init__(model, gpu, tensor_parallel, block_size)
        self.step_s = float(step_s)

    def price(self, shape, plan=None):
        flops, bytes_ = self.step_flops_bytes(shape)
        return self.step_s, self.useful_flops(shape, flops), bytes_
