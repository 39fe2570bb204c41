"""The optional latency-table terms (per-sequence work, decodes beside a prefill chunk, decode skew, the
engine's CPU time under synchronous and asynchronous scheduling), on a hand-made table whose every
value is known, and the request-level run format (round trip, vLLM defaults noted, bad input)."""

from __future__ import annotations

import json

import pytest

from policies.base import StepPlan
from sim.errors import CbsimError
from sim.hardware.gpus import get_gpu
from sim.hardware.models import get_model
from sim.latency import step_shape
from sim.latency.engine_cpu import async_scheduling_default, combine, engine_cpu_default
from sim.latency.table import TableLatency
from sim.latency.table_format import LatencyTable, make_component, read_table, write_table
from sim.recorded.request_run import RequestRun, RunConfig, RunRequest, write_request_run
from sim.recorded.run_readers import read_run

TINY = get_model("tiny")
CPU = get_gpu("cpu")
MS = 1e-3


def table(alpha=None, cpu_ms=(1.0, 41.0), mixed=True) -> LatencyTable:
    """linear 0.1 ms/token; per_seq 0.5 ms + 0.01 ms/seq; prefill 2 ms per chunk; decode 1 ms per
    sequence per 1000 context (pure), 3x that beside a chunk; engine_cpu 1 ms at 1 seq, 41 ms at 401."""
    comps = {
        "overhead": make_component("overhead", (), 0.0),
        "step_gap": make_component("step_gap", (), 0.0),
        "linear": make_component("linear", ([0, 1000],), [0.0, 100 * MS]),
        "per_seq": make_component("per_seq", ([1, 101],), [0.51 * MS, 1.51 * MS]),
        "prefill_attn": make_component("prefill_attn", ([1, 1000], [0, 1000]), [[2 * MS] * 2] * 2),
        "decode_attn": make_component("decode_attn", ([1, 101], [0, 1000]), [[0, 1 * MS], [0, 101 * MS]]),
        "engine_cpu": make_component("engine_cpu", ([1, 401],), [cpu_ms[0] * MS, cpu_ms[1] * MS]),
    }
    if mixed:
        comps["decode_attn_mixed"] = make_component("decode_attn_mixed", ([1, 101], [0, 1000]),
                                                    [[0, 3 * MS], [0, 303 * MS]])
    meta = {"source": "llmservingsim", "device": "test", "model": TINY.to_dict(), "dtype": "fp32", "block_size": 16,
            "tensor_parallel": 1, "date": "2026-01-01T00:00:00+00:00", "grid": {},
            "engine": {"name": "vllm", "version": "0.19.0"}, "provenance": {"bundle": "hand-made"}}
    if alpha is not None:
        meta["decode_skew_alpha"] = alpha
    return LatencyTable(comps, meta)


def plan(*entries) -> StepPlan:
    return StepPlan(scheduled=[object() for _ in entries], num_new_tokens=[n for n, _ in entries],
                    context=[c for _, c in entries])


def lat(tmp_path, async_scheduling=True, **kw) -> TableLatency:
    return TableLatency.from_path(write_table(tmp_path / "t", table(**kw)), TINY, CPU, 1, 16,
                                  async_scheduling=async_scheduling)


def test_optional_components_round_trip_and_old_tables_still_read(tmp_path):
    folder = write_table(tmp_path / "t", table(alpha=0.25))
    back = read_table(folder)
    assert set(back.components) == {"overhead", "step_gap", "linear", "per_seq", "prefill_attn", "decode_attn",
                                    "decode_attn_mixed", "engine_cpu"}
    assert back.metadata["decode_skew_alpha"] == 0.25 and back.metadata["engine"]["version"] == "0.19.0"
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["grid"]["per_seq"] == {"sequences": [1, 101]}
    # a table with only the five required components reads as before
    t = table()
    for name in ("per_seq", "decode_attn_mixed", "engine_cpu"):
        del t.components[name]
    assert set(read_table(write_table(tmp_path / "old", t)).components) == {
        "overhead", "step_gap", "linear", "prefill_attn", "decode_attn"}


def test_bad_skew_alpha_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(CbsimError, match="decode_skew_alpha must be a number in"):
        write_table(tmp_path / "t", table(alpha=2.0))


