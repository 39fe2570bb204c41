"""Small builders shared by tests: fake model/GPU specs and a direct simulation runner."""

from __future__ import annotations

import random
from types import SimpleNamespace

from policies.base import EngineLimits
from policies.registry import make_policy
from sim.engine import Simulation
from sim.latency.constant import ConstantLatency
from sim.request_spec import RequestSpec
from sim.summary import summarize

FAKE_MODEL = SimpleNamespace(
    num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16, dtype_bytes=2,
    kv_bytes_per_token=lambda tp=1: 2 * 4 * 16 * 2 * 2 // tp,
    weight_bytes=lambda tp=1: 1_000_000 // tp,
    flops_per_token=lambda tp=1: 2_000_000 / tp,
)
FAKE_GPU = SimpleNamespace(name="fake", peak_flops=1e12, hbm_bandwidth=1e11, pcie_bandwidth=1e9,
                           memory_bytes=10**10)


def specs_from(lengths, prompt=4, arrival=0.0):
    return [RequestSpec(f"R{i + 1}", arrival, prompt, out, out) for i, out in enumerate(lengths)]


def random_specs(seed: int, n: int = 40, max_prompt: int = 300, max_out: int = 60, rate: float = 2.0,
                 max_tokens_extra: int = 0):
    rng = random.Random(seed)
    t = 0.0
    specs = []
    for i in range(n):
        t += rng.expovariate(rate)
        out = rng.randint(1, max_out)
        specs.append(RequestSpec(f"r{i:04d}", t, rng.randint(1, max_prompt), out,
                                 out + rng.randint(0, max_tokens_extra)))
    return specs


def simulate(name: str, specs, limits: EngineLimits, step_s: float = 1.0, **knobs):
    """Run one policy on the given specs with a constant step time; returns (recorder, policy, summary)."""
    policy = make_policy(name, limits, **knobs)
    latency = ConstantLatency(step_s, FAKE_MODEL, FAKE_GPU, 1, limits.block_size)
    sim = Simulation(specs, [(policy, latency)], limits.max_model_len)
    rec = sim.run()
    requests, steps = rec.requests_frame(), rec.steps_frame()
    summary = summarize(requests, steps, max_slots=policy.max_slots,
                        token_budget=limits.max_num_batched_tokens if policy.uses_token_budget else None,
                        kv_blocks_total=policy.kv_blocks_total(), peak_flops=FAKE_GPU.peak_flops,
                        hbm_bandwidth=FAKE_GPU.hbm_bandwidth)
    return requests, steps, policy, summary
