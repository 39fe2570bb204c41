"""bench/ttft_parts.py's closed form of a lone prompt's TTFT against the simulation itself (issue 26):
one client, the prompt's steps alone, exactly; a prompt longer than the token budget, its chunks;
four clients in independent phases, one decode step of the other three plus the prefill beside them."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None,
    reason="kernel-db tables need the optional extra cbsim[gpu-data]",
)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    from bench.silicon_accuracy import Row, classify
    from calib.sources.kernel_db import build_table
    from sim.latency.table_format import write_table

    row = Row(
        id="r",
        engine="vllm",
        version="",
        model="meta-llama/Llama-3.1-8B",
        system="h200_sxm",
        precision="fp8",
        tp=1,
        isl=1024,
        osl=64,
        concurrency=1,
        ttft_ms=100.0,
        tpot_ms=10.0,
    )
    classify([row])
    assert not row.skip, row.skip
    out = tmp_path_factory.mktemp("kdb") / "t"
    write_table(
        out,
        build_table(row.config, row.gpu, tp=1, dtype="fp8", engine="vllm", fp8_scaling=row.fp8_scaling).table,
    )
    return row, str(out)


def _sim_ttfts(row, table, rounds, start=None, ramp_s=0.0):
    import sim
    from bench.silicon_accuracy import scenario_of

    sc = scenario_of(row, table, rounds)
    sc["workload"]["arrival"]["ramp_s"] = ramp_s
    if start:
        sc["workload"]["arrival"]["start"] = start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        req = sim.run(sc).requests.sort_values("arrival_s")
    return req, list(req["ttft_s"])


@pytest.mark.parametrize("isl", [1024, 10_000])
def test_one_client_ttft_is_its_prefill_steps_exactly(table, isl):
    """Alone on the engine a prompt waits for nothing: its TTFT is its prefill step, or, longer than
    the token budget (8,192 on an H200), its chunks' steps one after another."""
    from dataclasses import replace

    from bench.ttft_parts import row_parts

    row, path = table
    row = replace(row, isl=isl, concurrency=1)
    p = row_parts(row, path)
    assert p.wait_s == 0.0
    assert p.chunks == ([1024] if isl == 1024 else [8192, 1808])
    assert (p.rest_s > 0) == (isl > 8192)
    _, ttfts = _sim_ttfts(row, path, rounds=3)
    assert ttfts == pytest.approx([p.total_s] * 3, rel=1e-9)
    # the step is the sum of its GPU components (async scheduling hides the engine's CPU time under it)
    c = p.components
    assert p.prefill_s == pytest.approx(
        c["fixed"] + c["linear"] + c["prefill_attn"] + c["per_seq"], rel=1e-12
    )


@pytest.mark.parametrize("late", [False, True], ids=["next-step", "async-admission"])
def test_four_clients_wait_one_decode_step_then_prefill_beside_three_decodes(table, late):
    """In independent phases a new request arrives as another ends, at a step boundary, and misses the
    step starting there: TTFT = one decode step of the other three + the prefill beside them; two
    decode steps where the server admits asynchronously (vllm-v1's async_admission, the bench's
    default for an asynchronous vLLM row). The closed form prices the three at the mean context of
    uniform phases, so the simulated mean agrees within the decode attention's curvature in the
    context (here: 0.0003 %)."""
    from dataclasses import replace

    from bench.ttft_parts import row_parts

    row, path = table
    row = replace(row, concurrency=4, vllm_async_admission=late)
    p = row_parts(row, path)
    alone = row_parts(replace(row, concurrency=1), path)
    assert p.wait_s > 0 and p.prefill_s > alone.prefill_s
    # the first sends drawn over about one request's end-to-end time (64 tokens of ~3 ms)
    req, _ = _sim_ttfts(row, path, rounds=8, start="random", ramp_s=0.25)
    later = req[req["arrival_s"] >= 0.25]["ttft_s"]
    assert len(later) >= 8
    assert float(later.mean()) == pytest.approx(p.total_s, rel=1e-3)
    # and no request's TTFT is a lone prefill: every one waited for a step in flight
    assert float(later.min()) > alone.total_s + 0.5 * p.wait_s


def test_by_duration_bins_kernels_by_the_slow_gpus_time_with_median_ratio_and_tflops():
    """``--gemm-ratio``'s breakdown: kernels binned by the slow GPU's latency (ms, upper edge included),
    the median latency ratio and each GPU's median TFLOPS (2 M N K / latency); empty bins left out."""
    import pandas as pd

    from bench.ttft_parts import by_duration

    # M N K = 1000 x 1000 x 1000: 2e9 FLOPs, so x ms is 2 / x TFLOPS
    j = pd.DataFrame({"m": [1000] * 5, "n": [1000] * 5, "k": [1000] * 5,
                      "latency_a": [0.01, 0.1, 0.2, 2.0, 4.0], "latency_b": [0.01, 0.05, 0.1, 1.0, 4.0]})
    bins = by_duration(j, (0.05, 0.2, 1.0, 5.0, float("inf")))
    assert [(b["lo_ms"], b["hi_ms"], b["rows"]) for b in bins] == [(0.05, 0.2, 2), (1.0, 5.0, 2)]
    assert bins[0]["ratio"] == pytest.approx(2.0) and bins[1]["ratio"] == pytest.approx(1.5)
    assert bins[0]["tflops_a"] == pytest.approx((20.0 + 10.0) / 2) and bins[0]["tflops_b"] == pytest.approx(30.0)
    assert bins[1]["tflops_a"] == pytest.approx((1.0 + 0.5) / 2) and bins[1]["tflops_b"] == pytest.approx(1.25)
