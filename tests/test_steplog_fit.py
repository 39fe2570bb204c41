"""Step logs and the fit: the reader's records and errors, the NNLS solver's optimality conditions,
recovery of a known table from steps priced by it, and the fit of the real vLLM CPU run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policies.base import StepPlan
from sim.errors import CbsimError
from sim.hardware.gpus import get_gpu
from sim.hardware.models import get_model
from sim.latency import step_shape
from sim.latency.fit import default_grids, fit_steplog, nnls, predict_steps
from sim.latency.table import TableLatency
from sim.latency.table_format import LatencyTable, make_component, read_table, write_table
from sim.recorded.steplog import EngineConfig, LoggedRequest, LoggedStep, StepLog, read_steplog

TINY = get_model("tiny")
CONFIG = EngineConfig(block_size=32, num_gpu_blocks=47, max_num_batched_tokens=256, max_num_seqs=64,
                      max_model_len=1024)


# --- the reader ----------------------------------------------------------------------------------
def test_reads_the_vllm_cpu_run(shared_ref):
    log = read_steplog(shared_ref / "vllm-cpu-runs" / "fit.json")
    assert (len(log.requests), len(log.steps)) == (120, 3283)
    assert log.config == EngineConfig(32, 47, 256, 64, 1024, "fcfs", False, True, 1)
    assert log.model == TINY.to_dict() and log.device == "cpu" and log.format == "vllm-json"
    first = log.steps[0]
    assert first.batch == (("r0000", 184, 0),) and first.prefill_chunks == [(184, 0)]
    assert log.steps[1].decode_contexts == [184] and log.steps[1].num_tokens == 1
    r0 = log.requests[0]
    assert (r0.prompt_tokens, r0.max_tokens, len(r0.token_times_s), r0.finished) == (184, 49, 49, True)
    # every output token appears at the end of a step
    ends = {s.end_s for s in log.steps}
    assert all(t in ends for r in log.requests for t in r.token_times_s)


def _write(tmp_path, data, name="run.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def _minimal():
    return {
        "source": "vLLM test, fp32", "model": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
                                               "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
                                               "vocab_size": 1000},
        "config": {"block_size": 32, "num_blocks": 48, "max_num_batched_tokens": 256, "max_num_seqs": 64,
                   "max_model_len": 1024, "policy": "fcfs", "enable_prefix_caching": False},
        "requests": [{"id": "a", "arrival_s": 0.0, "prompt_tokens": 3, "max_tokens": 2, "token_times_s": [0.1, 0.2],
                      "preemptions": 0}],
        "steps": [{"start_s": 0.0, "end_s": 0.1, "scheduled": {"a": 3}, "context": {"a": 0}, "preempted": []},
                  {"start_s": 0.11, "end_s": 0.2, "scheduled": {"a": 1}, "context": {"a": 3}, "preempted": []}],
    }


def test_reader_errors_name_the_file_and_the_key(tmp_path):
    data = _minimal()
    del data["steps"][1]["end_s"]
    with pytest.raises(CbsimError, match=r"run\.json: steps\[1\]\.end_s: required key is missing"):
        read_steplog(_write(tmp_path, data))
    data = _minimal()
    data["steps"][0]["scheduled"] = {"b": 3}
    with pytest.raises(CbsimError, match=r"steps\[0\]\.scheduled: request 'b' is not in requests\[\]"):
        read_steplog(_write(tmp_path, data))
    data = _minimal()
    data["requests"][0]["max_tokens"] = "2"
    with pytest.raises(CbsimError, match=r"requests\[0\]\.max_tokens: expected an integer"):
        read_steplog(_write(tmp_path, data))
    data = _minimal()
    data["source"] = "no dtype here"
    with pytest.raises(CbsimError, match=r"model\.dtype: missing"):
        read_steplog(_write(tmp_path, data))
    with pytest.raises(CbsimError, match=r"run\.json:1:2: not valid JSON"):
        read_steplog(_write(tmp_path, "{oops"))
    with pytest.raises(CbsimError, match="not a step log cbsim can read; known formats: vllm-json"):
        read_steplog(_write(tmp_path, {"steps": []}))
    with pytest.raises(CbsimError, match="does not exist"):
        read_steplog(tmp_path / "missing.json")


def test_a_model_that_is_not_registered_stays_inline(tmp_path):
    data = _minimal()
    data["model"]["vocab_size"] = 2000
    log = read_steplog(_write(tmp_path, data))
    assert log.model["name"] == "steplog-model" and log.model["vocab_size"] == 2000 and log.model["dtype"] == "fp32"


def test_busy_gaps_leave_out_idle_waits():
    # request a runs in steps 0-1; b arrives 5 s later and runs in steps 2-3
    reqs = [LoggedRequest("a", 0.0, 3, 2, (0.1, 0.2)), LoggedRequest("b", 5.0, 3, 2, (5.1, 5.2))]
    steps = [LoggedStep(0.0, 0.1, (("a", 3, 0),)), LoggedStep(0.103, 0.2, (("a", 1, 3),)),
             LoggedStep(5.0, 5.1, (("b", 3, 0),)), LoggedStep(5.104, 5.2, (("b", 1, 3),))]
    log = StepLog(None, "test", "test", "cpu", TINY.to_dict(), CONFIG, reqs, steps)
    assert log.busy_gaps() == pytest.approx([0.003, None, 0.004, None])


# --- NNLS ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_nnls_meets_the_optimality_conditions(seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(60, 12)) * rng.uniform(0.01, 100, size=12)  # badly scaled columns
    b = rng.normal(size=60)
    x = nnls(A, b)
    grad = A.T @ (b - A @ x)  # minus half the gradient of ||Ax - b||^2
    scale = np.linalg.norm(A, axis=0) * np.linalg.norm(b)
    assert (x >= 0).all()
    assert (grad / scale <= 1e-9).all()  # no feasible descent direction
    assert np.abs(grad[x > 0] / scale[x > 0]).max() < 1e-9  # stationary on the free variables
    assert 0 < (x > 0).sum() < 12  # the constraint binds somewhere


def test_nnls_equals_least_squares_when_the_solution_is_positive():
    rng = np.random.default_rng(7)
    A = rng.uniform(size=(40, 5))
    x_true = np.array([1.0, 2.0, 0.5, 3.0, 0.1])
    assert nnls(A, A @ x_true) == pytest.approx(x_true, rel=1e-9)


# --- recovering a known table --------------------------------------------------------------------
def known_table() -> LatencyTable:
    """A table in the fit's family (monotone, supermodular, zero where no work) on its grids."""
    g = default_grids(CONFIG)
    (tok,), (n, c), (b, cd) = g["linear"], g["prefill_attn"], g["decode_attn"]
    comps = {
        "overhead": make_component("overhead", (), 3e-3),
        "step_gap": make_component("step_gap", (), 2e-4),
        "linear": make_component("linear", (tok,), [3e-5 * t + (4e-4 if t else 0) for t in tok]),
        "prefill_attn": make_component("prefill_attn", (n, c),
                                       [[2e-4 + 1e-7 * i * (j + i / 2) for j in c] for i in n]),
        "decode_attn": make_component("decode_attn", (b, cd), [[4e-7 * i * j for j in cd] for i in b]),
    }
    meta = {"format_version": 1, "source": "calib", "device": "synthetic", "model": TINY.to_dict(), "dtype": "fp32",
            "block_size": 32, "tensor_parallel": 1, "date": "2026-01-01", "grid": {}}
    return LatencyTable(comps, meta)


