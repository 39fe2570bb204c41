"""Routers send each request where their rule says: exact round-robin order, least-outstanding
and least-kv decisions on hand-built timelines, prefix affinity keeping equal prefixes together,
and a stable hash that does not depend on the process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from policies.base import EngineLimits
from policies.registry import make_policy
from sim.engine import Simulation
from sim.errors import CbsimError
from sim.latency.constant import ConstantLatency
from sim.routing import ROUTERS, make_router, stable_bucket
from sim.workload.request_spec import RequestSpec
from tests.helpers import FAKE_GPU, FAKE_MODEL

LIMITS = EngineLimits(block_size=16, num_gpu_blocks=64, max_num_seqs=4, max_num_batched_tokens=256,
                      max_model_len=256)


def route(router: str, specs, replicas: int = 3, policy: str = "orca") -> dict[str, int]:
    reps = [(make_policy(policy, LIMITS), ConstantLatency(1.0, FAKE_MODEL, FAKE_GPU, 1, 16))
            for _ in range(replicas)]
    sim = Simulation(specs, reps, LIMITS.max_model_len, router=make_router(router))
    requests = sim.run().requests_frame()
    assert (requests["state"] == "finished").all()
    return dict(zip(requests["id"], requests["replica"]))


def spec(id_, arrival, out, prompt=4, runs=None):
    return RequestSpec(id_, arrival, prompt, out, out, prompt_runs=runs)


def test_round_robin_is_exact_arrival_order_mod_n():
    specs = [spec(f"r{i}", 0.1 * i, 1 + i % 5) for i in range(10)]
    assert list(route("round-robin", specs).values()) == [i % 3 for i in range(10)]


def test_least_outstanding_sends_to_the_replica_with_fewest_open_requests():
    # r0 (long) -> 0, r1 (short) -> 1; at t=5 r1 has ended and r0 has not: r2 -> 1; then each
    # replica has one open request: the tie goes to the lowest index, r3 -> 0
    specs = [spec("r0", 0.0, 20), spec("r1", 0.0, 2), spec("r2", 5.0, 20), spec("r3", 5.0, 20)]
    assert route("least-outstanding", specs, replicas=2) == {"r0": 0, "r1": 1, "r2": 1, "r3": 0}
    # round-robin would have sent r2 to the busy replica 0
    assert route("round-robin", specs, replicas=2)["r2"] == 0


def test_least_outstanding_balances_a_burst_exactly():
    specs = [spec(f"r{i}", 0.0, 3) for i in range(12)]
    counts = [list(route("least-outstanding", specs, replicas=4).values()).count(k) for k in range(4)]
    assert counts == [3, 3, 3, 3]


def test_least_kv_prefers_the_replica_with_less_memory_in_use():
    # r0 has a 200-token prompt (13 blocks) on replica 0, r1 a 4-token prompt (1 block) on replica 1;
    # at t=3 both still run (one open request each), so only KV use separates them: r2 -> 1
    specs = [spec("r0", 0.0, 20, prompt=200), spec("r1", 0.0, 20), spec("r2", 3.0, 5)]
    assert route("least-kv", specs, replicas=2) == {"r0": 0, "r1": 1, "r2": 1}
    # with equal KV use, ties fall to outstanding requests (then index)
    burst = [spec(f"r{i}", 0.0, 3) for i in range(6)]
    assert list(route("least-kv", burst, replicas=3).values()) == [0, 1, 2, 0, 1, 2]


def test_prefix_affinity_sends_equal_prefixes_to_one_replica():
    prefixes = [("sys", k) for k in range(6)]
    specs = [spec(f"r{i}", 0.05 * i, 3, prompt=40, runs=((prefixes[i % 6], 32), (("u", i), 8)))
             for i in range(36)]
    where = route("prefix-affinity", specs, replicas=3)
    by_prefix: dict = {}
    for i in range(36):
        by_prefix.setdefault(prefixes[i % 6], set()).add(where[f"r{i}"])
    assert all(len(reps) == 1 for reps in by_prefix.values())
    assert {p: reps.pop() for p, reps in by_prefix.items()} == {p: stable_bucket(p, 3) for p in prefixes}


def test_prefix_affinity_without_prefix_falls_back_to_least_outstanding():
    specs = [spec("r0", 0.0, 20), spec("r1", 0.0, 2), spec("r2", 5.0, 20)]
    assert route("prefix-affinity", specs, replicas=2) == {"r0": 0, "r1": 1, "r2": 1}


def test_stable_bucket_is_the_same_in_another_process():
    keys = [("sys", 1), "chat-42", 17]
    here = [stable_bucket(k, 7) for k in keys]
    code = ("from sim.routing import stable_bucket; "
            f"print([stable_bucket(k, 7) for k in {keys!r}])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123"}).stdout.strip()
    assert there == str(here)


def test_every_router_is_deterministic():
    specs = [spec(f"r{i}", 0.3 * i, 1 + (7 * i) % 11, prompt=4 + (5 * i) % 60,
                  runs=(((("p", i % 4)), 4 + (5 * i) % 60),)) for i in range(30)]
    for name in ROUTERS:
        assert route(name, specs) == route(name, specs)


def test_unknown_router_is_a_clear_error():
    with pytest.raises(CbsimError, match="did you mean 'round-robin'"):
        make_router("round-robn")


def test_prefix_affinity_treats_a_requests_own_content_as_no_prefix():
    own = [spec(f"r{i}", t, out, runs=(((("req", f"r{i}")), 4),)) for i, (t, out) in
           enumerate([(0.0, 20), (0.0, 2), (5.0, 20)])]
    assert route("prefix-affinity", own, replicas=2) == {"r0": 0, "r1": 1, "r2": 1}
