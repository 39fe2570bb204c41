"""Small builders shared by tests: fake model/GPU specs, small scenarios, a direct simulation
runner, a step-by-step driver of the whole-prompt paged policies, and a wall-clock limit."""

from __future__ import annotations

import os
import random
import signal
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from policies.base import EngineLimits, Request, Status, emit_tokens
from policies.registry import make_policy
from sim.engine import Simulation
from sim.hardware.models import ModelSpec
from sim.latency.constant import ConstantLatency
from sim.metrics.summary import summarize
from sim.workload.request_spec import RequestSpec

FAKE_MODEL = SimpleNamespace(
    num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16, dtype_bytes=2,
    kv_bytes_per_token=lambda tp=1: 2 * 4 * 16 * 2 * 2 // tp,
    weight_bytes=lambda tp=1: 1_000_000 // tp,
    flops_per_token=lambda tp=1: 2_000_000 / tp,
    # the whole per-token count in the layers, no LM head: FLOPs per token are the same whether a
    # backend counts the LM head per token or per sequence
    layer_flops_per_token=lambda tp=1: 2_000_000 / tp,
    lm_head_flops=lambda tp=1: 0.0,
)
# The fake's shapes as a real model spec, for backends that price each operator (the roofline).
FAKE_SPEC = ModelSpec("fake", FAKE_MODEL.num_layers, FAKE_MODEL.hidden_size, FAKE_MODEL.num_heads,
                      FAKE_MODEL.num_kv_heads, FAKE_MODEL.head_dim, 172, 1000)
FAKE_GPU = SimpleNamespace(name="fake", peak_flops=1e12, hbm_bandwidth=1e11, pcie_bandwidth=1e9,
                           memory_bytes=10**10)

# A five-request scenario of the tiny model on a constant clock: the base the bad-input tests
# break one field of at a time.
TINY_SCENARIO = {
    "name": "tiny",
    "model": "tiny",
    "hardware": {"gpu": "cpu"},
    "latency": {"backend": "constant", "step_s": 0.01},
    "workload": {"num_requests": 5, "arrival": {"process": "poisson", "rate": 2.0},
                 "prompt_tokens": {"dist": "fixed", "value": 20},
                 "output_tokens": {"dist": "fixed", "value": 5}},
    "engine": {"num_gpu_blocks": 64, "max_model_len": 512, "max_num_batched_tokens": 512},
    "policies": [{"name": "vllm-v1"}],
}


def two_turn_session_specs() -> list[RequestSpec]:
    """One session of two turns with a flush between them: turn 0 = a 512-token system prompt, a
    40-token message and an 8-token answer; at 3.0 s a 639-token request takes the GPU cache; turn
    1 (4.0 s) = the whole history plus 40 tokens, 600 in all. The tier closed forms' workload."""
    sys, u0, a0, u1 = (("system", 0), 512), (("user", 0, 0), 40), (("answer", 0, 0), 8), (("user", 0, 1), 40)
    return [
        RequestSpec("t0", 0.0, 552, 8, 8, prompt_runs=(sys, u0), output_key=("answer", 0, 0)),
        RequestSpec("flush", 3.0, 639, 1, 1),
        RequestSpec("t1", 4.0, 600, 4, 4, prompt_runs=(sys, u0, a0, u1), output_key=("answer", 0, 1)),
    ]


def random_sessions(rng: random.Random) -> list[RequestSpec]:
    """4-10 multi-turn sessions (1-4 turns, two system prompts, each turn's prompt the session's
    whole history), drawn from ``rng``: the workload of the tier conservation property tests."""
    specs, t = [], 0.0
    for s in range(rng.randint(4, 10)):
        t += rng.expovariate(2.0)
        history = [(("system", rng.randrange(2)), rng.choice([0, 64, 200]))]
        for k in range(rng.randint(1, 4)):
            history.append((("user", s, k), rng.randint(1, 120)))
            runs = tuple(r for r in history if r[1] > 0)
            out = rng.randint(1, 40)
            specs.append(
                RequestSpec(
                    f"s{s}t{k}",
                    t + 3.0 * k,
                    sum(n for _, n in runs),
                    out,
                    out,
                    prompt_runs=runs,
                    output_key=("answer", s, k),
                )
            )
            history.append((("answer", s, k), out))
    specs.sort(key=lambda x: x.arrival_s)
    return specs


def records_for(*reqs: Request) -> dict:
    """Engine-side records of policy requests driven by hand (no Simulation): each request's
    record finishes at its ``max_tokens``, so ``emit_caught_up`` can emit their tokens."""
    from sim.metrics.requests import RequestRecord

    out = {}
    for r in reqs:
        rec = RequestRecord(RequestSpec(r.id, 0.0, r.prompt_tokens, r.max_tokens, r.max_tokens))
        rec.req = r
        rec.finish_at = r.max_tokens
        out[r.id] = rec
    return out


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


