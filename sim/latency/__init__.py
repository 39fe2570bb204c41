"""Latency models: how long a step takes, and how long a swap takes.

Every backend implements :class:`LatencyModel`: ``step_time(plan)`` from the step's composition
(:class:`StepShape`) and ``swap_time(blocks)`` from host-device copy bandwidth. ``make_latency``
builds the one a scenario names (``latency.backend``: constant, roofline or table).
"""

from __future__ import annotations

from sim.latency.base import LatencyModel, StepShape, step_shape

__all__ = ["LatencyModel", "StepShape", "step_shape", "make_latency"]


def make_latency(cfg, model, gpu, tensor_parallel: int, block_size: int, path=None,
                 async_scheduling: bool = True, data_parallel: int = 1, expert_parallel: int = 1) -> LatencyModel:
    """Build the latency model named by a scenario's ``latency`` section (``path``: the table
    folder already resolved against the scenario's location; ``async_scheduling``: the scenario's
    ``engine.async_scheduling``, how a table's ``engine_cpu`` term adds to the GPU time;
    ``data_parallel``/``expert_parallel``: the MoE layout the roofline prices and a table must have
    been made for)."""
    if cfg.backend == "constant":
        from sim.latency.constant import ConstantLatency

        return ConstantLatency(cfg.step_s, model, gpu, tensor_parallel, block_size)
    if cfg.backend == "roofline":
        from sim.latency.roofline import RooflineLatency

        kwargs = {key: getattr(cfg, key) for key in ("overhead_s", "compute_efficiency", "memory_efficiency")
                  if getattr(cfg, key, None) is not None}
        return RooflineLatency(model, gpu, tensor_parallel, block_size, data_parallel=data_parallel,
                               expert_parallel=expert_parallel, **kwargs)
    if cfg.backend == "table":
        from sim.latency.table import TableLatency

        if path is None and cfg.path is None and getattr(cfg, "name", None):
            from sim.latency.shipped import shipped_table_path

            path = shipped_table_path(cfg.name)
        return TableLatency.from_path(path or cfg.path, model, gpu, tensor_parallel, block_size,
                                      overhead_s=getattr(cfg, "overhead_s", None),
                                      async_scheduling=async_scheduling, data_parallel=data_parallel,
                                      expert_parallel=expert_parallel)
    raise ValueError(f"unknown latency backend {cfg.backend!r}")
