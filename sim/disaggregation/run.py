"""From a scenario's ``disaggregation`` section to a run: each pool resolved as a scenario of its
own (its hardware, engine, latency and policy; the scenario's model and workload), one
:class:`DisaggregatedSimulation`, its frames and summary.

A pool is resolved through :func:`sim.scenario.resolved.resolve` like any scenario, so its KV
capacity, engine defaults and latency model are exactly those a colocated run on that hardware
would get. The transferred bytes use the prefill pool's model spec (its ``kv_cache_dtype``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from policies.registry import make_policy
from sim.disaggregation.results import request_rows, steps_frame, summarize_disaggregated
from sim.disaggregation.topology import DisaggregatedSimulation, Link, Pool
from sim.metrics.recorder import HORIZON_REACHED
from sim.scenario.resolved import Deployment, resolve
from sim.scenario.schema import Replicas, Scenario


@dataclass
class PoolDeployment:
    """One pool, resolved: its deployment (one instance), policy entry, knobs and limits."""

    name: str
    dep: Deployment
    entry: object
    knobs: dict
    limits: object
    max_slots: int
    token_budget: int | None
    kv_blocks: int

    @property
    def instances(self) -> int:
        return self.dep.replicas

    @property
    def gpus_per_instance(self) -> int:
        return self.dep.scenario.hardware.tensor_parallel

    @property
    def gpus(self) -> int:
        return self.dep.scenario.hardware.count * self.dep.scenario.replicas.count

    def build(self) -> Pool:
        instances = [(make_policy(self.entry.name, self.limits, **self.knobs), self.dep.latency())
                     for _ in range(self.instances)]
        return Pool(instances, self.limits.max_model_len, self.limits.block_size)


def pool_scenario(scn: Scenario, name: str) -> Scenario:
    """The scenario one pool's instances run: the scenario with that pool's sections."""
    pool = getattr(scn.disaggregation, name)
    return scn.model_copy(update={
        "hardware": pool.hardware or scn.hardware,
        "engine": pool.engine or scn.engine,
        "latency": pool.latency or scn.latency,
        "replicas": Replicas(count=pool.replicas, router=scn.disaggregation.router),
        "policies": [pool.policy],
        "disaggregation": None,
    })


def resolve_pool(scn: Scenario, name: str, knobs_of: Callable) -> PoolDeployment:
    """``knobs_of(scenario, entry)``: the entry's knobs with engine-level settings (the runner's
    ``policy_knobs``, passed in so that this module and the runner do not import each other)."""
    from sim.errors import CbsimError

    pscn = pool_scenario(scn, name)
    entry = pscn.policies[0]
    try:
        dep = resolve(pscn)
        knobs = knobs_of(pscn, entry)
        limits = dep.limits_for(entry.name, knobs)
    except CbsimError as exc:
        raise CbsimError(f"disaggregation.{name}: {exc}") from None
    if name == "decode" and getattr(limits, "kv_offload", None) is not None:
        # the decode pool receives each prompt's KV over the link and never looks a prefix up:
        # KV offloading (and its tiers' hits) is the prefill pool's
        limits = dataclasses.replace(limits, kv_offload=None)
    probe = make_policy(entry.name, limits, **knobs)
    return PoolDeployment(name, dep, entry, knobs, limits, probe.max_slots, probe.token_budget,
                          probe.kv_blocks_total())


def run_disaggregated(scn: Scenario, specs, *, knobs_of: Callable, end_s: float | None,
                      horizon_reason: str = HORIZON_REACHED, on_progress: Callable[[int], None] | None = None,
                      fast_forward: bool | None = None, clients=None, drain_s: float | None = None,
                      cap_reason: Callable[[float], str] | None = None):
    """Simulate the scenario's disaggregated deployment on ``specs`` until ``end_s``; returns
    (requests, steps, summary, meta, simulation). The runner adds how the run ended."""
    dis = scn.disaggregation
    prefill, decode = resolve_pool(scn, "prefill", knobs_of), resolve_pool(scn, "decode", knobs_of)
    t = dis.transfer
    link = Link(t.link, t.bandwidth_gbps * 1e9, t.latency_s)
    top = DisaggregatedSimulation(specs, prefill.build(), decode.build(), link,
                                  prefill.dep.model.kv_bytes_per_token(), router=dis.router, horizon_s=end_s,
                                  on_progress=on_progress, fast_forward=fast_forward,
                                  horizon_reason=horizon_reason, clients=clients, drain_s=drain_s,
                                  cap_reason=cap_reason).run()
    requests, times = request_rows(top)
    steps = steps_frame(top)
    summary = summarize_disaggregated(top, requests, steps, times, prefill, decode, scn.slo)
    dec_lat = top.decode[0].latency
    meta = {
        "policy": decode.entry.name,
        "max_slots": decode.max_slots,
        "token_budget": decode.token_budget,
        "kv_blocks_total": decode.kv_blocks,
        "cpu_blocks_total": decode.limits.num_cpu_blocks,
        "block_size": decode.limits.block_size,
        "latency": dec_lat.name,
        "swap_s_per_block": dec_lat.swap_time(1),
        "disaggregated": True,
        "pools": {p.name: {"policy": p.entry.name, "instances": p.instances, "first_replica": first,
                           "max_slots": p.max_slots, "token_budget": p.token_budget,
                           "kv_blocks_total": p.kv_blocks, "block_size": p.limits.block_size}
                  for p, first in ((prefill, 0), (decode, prefill.instances))},
    }
    return requests, steps, summary, meta, top