def test_step_terms_add_up_exactly(tmp_path):
    sync = lat(tmp_path, async_scheduling=False)
    # 10 decodes at context 500: linear 1 ms, per_seq 0.6 ms, decode 10 x 0.5 ms, engine_cpu 1.9 ms (added)
    p = plan(*[(1, 500)] * 10)
    assert sync.step_time(p) == pytest.approx((1.0 + 0.6 + 5.0 + 1.9) * MS)
    # the same decodes beside a 90-token chunk: linear 10 ms, per_seq 0.61 ms, chunk 2 ms, decodes at 3x,
    # engine_cpu 2.0 ms
    p = plan((90, 0), *[(1, 500)] * 10)
    assert sync.step_time(p) == pytest.approx((10.0 + 0.61 + 2.0 + 15.0 + 2.0) * MS)


def test_async_scheduling_hides_engine_cpu_behind_the_gpu_until_the_cpu_is_slower(tmp_path):
    asyn = lat(tmp_path, async_scheduling=True)
    p = plan(*[(1, 500)] * 10)
    assert asyn.step_time(p) == pytest.approx((1.0 + 0.6 + 5.0) * MS)  # GPU 6.6 ms > CPU 1.9 ms
    slow_cpu = lat(tmp_path / "b", async_scheduling=True, cpu_ms=(20.0, 60.0))
    assert slow_cpu.step_time(p) == pytest.approx(20.9 * MS)  # the CPU's 20.9 ms is the step
    assert combine(5.0, 2.0, True) == 5.0 and combine(5.0, 2.0, False) == 7.0 and combine(1.0, 2.0, True) == 2.0


def test_decode_skew_charges_the_longest_context(tmp_path):
    skewed = lat(tmp_path, async_scheduling=True, alpha=0.5)
    # decodes at 0 and 1000: mean 500 -> 2 x 0.5 ms = 1 ms; at the max, 2 x 1 ms = 2 ms; alpha 0.5 -> 1.5 ms
    p = plan((1, 1), (1, 999))
    base = (0.2 + 0.52) * MS
    assert skewed.step_time(p) == pytest.approx(base + 1.5 * MS, rel=1e-3)
    assert lat(tmp_path / "b").step_time(p) == pytest.approx(base + 1.0 * MS, rel=1e-3)
    assert skewed.price_decodes is None  # fast-forward prices such stretches step by step


def test_a_plans_leading_decodes_summed_in_bulk_price_the_same_step(tmp_path):
    """StepPlan.num_decodes (the leading one-token decodes) takes a bulk path through price(): the
    same seconds, FLOPs and bytes as the loop over every request, with and without the skew term,
    for a pure decode batch and for decodes ahead of prefill chunks."""
    for alpha in (None, 0.5):
        t = lat(tmp_path / str(alpha), alpha=alpha)
        for entries, nd in ((((1, 300), (1, 10), (1, 999)), 3), (((1, 300), (1, 700), (64, 0), (1, 5)), 2)):
            loop, bulk = plan(*entries), plan(*entries)
            bulk.num_decodes = nd
            assert t.price(step_shape(bulk), bulk) == t.price(step_shape(loop), loop)
            assert t.price(step_shape(bulk), bulk)[0] > 0


def test_price_decodes_agrees_with_price_step_by_step(tmp_path):
    for asyn in (True, False):
        t = lat(tmp_path / str(asyn), async_scheduling=asyn, cpu_ms=(5.0, 45.0))
        secs, _, _ = t.price_decodes(8, 8 * 300, 4)
        for j in range(4):
            p = plan(*[(1, 300 + j)] * 8)
            assert secs[j] == t.price(step_shape(p), p)[0]


def test_engine_cpu_defaults_per_version():
    assert engine_cpu_default("vllm", "0.19.0").versions.startswith("0.8")
    assert engine_cpu_default("vllm", "0.6.6").versions.startswith("0.6")
    with pytest.raises(CbsimError, match="no engine CPU default for engine 'tgi'"):
        engine_cpu_default("tgi", "3.0")
    sglang = engine_cpu_default("sglang", "0.5.14")  # the kernel database's SGLang version
    assert sglang.seconds(0) == 0.0 and sglang.seconds(512) == pytest.approx(512 * 40e-6)
    assert combine(0.010, sglang.seconds(512), True) == pytest.approx(0.02048)  # overlap: the longer one
    assert combine(0.030, sglang.seconds(512), True) == 0.030