def small_scenario(seed: int = 1, num_requests: int = 60,
                   policies: list[dict] | None = None, **extra) -> dict:
    """A scenario that simulates in milliseconds: the tiny model, one 10 ms step per iteration,
    short uniform lengths, 128 KV blocks of 16 tokens, an SLO (``extra``: more top-level keys)."""
    return {
        "name": "small", "seed": seed, "model": "tiny", "hardware": {"gpu": "cpu"},
        "latency": {"backend": "constant", "step_s": 0.01},
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": 5.0},
                     "prompt_tokens": {"dist": "uniform", "min": 8, "max": 64},
                     "output_tokens": {"dist": "uniform", "min": 4, "max": 40}, "max_tokens": 64},
        "engine": {"block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 256, "max_model_len": 256,
                   "num_gpu_blocks": 128},
        "policies": policies if policies is not None else [{"name": "static", "batch_size": 8}, {"name": "orca"}],
        "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
        **extra,
    }


def overload_scenario(name: str, num_requests: int, rate: float, policies: list[dict], horizon_s: float) -> dict:
    """Far more traffic than a 200-block pool serves (the tiny model, 50 ms steps): a backlog
    builds up until ``horizon_s``."""
    return {
        "name": name,
        "model": "tiny",
        "hardware": {"gpu": "cpu"},
        "latency": {"backend": "constant", "step_s": 0.05},
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_tokens": {"dist": "uniform", "min": 100, "max": 400},
                     "output_tokens": {"dist": "uniform", "min": 50, "max": 200}},
        "engine": {"num_gpu_blocks": 200, "max_model_len": 1024, "max_num_batched_tokens": 1024, "max_num_seqs": 16},
        "policies": policies,
        "horizon_s": horizon_s,
    }


def long_prompt_disagg_scenario() -> dict:
    """4,000-token prompts, 200-token outputs at 6 req/s on H200s (llama-3-8b, roofline) with a
    p99 TPOT SLO of 7 ms that colocated chunked prefill misses and a disaggregated layout meets:
    the planner's worked case (tests/test_disaggregation.py, tests/test_search_progress.py)."""
    return {"name": "long-prompts", "seed": 1, "model": "llama-3-8b", "hardware": {"gpu": "h200"},
            "latency": {"backend": "roofline"},
            "workload": {"num_requests": 320, "arrival": {"process": "poisson", "rate": 6.0},
                         "prompt_tokens": {"dist": "fixed", "value": 4000},
                         "output_tokens": {"dist": "fixed", "value": 200}},
            "engine": {"max_model_len": 8192, "max_num_batched_tokens": 8192, "max_num_seqs": 64},
            "policies": [{"name": "vllm-v1", "label": "chunked"}],
            "replicas": {"router": "least-outstanding"},
            "slo": {"ttft_s": 1.0, "tpot_s": 0.007, "percentile": 99}, "cost_per_gpu_hour": 2.0,
            "disaggregation": {}}


def req(id: str, prompt: int, seq: int = 0) -> Request:
    """A request arriving at ``seq`` seconds with a prompt of ``prompt`` tokens and no real max_tokens."""
    return Request(id, arrival_s=float(seq), prompt_tokens=prompt, max_tokens=10_000, seq=seq)


def drive_paged_policy(policy, workload, max_steps=5000, *, before_schedule=None, on_plan=None,
                       on_step=None) -> tuple[list[Request], list[Request]]:
    """Drive a policy with a V0 block manager (``policy.blocks``: vllm-v0, sarathi) step by step
    without SimPy: the engine protocol in miniature (policies/base.py). ``workload``: (arrival
    step, Request, output length); the output lengths stay with the driver, which (never the
    policy) decides which requests are done.

    Each step: arrivals, ``before_schedule()``, ``schedule``, the block manager's check,
    ``on_plan(plan)``, ``emit_tokens``, ``finish_step`` of the requests that are done (their
    output length, or max_model_len), the check again, ``on_step(plan, emitted, done)``. Fails if
    a policy with work returns an empty plan, or does not drain within ``max_steps``; at the end
    every GPU block is free. Returns (finished, rejected)."""
    out_len = {req.id: n for _, req, n in workload}
    pending = sorted(workload, key=lambda w: (w[0], w[1].seq))
    finished: list[Request] = []
    rejected: list[Request] = []
    for step in range(max_steps):
        while pending and pending[0][0] <= step:
            policy.add_request(pending.pop(0)[1])
        if not pending and not policy.has_work():
            break
        if before_schedule:
            before_schedule()
        had_work = policy.has_work()
        plan = policy.schedule()
        policy.blocks.check()
        # The engine ends a run whose policy has work but returns an empty plan: never do that.
        assert not had_work or not plan.is_empty or plan.rejected, f"stuck at step {step}"
        if on_plan:
            on_plan(plan)
        rejected += plan.rejected
        emitted = emit_tokens(plan)
        done = [
            r
            for r in emitted
            if r.num_output_tokens >= out_len[r.id] or r.num_tokens >= policy.limits.max_model_len
        ]
        policy.finish_step(plan, done)
        policy.blocks.check()
        if on_step:
            on_step(plan, emitted, done)
        finished += done
    else:
        raise AssertionError(f"not drained after {max_steps} steps")
    assert policy.kv_blocks_used() == 0 and policy.blocks.free_gpu_blocks == policy.limits.num_gpu_blocks
    return finished, rejected


