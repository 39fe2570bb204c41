"""Data-parallel ranks of an MoE engine step together (sim/lockstep.py); a dense model's do not."""

from __future__ import annotations

import pytest
import simpy

from sim import run
from sim.lockstep import LockstepGroup
from sim.scenario.schema import load_scenario


class _Rank:
    """A stand-in rank: one step of ``dt`` seconds when it has work."""

    def __init__(self, dt: float, steps: int) -> None:
        self.dt, self.left, self.arrivals_done = dt, steps, True
        self.ended: list[tuple[float, float, float]] = []
        self.policy = self

    def has_work(self) -> bool:
        return self.left > 0

    def adp_balance(self):  # its policy has no balance rule (policies.base.Policy's default)
        return None

    def join_lockstep(self, peers) -> None:
        pass

    def idle_iteration(self) -> None:
        pass

    def plan_step(self, start):
        return ((self.dt,), False) if self.left else (None, False)

    def finish_planned(self, item, start, now, dt):
        self.left -= 1
        self.ended.append((start, now, dt))


def test_a_group_step_lasts_as_long_as_its_slowest_rank():
    env = simpy.Environment()
    fast, slow, idle = _Rank(3.0, 2), _Rank(5.0, 1), _Rank(1.0, 0)
    LockstepGroup(env, [fast, slow, idle])
    env.run()
    assert slow.ended == [(0.0, 5.0, 5.0)]
    assert fast.ended == [(0.0, 5.0, 5.0), (5.0, 8.0, 3.0)]  # alone in its second step: its own time
    assert idle.ended == []


def _scenario(model, dp, ep, requests=60):
    return load_scenario(
        {
            "model": model,
            "hardware": {"gpu": "h200", "data_parallel": dp, "expert_parallel": ep},
            "workload": {
                "num_requests": requests,
                "arrival": {"rate": 30.0},
                "prompt_tokens": {"dist": "uniform", "min": 64, "max": 2048},
                "output_tokens": {"dist": "uniform", "min": 8, "max": 128},
            },
        }
    )


def _overlaps(steps) -> tuple[int, int]:
    """(steps of one rank that start while another rank's step is under way, steps sharing a start
    with another rank's step whose end differs)."""
    rows = list(zip(steps.replica, steps.start_s, steps.start_s + steps.duration_s))
    inside = sum(1 for r, s, _ in rows for r2, s2, e2 in rows if r2 != r and s2 < s < e2 - 1e-12)
    ragged = sum(1 for r, s, e in rows for r2, s2, e2 in rows if r2 != r and s2 == s and abs(e2 - e) > 1e-12)
    return inside, ragged


def test_dp_ranks_of_an_moe_engine_step_in_lockstep():
    res = run(_scenario("openai/gpt-oss-20b", 2, True))
    steps = res.steps
    assert set(steps.replica) == {0, 1}
    assert _overlaps(steps) == (0, 0)
    shared = steps.groupby("start_s").replica.nunique()
    assert (shared == 2).sum() > 10  # both ranks ran together in many steps
    assert res.summaries["vllm-v1"]["requests_finished"] == 60


def test_dp_ranks_of_a_dense_model_stay_independent_engines():
    steps = run(_scenario("llama-3-8b", 2, False)).steps
    inside, _ = _overlaps(steps)
    assert inside > 0  # one rank's steps start inside the other's


class _MoeRank(_Rank):
    """A stand-in rank whose step of ``tokens`` tokens is ``dense`` seconds plus the experts'
    ``moe_group(tokens)`` (what a kernel-db attention-DP table's linear(T) holds)."""

    class _Latency:
        @staticmethod
        def moe_group(tokens: float) -> float:
            return 0.01 * tokens  # the experts over D x tokens: 10 ms per token per rank

    latency = _Latency()

    def __init__(self, dense: float, tokens: int) -> None:
        super().__init__(dense + self.latency.moe_group(tokens), 1)
        self.tokens = tokens

    def plan_step(self, start):
        shape = type("Shape", (), {"num_tokens": self.tokens})()
        return ((self.dt, None, shape), False) if self.left else (None, False)


def test_unequal_ranks_run_the_experts_once_over_the_groups_tokens():
    """One rank prefills 1,000 tokens beside 3 ranks decoding 8: the experts see 1,024 tokens (a mean of
    256 per rank), not 4 x 1,000 as the prefill rank's own price assumes. Each rank keeps its dense
    layers and attention on its own tokens: 4 s + moe_group(256) = 6.56 s, not 4 s + 10 s."""
    env = simpy.Environment()
    ranks = [_MoeRank(4.0, 1000)] + [_MoeRank(0.5, 8) for _ in range(3)]
    LockstepGroup(env, ranks)
    env.run()
    assert ranks[0].ended == [(0.0, pytest.approx(6.56), pytest.approx(6.56))]
    assert {r.ended[0][2] for r in ranks} == {ranks[0].ended[0][2]}


def test_equal_ranks_keep_their_own_price_exactly():
    env = simpy.Environment()
    ranks = [_MoeRank(0.3, 16) for _ in range(4)]
    LockstepGroup(env, ranks)
    env.run()
    assert all(r.ended == [(0.0, 0.3 + 0.16, 0.3 + 0.16)] for r in ranks)  # bit for bit
