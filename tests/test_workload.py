"""Workloads: arrival processes and length distributions hit their parameters, everything is
reproducible from the seed, and max_tokens / prefixes / traces follow DESIGN.md.

Tolerances are 5 standard errors of the estimator over the sample (a seeded run, so the test
is deterministic; 5 SE means it would pass for practically any seed):
- mean rate from n gaps with coefficient of variation c: SE(rate)/rate = c / sqrt(n);
- sample CV of n gamma gaps (exponential: c = 1): by the delta method,
  Var(log ĉ) = [(κ − 1)/4 + c² − γ·c] / n with kurtosis κ = 3 + 6c² and skewness γ = 2c,
  i.e. SE(ĉ)/c = sqrt((0.5 + 0.5·c²) / n);
- lognormal mean: SE/mean = sqrt(exp(σ²) − 1) / sqrt(n);
- lognormal p99: SE(q̂)/q = sqrt(p(1 − p)/n) · σ / φ(z), since the density at q is φ(z)/(q·σ).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.errors import CbsimError, ScenarioError
from sim.scenario.schema import load_scenario
from sim.workload.distributions import Z99, lognormal_params
from sim.workload.synthetic import build_workload, workload_stats

N = 100_000


def scenario(workload: dict, **extra):
    data = {"model": "tiny", "hardware": {"gpu": "cpu"}, "latency": {"backend": "constant", "step_s": 0.01},
            "engine": {"num_gpu_blocks": 100}, "workload": workload, "policies": [{"name": "orca"}]}
    data.update(extra)
    return load_scenario(data)


def fixed(n=1):
    return {"dist": "fixed", "value": n}


def arrivals_of(arrival: dict, n: int = N + 1, seed: int = 0) -> np.ndarray:
    scn = scenario({"num_requests": n, "arrival": arrival, "prompt_tokens": fixed(), "output_tokens": fixed()},
                   seed=seed)
    return np.array([s.arrival_s for s in build_workload(scn)])


@pytest.mark.parametrize("rate", [0.5, 8.0])
def test_poisson_has_the_requested_rate_and_cv_1(rate):
    t = arrivals_of({"process": "poisson", "rate": rate})
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    assert abs(1 / gaps.mean() / rate - 1) < 5 / math.sqrt(N)
    assert abs(gaps.std() / gaps.mean() - 1) < 5 * math.sqrt(1.0 / N)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_has_the_requested_rate_and_cv(cv):
    rate = 4.0
    gaps = np.diff(arrivals_of({"process": "gamma", "rate": rate, "cv": cv}))
    assert abs(1 / gaps.mean() / rate - 1) < 5 * cv / math.sqrt(N)
    assert abs(gaps.std() / gaps.mean() / cv - 1) < 5 * math.sqrt((0.5 + 0.5 * cv * cv) / N)


def test_constant_arrivals_are_evenly_spaced():
    t = arrivals_of({"process": "constant", "rate": 4.0}, n=9)
    assert t.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]


def test_changing_only_the_rate_time_scales_the_same_pattern():
    base = {"num_requests": 500, "arrival": {"process": "gamma", "rate": 2.0, "cv": 3.0}}
    slow, fast = build_workload(scenario(base)), build_workload(scenario({**base, "arrival": {**base["arrival"], "rate": 8.0}}))
    assert np.allclose([s.arrival_s for s in slow], [4 * f.arrival_s for f in fast], rtol=1e-12, atol=0)
    assert [(s.prompt_tokens, s.output_tokens) for s in slow] == [(f.prompt_tokens, f.output_tokens) for f in fast]


def test_seeded_and_reproducible():
    w = {"num_requests": 200, "arrival": {"rate": 3.0}}
    a, b = build_workload(scenario(w, seed=5)), build_workload(scenario(w, seed=5))
    assert a == b
    c = build_workload(scenario(w, seed=6))
    assert [s.arrival_s for s in a] != [s.arrival_s for s in c]
    assert [s.prompt_tokens for s in a] != [s.prompt_tokens for s in c]


def test_ids_are_zero_padded_in_arrival_order():
    specs = build_workload(scenario({"num_requests": 12, "arrival": {"rate": 1.0}}))
    assert [s.id for s in specs] == [f"r{i:06d}" for i in range(12)]
    assert [s.arrival_s for s in specs] == sorted(s.arrival_s for s in specs)


# --- lengths -------------------------------------------------------------------------------------
def test_lognormal_parameters_solve_mean_and_p99():
    mu, sigma = lognormal_params(1155, 4142)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(1155, rel=1e-12)
    assert math.exp(mu + Z99 * sigma) == pytest.approx(4142, rel=1e-12)
    # the smaller root of σ²/2 − zσ + ln(4142/1155) = 0: ln(4142/1155) = 1.27709, z² = 5.41189,
    # σ = 2.32635 − sqrt(5.41189 − 2 × 1.27709) = 2.32635 − 1.69048 = 0.63587
    assert sigma == pytest.approx(0.63587, abs=1e-5)
    with pytest.raises(CbsimError, match="0 < mean < p99"):
        lognormal_params(100, 50)
    with pytest.raises(CbsimError, match="at most 14.97"):
        lognormal_params(100, 1500)


@pytest.mark.parametrize("mean,p99", [(1155, 4142), (211, 601)])
def test_lognormal_lengths_hit_mean_and_p99(mean, p99):
    scn = scenario({"num_requests": N, "arrival": {"rate": 1.0},
                    "prompt_tokens": {"dist": "lognormal", "mean": mean, "p99": p99}, "output_tokens": fixed()},
                   engine={"num_gpu_blocks": 100, "max_model_len": 1 << 20})
    x = np.array([s.prompt_tokens for s in build_workload(scn)])
    _, sigma = lognormal_params(mean, p99)
    se_mean = math.sqrt(math.exp(sigma**2) - 1) / math.sqrt(N)
    phi = math.exp(-Z99**2 / 2) / math.sqrt(2 * math.pi)
    se_p99 = math.sqrt(0.99 * 0.01 / N) * sigma / phi
    assert abs(x.mean() / mean - 1) < 5 * se_mean
    assert abs(np.percentile(x, 99) / p99 - 1) < 5 * se_p99
    assert x.min() >= 1 and x.dtype.kind == "i"


def test_uniform_is_inclusive_and_fixed_is_fixed():
    scn = scenario({"num_requests": 2000, "arrival": {"rate": 1.0},
                    "prompt_tokens": {"dist": "uniform", "min": 3, "max": 7}, "output_tokens": fixed(5)})
    specs = build_workload(scn)
    assert sorted({s.prompt_tokens for s in specs}) == [3, 4, 5, 6, 7]
    assert {s.output_tokens for s in specs} == {5}


def test_synthetic_prompts_are_clipped_and_counted_and_outputs_cut_by_the_engine():
    from sim.runner import run
    from sim.workload.synthetic import PROMPT_CLIPPED

    scn = scenario({"num_requests": 300, "arrival": {"rate": 1.0},
                    "prompt_tokens": {"dist": "uniform", "min": 50, "max": 200},
                    "output_tokens": {"dist": "uniform", "min": 50, "max": 200}},
                   engine={"num_gpu_blocks": 100, "max_model_len": 128})
    specs = build_workload(scn)
    assert max(s.prompt_tokens for s in specs) == 127
    clipped = [s for s in specs if s.cut]
    assert clipped and all(s.cut == PROMPT_CLIPPED and s.prompt_tokens == 127 for s in clipped)
    assert all(s.max_tokens == 128 - s.prompt_tokens for s in specs), "default: max_model_len - prompt"
    # outputs keep their own length; the engine stops them at the context and the run counts them
    long = sum(s.prompt_tokens + s.output_tokens > 128 for s in specs)
    assert long > 250
    res = run(scn)
    summary = res.summaries["orca"]
    assert summary["workload_cuts"] == {PROMPT_CLIPPED: len(clipped)}
    assert summary["requests_cut"] == {"max_model_len": long, "max_tokens": 0}
    fin = res.requests[res.requests["state"] == "finished"]
    assert (fin["prompt_tokens"] + fin["generated"] <= 128).all()


def test_max_tokens_set_by_the_workload_is_every_request_s_limit():
    scn = scenario({"num_requests": 200, "arrival": {"rate": 1.0}, "max_tokens": 300,
                    "output_tokens": {"dist": "uniform", "min": 100, "max": 600}})
    specs = build_workload(scn)
    assert {s.max_tokens for s in specs} == {300}
    # the outputs keep their own length: the engine stops them at 300 (counted as cut by max_tokens)
    assert max(s.output_tokens for s in specs) > 300 and min(s.output_tokens for s in specs) >= 100


# --- prefixes ------------------------------------------------------------------------------------
def test_prefix_groups_share_their_first_tokens():
    scn = scenario({"num_requests": 400, "arrival": {"rate": 1.0}, "prefix": {"num_groups": 3, "prefix_len": 100},
                    "prompt_tokens": {"dist": "uniform", "min": 50, "max": 300}})
    specs = build_workload(scn)
    groups = set()
    for s in specs:
        assert sum(n for _, n in s.prompt_runs) == s.prompt_tokens
        (key, n), *rest = s.prompt_runs
        assert key[0] == "group" and n == min(100, s.prompt_tokens)
        groups.add(key[1])
        assert rest == ([(("req", s.id), s.prompt_tokens - 100)] if s.prompt_tokens > 100 else [])
    assert groups == {0, 1, 2}
    assert workload_stats(specs)["shared_prompt_fraction"] > 0.3


def test_without_prefixes_every_prompt_is_unique():
    specs = build_workload(scenario({"num_requests": 5, "arrival": {"rate": 1.0}}))
    # left to Request's default run ("req", id): each prompt its own from its first token
    from policies.base import Request
    from sim.workload.sharing import shareable_tokens

    assert all(Request(s.id, 0.0, s.prompt_tokens, s.max_tokens, prompt_runs=s.prompt_runs).prompt_runs
               == ((("req", s.id), s.prompt_tokens),) for s in specs)
    assert shareable_tokens(specs) == [0] * 5


# --- written-out requests ------------------------------------------------------------------------
def test_written_out_requests_keep_exact_lengths():
    scn = scenario({"requests": [
        {"prompt_tokens": 4, "output_tokens": 3},
        {"arrival_s": 2.0, "prompt_tokens": 5, "output_tokens": 8, "max_tokens": 10, "priority": 1},
        {"arrival_s": 1.0, "prompt_tokens": 6, "output_tokens": 2},
    ]})
    specs = build_workload(scn)
    assert [(s.id, s.arrival_s, s.prompt_tokens, s.output_tokens, s.max_tokens, s.priority) for s in specs] == [
        ("r000000", 0.0, 4, 3, 3, 0), ("r000002", 1.0, 6, 2, 2, 0), ("r000001", 2.0, 5, 8, 10, 1)]
    with pytest.raises(ScenarioError, match=r"workload\.requests\.1: output_tokens \(8\) exceeds workload\.max_tokens \(5\)"):
        build_workload(scenario({"max_tokens": 5, "requests": [{"prompt_tokens": 4, "output_tokens": 3},
                                                                {"prompt_tokens": 4, "output_tokens": 8}]}))


def test_seed_toy_workload():
    from pathlib import Path

    specs = build_workload(load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "seed_toy.yaml"))
    assert [(s.prompt_tokens, s.output_tokens, s.max_tokens) for s in specs] == [
        (4, 3, 3), (4, 8, 8), (4, 3, 3), (4, 4, 4), (4, 2, 2), (4, 2, 2)]
    assert {s.arrival_s for s in specs} == {0.0}


# --- traces through the workload -----------------------------------------------------------------
def _trace(tmp_path) -> str:
    f = tmp_path / "t.csv"
    rows = "\n".join(f"{t},{p},{o}" for t, p, o in [(0, 10, 1), (1, 20, 2), (2, 30, 3), (3, 40, 4), (4, 50, 5)])
    f.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    return str(f)


def test_trace_replay_with_window_scale_and_count(tmp_path):
    path = _trace(tmp_path)
    specs = build_workload(scenario({"trace": {"path": path, "window_s": [1, 4], "rate_scale": 2.0}}))
    # the trace has no client limit: max_tokens is vLLM's fill-in, max_model_len - prompt (never the output)
    mml = 8192
    assert [(s.arrival_s, s.prompt_tokens, s.output_tokens, s.max_tokens) for s in specs] == [
        (0.0, 20, 2, mml - 20), (0.5, 30, 3, mml - 30), (1.0, 40, 4, mml - 40)]
    assert len(build_workload(scenario({"trace": {"path": path}, "num_requests": 2}))) == 2
    with pytest.raises(ScenarioError, match="has only 5 requests in its window"):
        build_workload(scenario({"trace": {"path": path}, "num_requests": 6}))


def test_trace_lengths_resampled_under_synthetic_arrivals(tmp_path):
    path = _trace(tmp_path)
    specs = build_workload(scenario({"trace": {"path": path}, "num_requests": 300, "arrival": {"rate": 5.0},
                                     "prompt_tokens": {"dist": "trace"}, "output_tokens": {"dist": "trace"}}))
    pairs = {(s.prompt_tokens, s.output_tokens) for s in specs}
    assert pairs == {(10, 1), (20, 2), (30, 3), (40, 4), (50, 5)}, "whole rows are resampled"
    assert all(s.max_tokens == 8192 - s.prompt_tokens for s in specs)
    from sim.workload.sharing import shareable_tokens

    assert shareable_tokens(specs) == [0] * 300, "resampled prompts get fresh content"


def test_workload_stats_on_a_known_workload():
    scn = scenario({"num_requests": 5, "arrival": {"process": "constant", "rate": 2.0},
                    "prompt_tokens": fixed(10), "output_tokens": fixed(4)})
    stats = workload_stats(build_workload(scn))
    assert stats["num_requests"] == 5 and stats["duration_s"] == 2.0 and stats["mean_rate_rps"] == 2.0
    assert stats["interarrival_cv"] == 0.0
    assert stats["prompt_tokens"] == {"mean": 10.0, "p50": 10.0, "p90": 10.0, "p99": 10.0, "max": 10}
    assert stats["total_prompt_tokens"] == 50 and stats["total_output_tokens"] == 20
    assert stats["shared_prompt_fraction"] == 0.0