def synthetic_log(table: LatencyTable, n_steps: int, seed: int) -> StepLog:
    """Steps of random composition, each lasting exactly what the table prices (gap: step_gap)."""
    lat = TableLatency(table, TINY, get_gpu("cpu"), 1, 32)
    gap = table.scalar("step_gap")
    rng = np.random.default_rng(seed)
    t, steps = 0.0, []
    for i in range(n_steps):
        b = int(rng.choice([0, 1, 2, 3, 5, 8, 13, 24, 40, 64]))
        longest = int(rng.choice([4, 40, 300, 1024]))  # short and long contexts both occur
        batch = [(f"d{i}.{k}", 1, int(rng.integers(1, longest))) for k in range(b)]
        budget = 256 - b
        for k in range(int(rng.integers(0 if b else 1, 3))):
            if budget < 2:
                break
            n = int(rng.integers(2, budget + 1))  # a 1-token chunk on context would be a decode
            batch.append((f"p{i}.{k}", n, int(rng.integers(0, 1024 - n))))
            budget -= n
        plan = StepPlan(num_new_tokens=[x[1] for x in batch], context=[x[2] for x in batch])
        dur = lat.price(step_shape(plan), plan)[0] - gap
        steps.append(LoggedStep(t, t + dur, tuple(batch)))
        t += dur + gap
    forever = LoggedRequest("all", 0.0, 1, 10**9, (t,))  # in the engine throughout: every gap is busy
    return StepLog(None, "synthetic", "synthetic", "cpu", TINY.to_dict(), CONFIG, [forever], steps)