def engine_step(policy, *, check_invariants: bool = False):
    """One engine step of a policy driven directly: schedule, emit tokens, finish the requests at
    their ``max_tokens`` (ignore_eos); the policy's own invariant check after it when asked."""
    plan = policy.schedule()
    finished = [r for r in emit_tokens(plan) if r.num_output_tokens >= r.max_tokens]
    policy.finish_step(plan, finished)
    if check_invariants:
        policy.check_invariants()
    return plan, finished


def scheduled_tokens(plan) -> dict[str, int]:
    """Request id -> tokens the step computes for it."""
    return {r.id: n for r, n in zip(plan.scheduled, plan.num_new_tokens)}


def require_aic():
    """Skip a test that reads AIConfigurator's kernel database when aiconfigurator-core is not
    installed; on CI (CI=true) fail instead, so the check cannot silently stop running there."""
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        msg = "aiconfigurator-core is not installed: pip install -e '.[gpu-data]'"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)


@contextmanager
def wall_clock_limit(seconds: float):
    """Raise TimeoutError if the block runs longer than ``seconds`` (SIGALRM; main thread)."""
    def on_alarm(signum, frame):
        raise TimeoutError(f"no end within {seconds} s: an endless loop?")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """``cbsim ARGS`` in this process through the real entry point (``sim.cli.main.main``), so a test
    sees exactly what a user sees; returns (exit code, stdout, stderr)."""
    import sys

    from sim.cli import main as entry

    old = sys.argv
    sys.argv = ["cbsim", *map(str, args)]
    try:
        entry.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


def first_step_of(policy, rid: str, arrive, steps: int = 8) -> int:
    """The 1-based step in which request ``rid`` is first scheduled, the policy driven by hand (each
    step's tokens emitted, requests at ``max_tokens`` finished); ``arrive(k, in_flight)`` adds
    requests while step k runs (in_flight True) or after it ends, before the next schedule (False).
    How an engine that fetches requests a step late (TensorRT-LLM's overlap scheduler, vLLM's
    async admission) is checked against one that does not."""
    for k in range(1, steps + 1):
        plan = policy.schedule()
        if any(r.id == rid for r in plan.scheduled):
            return k
        arrive(k, True)
        done = [r for r in emit_tokens(plan) if r.num_output_tokens >= r.max_tokens]
        for r in done:
            r.status = Status.FINISHED
        policy.finish_step(plan, done)
        arrive(k, False)
    raise AssertionError(f"{rid} never scheduled in {steps} steps")


GPT_OSS = "openai/gpt-oss-120b"


def gpt_oss_moe_db(gpu, layout, kernel="database", engine="vllm"):
    """gpt-oss-120b's kernel_db_moe database on ``gpu`` in ``layout``, its experts on ``kernel``."""
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_moe import MoeKernelDb

    return MoeKernelDb(resolve_model(GPT_OSS), gpu, layout, engine=engine, moe_kernel=kernel)


def moe_per_layer_ms(db, tokens) -> float:
    """The routed experts' time of one layer at ``tokens`` tokens, ms."""
    return db.linear_ops(tokens)["moe"].seconds * 1e3 / db.model.spec.num_layers


def moe_build_kwargs(monkeypatch, key: tuple) -> dict:
    """The keyword arguments ``bench/silicon_accuracy.py``'s ``build_one`` hands
    ``kernel_db_moe.build_table`` for a table key (the build stopped before anything is composed)."""
    from pathlib import Path

    import bench.silicon_accuracy as sa
    from calib.sources import kernel_db_moe
    from sim.errors import CbsimError

    seen: dict = {}

    def fake_build(*args, **kw):
        seen.update(kw)
        raise CbsimError("stop")

    monkeypatch.setattr(kernel_db_moe, "build_table", fake_build)
    monkeypatch.setattr(sa, "CACHE", Path("/nonexistent-cbsim-cache"))
    assert sa.build_one((key, "d"))[2] == "stop"
    return seen


def inferencemax_gpt_oss_row(image: str, **kw):
    """A corpus row of InferenceMAX's vLLM gpt-oss-120b sweep (its dated CSV, 1k/1k, 8 clients) as
    ``bench/silicon_accuracy.py`` reads it, measured with the vLLM ``image`` version; ``kw`` overrides
    any field (``system``, ``tp``, the ``version`` the corpus states ...)."""
    from bench.silicon_accuracy import Row

    base = dict(id="r", engine="vllm", version=image, model=GPT_OSS, system="h200_sxm", precision="fp4", tp=8,
                isl=1024, osl=1024, concurrency=8, ttft_ms=100.0, tpot_ms=10.0,
                source=f"source_file=2026-03-25.csv; model=GPT-OSS-120B; image=vllm/vllm-openai:v{image}")
    base.update(kw)
    return Row(**base)