# ------------------------------------------------------------------------------------------------
# request-level runs
# ------------------------------------------------------------------------------------------------
def small_run(path) -> RequestRun:
    reqs = [RunRequest(f"r{i}", 0.5 * i, 100 + i, 8, 8, 0.5 * i + 0.1, 0.5 * i + 0.8) for i in range(6)]
    cfg = RunConfig(16, 4, 256, 1024, 500, True, True, True, "fcfs", 1, 0.9)
    return RequestRun(path, "cbsim-request-run", "hand-made", {"name": "vllm", "version": "0.19.0"}, "tiny", "cpu",
                      cfg, reqs)


def test_request_run_round_trip(tmp_path):
    run = small_run(tmp_path / "run.json")
    write_request_run(run, run.path)
    back = read_run(run.path)
    assert back.requests == run.requests and back.config == run.config and back.assumed == []


def test_request_run_defaults_are_vllms_and_noted(tmp_path):
    data = small_run(tmp_path / "run.json").to_dict()
    data["config"] = {"max_num_seqs": 4, "max_num_batched_tokens": 256}
    (tmp_path / "run.json").write_text(json.dumps(data))
    run = read_run(tmp_path / "run.json")
    c = run.config
    assert (c.block_size, c.enable_prefix_caching, c.async_scheduling, c.enable_chunked_prefill) == (16, True, True,
                                                                                                      True)
    assert c.num_gpu_blocks is None and c.max_model_len == 128  # longest request 105 + 8 tokens
    assert any("async_scheduling = True" in a for a in run.assumed)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["config"].pop("max_num_seqs"), "config.max_num_seqs: is missing"),
    (lambda d: d["requests"][0].update(first_token_s=-1.0), "arrival_s <= first_token_s"),
    (lambda d: d["requests"][1].update(id="r0"), "'r0' appears twice"),
    (lambda d: d["requests"][0].update(prompt_tokens="x"), r"requests\[0\].prompt_tokens: expected an integer"),
])
def test_bad_request_runs_name_the_field(tmp_path, edit, message):
    data = small_run(tmp_path / "run.json").to_dict()
    edit(data)
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(CbsimError, match=message):
        read_run(tmp_path / "run.json")


def test_validate_against_a_request_run_reports_every_figure(tmp_path):
    from sim.recorded.validate_against import ERROR_KEYS, validate_against

    run = small_run(tmp_path / "run.json")
    write_request_run(run, run.path)
    t = table()
    t.metadata["model"] = TINY.to_dict()
    folder = write_table(tmp_path / "t", t)
    res = validate_against(run.path, folder)
    assert set(res["error"]) == set(ERROR_KEYS) >= {"ttft_mean", "tpot_mean", "e2e_mean", "e2e_p90", "throughput"}
    assert res["real"]["ttft_mean"] == pytest.approx(0.1) and res["real"]["preemptions"] is None
    assert res["sim"]["requests"] == 6 and res["diagnostics"]["kv_blocks"] == 500


def test_async_scheduling_is_the_default_from_vllm_0_14_and_sglang_0_4():
    """vLLM turned async scheduling on by default in v0.14.0 (PR #27614); SGLang's overlap scheduler
    has been on since 0.4. A bad version or an unknown engine is an error naming it, not a guess."""
    assert [async_scheduling_default("vllm", v) for v in ("0.8.5", "0.12.0", "0.13.0", "0.14.0", "v0.19.1")] == \
        [False, False, False, True, True]
    assert async_scheduling_default("sglang", "0.5.9") and not async_scheduling_default("sglang", "0.3.6")
    with pytest.raises(CbsimError, match="'latest' of vllm is not a version number"):
        async_scheduling_default("vllm", "latest")
    with pytest.raises(CbsimError, match="no async scheduling default for engine 'tgi'"):
        async_scheduling_default("tgi", "3.0.0")
