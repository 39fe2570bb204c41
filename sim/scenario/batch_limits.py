"""Each policy's batch limits: ``engine.max_num_seqs`` and ``engine.max_num_batched_tokens`` left
unset (null) take the policy's *engine's own* defaults on the scenario's GPU.

Why per policy: engines do not share defaults. vLLM V1 picks both by GPU memory and name for its
API server (1024 sequences and 8192 tokens on an H100 or H200, 256 and 2048 on an A100 or L40S:
:mod:`policies.vllm_defaults`), while the other policies keep 256 / 8192 on every device. A value
the scenario sets is used by every policy as it is. The KV pool is sized after this (vLLM's
profiling pass runs at the resolved token budget), so :func:`sized_for` returns the scenario with
the two values filled in, which the KV-capacity code then reads like any scenario.
"""

from __future__ import annotations

from policies.base import Device, EngineLimits
from policies.registry import POLICIES
from sim.hardware.gpus import GPUSpec


def device_of(gpu: GPUSpec, tensor_parallel: int = 1) -> Device:
    """The device as an engine queries it at start-up: its name, reported memory and kind."""
    return Device(name=gpu.description or gpu.name, memory_bytes=int(gpu.memory_bytes),
                  kind="cpu" if gpu.name == "cpu" else "gpu", world_size=tensor_parallel)


def batch_limits(scn, gpu: GPUSpec, policy: str | None = None, knobs: dict | None = None) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` the named policy runs with in this scenario
    (``None``: the defaults every policy without its own shares)."""
    from policies.base import Policy

    cls = POLICIES[policy] if policy is not None else Policy
    e = scn.engine
    unset = EngineLimits(block_size=e.block_size, max_num_seqs=e.max_num_seqs,
                         max_num_batched_tokens=e.max_num_batched_tokens, max_model_len=e.max_model_len,
                         device=device_of(gpu, scn.hardware.tensor_parallel))
    resolved = cls.resolve_limits(unset, knobs or {})
    return resolved.max_num_seqs, resolved.max_num_batched_tokens


def sized_for(scn, gpu: GPUSpec, policy: str | None = None, knobs: dict | None = None):
    """The scenario with ``engine.max_num_seqs`` / ``max_num_batched_tokens`` filled in for the
    named policy (the scenario itself when both are set)."""
    e = scn.engine
    if e.max_num_seqs is not None and e.max_num_batched_tokens is not None:
        return scn
    seqs, tokens = batch_limits(scn, gpu, policy, knobs)
    engine = e.model_copy(update={"max_num_seqs": seqs, "max_num_batched_tokens": tokens})
    return scn.model_copy(update={"engine": engine})