@pytest.fixture(scope="module")
def recovered():
    truth = known_table()
    log = synthetic_log(truth, 1500, seed=3)
    return truth, log, fit_steplog(log, smoothness=1e-4)


def test_fit_recovers_a_known_table_on_held_out_steps(recovered):
    truth, log, result = recovered
    err = result.heldout
    assert err["n"] in (299, 300) and err["mean_abs_rel"] < 2e-3 and err["p90_abs_rel"] < 5e-3
    assert abs(err["sum_rel"]) < 1e-3
    assert result.step_gap_s == pytest.approx(2e-4, rel=1e-9)
    # fresh compositions, never seen by the fit
    fresh = synthetic_log(truth, 200, seed=99).steps
    want = predict_steps(truth, TINY.to_dict(), 32, fresh)
    got = predict_steps(result.table, TINY.to_dict(), 32, fresh)
    assert np.abs(got / want - 1).max() < 0.02


def test_fit_recovers_the_components_where_steps_pin_them(recovered):
    truth, _, result = recovered
    fit = result.table.components
    true = truth.components
    # the attention grids, wherever steps of that size occurred
    for name, rows, cols in (("decode_attn", range(1, 7), range(1, 5)), ("prefill_attn", range(3, 9), range(0, 6))):
        got = fit[name].values[np.ix_(list(rows), list(cols))]
        want = true[name].values[np.ix_(list(rows), list(cols))]
        assert got == pytest.approx(want, rel=0.05, abs=2e-5), name
    # overhead and linear(1) trade off (every step has T >= 1); their sum and the slope do not
    assert result.table.scalar("overhead") + fit["linear"].values[1] == pytest.approx(3e-3 + 4.3e-4, rel=0.01)
    lin_f, lin_t = fit["linear"].values, true["linear"].values
    assert lin_f[-1] - lin_f[1] == pytest.approx(lin_t[-1] - lin_t[1], rel=0.02)


def test_fit_is_non_negative_and_monotone(recovered):
    for comp in recovered[2].table.components.values():
        v = np.atleast_1d(comp.values)
        assert (v >= 0).all()
        for axis in range(v.ndim):
            assert (np.diff(v, axis=axis) >= -1e-15).all(), comp.name


# --- the real run ---------------------------------------------------------------------------------
def test_fit_of_the_vllm_cpu_run_and_its_held_out_error(shared_ref, tmp_path):
    log = read_steplog(shared_ref / "vllm-cpu-runs" / "fit.json")
    result = fit_steplog(log)
    err = result.heldout
    # 20 % of the 3283 steps; those followed by an idle wait cannot be measured whole
    assert 640 <= err["n"] <= 657
    # a shared 2-core CPU: single steps are noisy (~15 %), their sum is not
    assert err["mean_abs_rel"] < 0.2 and abs(err["sum_rel"]) < 0.03
    assert err["mixed"]["n"] > 20 and err["mixed"]["mean_abs_rel"] < 0.2
    assert 1.5e-4 < result.step_gap_s < 4e-4  # the README's "engine overhead between steps"
    path = write_table(tmp_path / "tab", result.table)
    back = read_table(path)
    meta = back.metadata
    assert meta["source"] == "steplog" and meta["device"] == "cpu" and meta["model"]["name"] == "tiny"
    assert (meta["block_size"], meta["num_gpu_blocks"], meta["dtype"]) == (32, 47, "fp32")
    assert meta["heldout_error"] == err
    assert meta["grid"]["decode_attn"] == {"batch": [0, 1, 2, 4, 8, 16, 32, 64],
                                           "mean_context": [0, 32, 64, 128, 256, 512, 1024]}
