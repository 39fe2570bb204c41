"""``max_tokens`` is the client's limit, never the output length a trace happens to record: a
policy that reserves by it (TGI, Orca) or estimates by it (SGLang) must not read the future.

The decisive check: replay one trace twice, the second time with its ``output_tokens`` permuted
among the requests. Until the first request finishes in either run, no policy can tell the two
apart, so every step up to then must be identical, for every policy. With ``max_tokens`` copied
from ``output_tokens`` (as cbsim once did) TGI's and Orca's reservations differ from the first step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from policies.registry import POLICIES
from sim.runner import run

MAX_MODEL_LEN = 1024
N = 40


def _trace(tmp_path, outputs, name: str) -> str:
    rng = np.random.default_rng(7)
    prompts = rng.integers(50, 400, N)
    arrivals = np.round(np.cumsum(rng.exponential(0.05, N)), 6)
    rows = "\n".join(f"{t},{p},{o}" for t, p, o in zip(arrivals, prompts, outputs))
    f = tmp_path / name
    f.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    return str(f)


def _scenario(path: str) -> dict:
    return {
        "name": "max-tokens", "model": "tiny", "hardware": {"gpu": "cpu"},
        "latency": {"backend": "constant", "step_s": 0.01},
        "workload": {"trace": {"path": path, "format": "csv"}, "arrival": {"process": "trace"},
                     "prompt_tokens": {"dist": "trace"}, "output_tokens": {"dist": "trace"}},
        # a pool a reservation of prompt + max_tokens fills quickly: reservations decide admission
        "engine": {"num_gpu_blocks": 200, "max_model_len": MAX_MODEL_LEN, "max_num_batched_tokens": 512,
                   "max_num_seqs": 16},
        "policies": [{"name": name} for name in POLICIES],
    }


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    outputs = np.random.default_rng(3).integers(60, 300, N)
    swapped = np.random.default_rng(4).permutation(outputs)
    assert (swapped != outputs).any()
    a = run(_scenario(_trace(tmp, outputs, "a.csv")))
    b = run(_scenario(_trace(tmp, swapped, "b.csv")))
    return a, b


def test_a_trace_without_client_limits_gets_the_engine_s_fill_in(two_runs):
    for res in two_runs:
        req = res.requests
        assert (req["max_tokens"] == MAX_MODEL_LEN - req["prompt_tokens"]).all()
        assert (req["max_tokens"] != req["output_tokens"]).all()


@pytest.mark.parametrize("policy", list(POLICIES))
def test_swapping_output_tokens_changes_no_decision_before_a_finish(two_runs, policy):
    a, b = (res.steps[res.steps["policy"] == policy].reset_index(drop=True) for res in two_runs)
    finished = [res.requests[(res.requests["policy"] == policy) & (res.requests["state"] == "finished")]
                for res in two_runs]
    first_finish = min(float(f["finish_s"].min()) for f in finished)
    # the steps that ended before any request finished in either run, and the finishing step's
    # decision (its start: what ran); what it records after the finish (running) may differ
    n = int((a["start_s"] + a["duration_s"] < first_finish).sum())
    assert n >= 5, f"{policy}: too few steps before the first finish to compare"
    cols = [c for c in a.columns if c not in ("policy", "finished")]
    pd.testing.assert_frame_equal(a.loc[: n - 1, cols], b.loc[: n - 1, cols], check_exact=True, obj=policy)
    decided = ["start_s", "num_seqs", "prefill_tokens", "decode_tokens", "batch_tokens", "admitted"]
    pd.testing.assert_frame_equal(a.loc[[n], decided], b.loc[[n], decided], check_exact=True, obj=policy)
