"""The kernel-database composer (calib/sources/kernel_db.py) against the database's own rows.

Each check reads AIConfigurator's measured parquet rows directly (pandas) and compares them with
what the composed cbsim table prices: a measured GEMM point reproduced exactly, interpolation
between two measured points, tensor parallelism halving the GEMM work and adding the measured
all-reduce, and a decode of one sequence landing just above the weight-read bound.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.errors import CbsimError
from tests.helpers import require_aic

ENGINE_VERSION = "0.24.0"  # vLLM version of the h100_sxm kernel measurements in aiconfigurator-core 0.12.0
LAYERS = 32  # Llama-3-8B


@pytest.fixture(scope="module")
def kdb():
    require_aic()
    from calib.sources import kernel_db

    return kernel_db


def _grids(kernel_db):
    return kernel_db.Grids(tokens=(1, 16, 256, 1024, 1280, 4096), sequences=(1, 8, 64),
                           chunk_tokens=(16, 512, 1024, 4096), context=(0, 1024, 3584),
                           batch=(1, 8, 64), mean_context=(1, 128, 1024, 4096))


@pytest.fixture(scope="module")
def tp1(kdb):
    db = kdb.KernelDb(kdb.resolve_model("llama-3-8b"), "h100-sxm", tp=1, engine_version=ENGINE_VERSION)
    return kdb.compose(db, kdb.Grids.covering())  # the default grids, as `cbsim calibrate` writes them


@pytest.fixture(scope="module")
def tp2(kdb):
    db = kdb.KernelDb(kdb.resolve_model("llama-3-8b"), "h100-sxm", tp=2, engine_version=ENGINE_VERSION)
    return kdb.compose(db, _grids(kdb))


def _rows(name: str):
    import importlib.resources as res

    import pandas as pd

    family = {"gemm_perf": "gemm", "custom_allreduce_perf": "comm"}[name]
    root = Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "h100_sxm" / family / "vllm"
    return pd.read_parquet(root / ENGINE_VERSION / f"{name}.parquet")


def _gemm_row_ms(m: int, n: int, k: int) -> float:
    g = _rows("gemm_perf")
    hit = g[(g.gemm_dtype == "bfloat16") & (g.m == m) & (g.n == n) & (g.k == k)]
    assert len(hit) == 1, f"expected one measured bf16 GEMM row at m={m} n={n} k={k}, found {len(hit)}"
    return float(hit.latency.iloc[0])


def _price(table, model, gpu_id: str, tp: int, *, tokens: int, seqs: int, decodes: int = 0, ctx: int = 0,
           chunk: int = 0, chunk_ctx: int = 0) -> float:
    """Price one step through the simulator's own table backend (sim.latency.table)."""
    from policies.base import StepPlan
    from sim.hardware.gpus import get_gpu
    from sim.latency.table import TableLatency

    latency = TableLatency(table, model, get_gpu(gpu_id), tp, 16)
    plan = StepPlan()
    plan.num_new_tokens = [1] * decodes + ([chunk] if chunk else [])
    plan.context = [ctx] * decodes + ([chunk_ctx] if chunk else [])
    assert len(plan.num_new_tokens) == seqs and sum(plan.num_new_tokens) == tokens
    from sim.latency.base import step_shape

    plan.scheduled = [None] * seqs
    return latency.price(step_shape(plan), plan)[0]


# ------------------------------------------------------------------------------------------------
# the database's own rows
# ------------------------------------------------------------------------------------------------
def test_a_measured_gemm_point_is_reproduced_exactly(tp1):
    """QKV (n = (32 + 2·8)·128 = 6144, k = 4096) and O (4096 x 4096) at m = 1024 tokens are
    measured rows; the table's linear(1024) holds exactly 32 layers of each."""
    ops = tp1.ops["linear"][(1024,)]
    assert ops["qkv_gemm"].seconds == pytest.approx(LAYERS * _gemm_row_ms(1024, 6144, 4096) * 1e-3, rel=1e-9)
    assert ops["proj_gemm"].seconds == pytest.approx(LAYERS * _gemm_row_ms(1024, 4096, 4096) * 1e-3, rel=1e-9)
    assert {ops[k].source for k in ("qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm")} == {"silicon"}
    from calib.sources.kernel_db import interp

    # and the table row at that grid point is the sum of the operators, nothing more
    assert interp(tp1.table, "linear", 1024) == pytest.approx(sum(op.seconds for op in ops.values()), rel=1e-12)


def test_interpolation_between_measured_points(tp1, kdb):
    """m = 1000 lies between the measured rows m = 769 and m = 1024: the database's engine
    interpolates linearly in m, and the table's grid (1024, 1280) interpolates linearly in T."""
    lo, hi = _gemm_row_ms(769, 6144, 4096), _gemm_row_ms(1024, 6144, 4096)
    expected = lo + (1000 - 769) / (1024 - 769) * (hi - lo)
    got = tp1.db.linear_ops(1000)["qkv_gemm"].seconds / LAYERS * 1e3
    assert min(lo, hi) < got < max(lo, hi)
    assert got == pytest.approx(expected, rel=1e-6)
    # between the table's own points the simulator's backend interpolates linearly, and lands
    # within 3 % of what the database gives at that token count directly
    t = tp1.table
    a, b = kdb.interp(t, "linear", 1024), kdb.interp(t, "linear", 1280)
    mid = kdb.interp(t, "linear", 1152)
    assert mid == pytest.approx((a + b) / 2, rel=1e-12)
    direct = sum(op.seconds for op in tp1.db.linear_ops(1152).values())
    assert mid == pytest.approx(direct, rel=0.03)


def test_tensor_parallel_halves_the_gemms_and_adds_the_measured_all_reduce(tp1, tp2):
    t = 4096
    gemms = ("qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm")
    one = tp1.ops["linear"][(t,)]
    two = tp2.ops["linear"][(t,)]
    ratio = sum(two[g].seconds for g in gemms) / sum(one[g].seconds for g in gemms)
    assert 0.45 < ratio < 0.6, ratio  # half the work per GPU, at slightly lower efficiency
    assert one["ar_1"].seconds == one["ar_2"].seconds == 0.0
    # two all-reduces per layer of T x hidden bf16 elements: the measured 2-GPU row (CUDA-graph lane)
    ar = _rows("custom_allreduce_perf")
    row = ar[(ar.num_gpus == 2) & (ar.message_size == t * 4096) & (ar.backend == "vllm_graph")]
    assert len(row) == 1
    per_layer = float(row.latency.iloc[0]) * 1e-3
    assert two["ar_1"].seconds == pytest.approx(LAYERS * per_layer, rel=1e-9)
    assert two["ar_2"].seconds == pytest.approx(LAYERS * per_layer, rel=1e-9)
    # the LM head is sharded over the vocabulary too
    assert tp2.ops["per_seq"][(64,)]["logits_gemm"].seconds < 0.75 * tp1.ops["per_seq"][(64,)]["logits_gemm"].seconds


def test_one_sequence_decode_on_h100_is_between_the_weight_read_bound_and_twice_it(tp1):
    from sim.hardware.gpus import get_gpu
    from sim.hardware.models import get_model

    model, gpu = get_model("llama-3-8b"), get_gpu("h100-sxm")
    bound = model.weight_bytes(1) / gpu.hbm_bandwidth  # 16.06 GB / 3.35 TB/s = 4.79 ms
    for ctx in (128, 1024):
        step = _price(tp1.table, model, "h100-sxm", 1, tokens=1, seqs=1, decodes=1, ctx=ctx)
        assert bound < step < 2 * bound, (ctx, step, bound)


def test_prefill_over_prior_context_is_priced_between_its_bounds_and_documented(tp1, kdb):
    """No row measures a chunk over cached tokens: a 512-token chunk over 3584 cached costs more
    than the same chunk alone and less than the whole 4096-token prefill; the metadata says how."""
    t = tp1.table
    alone, over, whole = (kdb.interp(t, "prefill_attn", 512, 0), kdb.interp(t, "prefill_attn", 512, 3584),
                          kdb.interp(t, "prefill_attn", 4096, 0))
    assert alone < over < whole
    modelled = tp1.table.metadata["provenance"]["modelled"]
    assert "(s^2 - c^2) / s^2" in modelled["prefill_attn over prior context"]


def test_composition_agrees_with_the_databases_own_step_predictions(tp1):
    err = tp1.table.metadata["aic_agreement"]
    assert "heldout_error" not in tp1.table.metadata  # it is no held-out measurement
    assert err["n"] >= 20
    assert err["mean_abs_rel"] < 0.03 and err["p90_abs_rel"] < 0.06, err


def test_table_folder_round_trips_and_records_provenance(tp1, tmp_path):
    from sim.hardware.gpus import get_gpu
    from sim.hardware.models import get_model
    from sim.latency.table import TableLatency
    from sim.latency.table_format import read_table, write_table

    write_table(tmp_path / "t", tp1.table)
    back = read_table(tmp_path / "t")
    assert set(back.components) == set(tp1.table.components)
    meta = back.metadata
    assert meta["source"] == "kernel_db"
    prov = meta["provenance"]
    assert prov["package"] == "aiconfigurator-core" and prov["engine"] == "vllm"
    assert prov["engine_version"] == ENGINE_VERSION and prov["gpu"] == "h100_sxm"
    assert meta["device"] == "NVIDIA H100 80GB HBM3"
    latency = TableLatency.from_path(tmp_path / "t", get_model("llama-3-8b"), get_gpu("h100-sxm"), 1, 16)
    assert latency.table.scalar("overhead") == 0.0


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------
def test_unknown_gpu_names_the_covered_ones(kdb):
    with pytest.raises(CbsimError, match="h100-sxm, h200"):
        kdb.aic_system("h100-pcie")


def test_missing_package_says_how_to_install(monkeypatch):
    import builtins

    from calib.sources import kernel_db

    real = builtins.__import__

    def no_aic(name, *args, **kwargs):
        if name.startswith("aiconfigurator_core"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_aic)
    with pytest.raises(CbsimError, match=r"pip install 'cbsim\[gpu-data\]'"):
        kernel_db.require_aiconfigurator()


def test_moe_model_prices_its_experts_from_the_moe_rows(kdb):
    """Mixtral-8x7B (AIConfigurator's own config.json, no network) at TP 2 on H200: the fused-MoE
    operator is a measured ('silicon') part of linear(T), grows with tokens, and the LM head is
    still priced per sequence."""
    db = kdb.KernelDb(kdb.resolve_model("mistralai/Mixtral-8x7B-v0.1"), "h200", tp=2, engine_version=ENGINE_VERSION)
    assert db.spec.num_experts == 8 and db.spec.num_experts_per_tok == 2
    small, large = db.linear_ops(16), db.linear_ops(4096)
    assert small["moe"].source == "silicon" and small["moe"].seconds > 0
    assert large["moe"].seconds > 4 * small["moe"].seconds
    assert "logits_gemm" in db.per_seq_ops(8) and "logits_gemm" not in large


def test_per_seq_is_priced_once_per_scheduled_sequence_and_old_tables_without_it_still_load(tp1, tmp_path):
    """The optional per_seq component: a step of 4 prefill chunks pays per_seq(4) on top of the
    same step priced by the same table without it; a table folder without the component loads."""
    from calib.sources.kernel_db import interp
    from sim.hardware.models import get_model
    from sim.latency.table_format import LatencyTable, read_table, write_table

    model = get_model("llama-3-8b")
    without = LatencyTable({k: v for k, v in tp1.table.components.items() if k != "per_seq"},
                           dict(tp1.table.metadata))
    write_table(tmp_path / "old", without)
    back = read_table(tmp_path / "old")
    assert "per_seq" not in back.components
    extra = _price_chunks(tp1.table, model, 4, 256) - _price_chunks(back, model, 4, 256)
    assert extra == pytest.approx(interp(tp1.table, "per_seq", 4), rel=1e-9)
    assert extra > 0


def _price_chunks(table, model, k: int, n: int) -> float:
    from policies.base import StepPlan
    from sim.hardware.gpus import get_gpu
    from sim.latency.base import step_shape
    from sim.latency.table import TableLatency

    latency = TableLatency(table, model, get_gpu("h100-sxm"), 1, 16, async_scheduling=False)
    plan = StepPlan()
    plan.num_new_tokens, plan.context, plan.scheduled = [n] * k, [0] * k, [None] * k
    return latency.price(step_shape(plan), plan)[0]


# ------------------------------------------------------------------------------------------------
# what the database does not measure: cold KV in served decodes, decodes beside a prefill chunk
# ------------------------------------------------------------------------------------------------
def _rtx_rows(name: str):
    import importlib.resources as res

    import pandas as pd

    root = Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "rtx_pro_6000_server" / "attention"
    return pd.read_parquet(root / "vllm" / ENGINE_VERSION / f"{name}.parquet")


@pytest.fixture(scope="module")
def rtx(kdb):
    return kdb.KernelDb(kdb.resolve_model("llama-3-8b"), "rtx-pro-6000", tp=1)


def _llama8b_decode_row(rows, batch: int, step: int):
    row = rows[(rows.num_heads == 32) & (rows.num_key_value_heads == 8) & (rows.head_dim == 128)
               & (rows.window_size == 0) & (rows.kv_cache_dtype == "bfloat16") & (rows.batch_size == batch)
               & (rows.step == step)]
    assert len(row) == 1
    return row


def test_decode_attention_is_floored_at_streaming_the_kv_cache_from_dram(rtx):
    """RTX PRO 6000 (128 MB L2): the measured row for 32 decodes at 1023 cached tokens reads 134 MB
    a layer faster than DRAM can deliver (graph replays on one warm KV cache); the table prices it
    at bytes / rate + 3 us a layer, the rate the database's own row of 128 decodes at 4095 tokens
    (2.1 GB a layer, 16x the L2) streams at: 0.845 of the 1.792 TB/s. That batch itself is priced
    as measured."""
    g = _rtx_rows("generation_attention_perf")
    row = _llama8b_decode_row(g, 32, 1023)
    assert row.kernel_source.iloc[0] == "vllm_flash_attn_fa2"
    kv_bytes = 32 * 1024 * 2 * 8 * 128 * 2  # b x keys x (K, V) x kv heads x head dim x bf16
    assert kv_bytes / (row.latency.iloc[0] * 1e-3) > 1.792e12  # faster than the DRAM bandwidth
    ref = _llama8b_decode_row(g, 128, 4095)
    ref_rate = 128 * 4096 * 2 * 8 * 128 * 2 / (ref.latency.iloc[0] * 1e-3 - 3e-6)
    assert rtx.kv_stream_rate() == pytest.approx(ref_rate, rel=0.01)
    assert 0.8 * 1.792e12 < rtx.kv_stream_rate() < 0.86 * 1.792e12
    floor = LAYERS * (kv_bytes / rtx.kv_stream_rate() + 3e-6)
    ops = rtx.decode_attn_ops(32, 1023)
    assert sum(op.seconds for op in ops.values()) == pytest.approx(floor, rel=1e-9)
    assert ops["kv_dram_floor"].source == "modelled"
    assert "kv_dram_floor" not in rtx.decode_attn_ops(32, 1023, floor=False)
    measured = rtx.decode_attn_ops(128, 4095, floor=False)["attention"].seconds
    big = sum(op.seconds for op in rtx.decode_attn_ops(128, 4095).values())
    assert measured <= big < 1.01 * measured


def test_the_dram_floor_never_prices_a_measured_dram_row_slower_than_measured(kdb):
    """H200 (50 MB L2): the database's row of 128 Llama-3.1-8B decodes at 4095 cached tokens (2.1 GB
    of KV a layer) runs at 0.4926 ms a layer, 91 % of 4.8 TB/s. AIConfigurator's memory-op rate
    (0.8 x 4.8 TB/s) would floor it at 0.562 ms (+14 %); the floor streams at the row's own rate,
    so the table prices that row as measured and larger ones (128 x 5000) within 1 % of the
    database's interpolation (19.3 ms; 21.9 ms before). At TP 8 (one KV head a
    rank) the reference row runs below 0.8 and the floor stays AIConfigurator's."""
    import importlib.resources as res

    import pandas as pd

    root = Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "h200_sxm" / "attention"
    g = pd.read_parquet(root / "vllm" / ENGINE_VERSION / "generation_attention_perf.parquet")
    row = _llama8b_decode_row(g, 128, 4095)
    kv_bytes = 128 * 4096 * 2 * 8 * 128 * 2
    seconds = row.latency.iloc[0] * 1e-3
    assert 0.90 * 4.8e12 < kv_bytes / seconds < 0.92 * 4.8e12
    assert kv_bytes / (0.8 * 4.8e12) + 3e-6 > 1.13 * seconds  # what the 0.8 floor made of it
    db = kdb.KernelDb(kdb.resolve_model("meta-llama/Meta-Llama-3.1-8B"), "h200", tp=1, dtype="fp8")
    assert db.kv_stream_rate() == pytest.approx(kv_bytes / (seconds - 3e-6), rel=0.01)
    assert "kv_dram_floor" not in db.decode_attn_ops(128, 4095)
    for batch, context in ((128, 5000), (256, 8192), (64, 16384)):  # between rows: within 1 % of them
        ops = db.decode_attn_ops(batch, context)
        assert sum(op.seconds for op in ops.values()) < 1.01 * ops["attention"].seconds, (batch, context)
    small = db.decode_attn_ops(1, 128)  # 1 MB a layer: L2-resident in the replay, floored
    keys_bytes = 129 * 2 * 8 * 128 * 2
    assert sum(op.seconds for op in small.values()) >= LAYERS * (keys_bytes / db.kv_stream_rate() + 3e-6) * (1 - 1e-9)
    tp8 = kdb.KernelDb(kdb.resolve_model("meta-llama/Meta-Llama-3.1-8B"), "h200", tp=8, dtype="fp8")
    assert tp8.kv_stream_rate() == pytest.approx(0.8 * 4.8e12)


def test_decodes_beside_a_chunk_cost_one_unpacked_query_tile_per_head_in_fa2_only(rtx, kdb):
    """FA2 (vLLM's FLASH_ATTN on the RTX PRO 6000) packs GQA only for pure-decode launches: beside a
    chunk, 128 decodes at 1k context cost the larger of 64 (c + 1) b / (s^2 / 2) of the measured
    16k-token causal prefill (one 64-row query tile per head) and one pass of their KV cache per query
    head of the group (4) at the DRAM's rate, above the same decodes alone; 1 decode at 256 costs no
    less than alone. H100's FA3 rows get no such component (FA3 packs GQA in every launch)."""
    s = kdb.THROUGHPUT_PREFILL_TOKENS
    prefill = sum(op.seconds for op in rtx.prefill_attn_ops(s, 0).values())
    mixed = sum(op.seconds for op in rtx.decode_attn_mixed_ops(128, 1024).values())
    alone = sum(op.seconds for op in rtx.decode_attn_ops(128, 1024).values())
    tiles = prefill * 128 * 64 * 1025 / (s * s / 2)
    reread = 4 * rtx.kv_reread_seconds(128, 1025)
    assert mixed == pytest.approx(max(tiles, reread), rel=1e-9)
    assert 1.1 * alone < mixed <= 4 * alone / 0.8 + 1e-12  # at most the group (4) times the work
    one = rtx.decode_attn_mixed_ops(1, 256)
    assert sum(op.seconds for op in one.values()) == pytest.approx(
        sum(op.seconds for op in rtx.decode_attn_ops(1, 256).values()))
    h100 = kdb.KernelDb(kdb.resolve_model("llama-3-8b"), "h100-sxm", tp=1, engine_version=ENGINE_VERSION)
    assert h100.attention_kernel == "vllm_flash_attn_fa3" and not h100.prices_mixed_decodes
    comp = kdb.compose(rtx, _grids(kdb))
    assert "decode_attn_mixed" in comp.table.components
    assert "unpacked_gqa_tiles" in comp.table.metadata["provenance"]["modelled"]["decode_attn_mixed"]


def test_every_table_states_its_known_limits_and_the_fa2_one_its_measured_bias(rtx, tp1, kdb):
    """A planner reads, in metadata.json and on the console, what the database cannot see; where the
    table is of the one kind checked on a real run (FA2), the measured bias, signed."""
    fa2 = kdb.known_limits(rtx)
    assert "TTFT +6.6 %" in fa2 and "one KV pass per query head" in fa2
    fa3 = tp1.table.metadata["provenance"]["known_limits"]
    assert "unequal contexts" in fa3 and "bench/silicon_accuracy.py" in fa3


def test_prefill_attention_never_falls_as_the_cached_context_grows(tp1):
    """AIConfigurator's (s² − c²)/s² prefix scaling shrinks the launch's fixed cost too; the composed
    table keeps every chunk at least as costly as over less cached context (issue 26)."""
    pre = tp1.table.components["prefill_attn"]
    for n, row in zip(pre.axes[0], pre.values):
        assert all(b >= a for a, b in zip(row, row[1:])), (n, list(row))
    db = tp1.db
    raw = sum(op.seconds for op in db.prefill_attn_ops(16, 1024).values())
    alone = sum(op.seconds for op in db.prefill_attn_ops(16, 0).values())
    assert raw < alone  # the database's own scaling does fall: the floor is doing work
    assert "prefix_monotone" in tp1.ops["prefill_attn"][(16, 1024)]


def test_several_prefill_chunks_in_one_step_pay_one_attention_launch(tp1, kdb):
    """vLLM runs every chunk of a step in one varlen launch: the table backend prices k chunks as the
    sum of their prefill_attn less (k - 1) launch costs, and that matches the database's own
    batched context-attention rows at a batch and length the launch cost was not derived from."""
    from sim.hardware.models import get_model

    t, db = tp1.table, tp1.db
    launch = t.metadata["prefill_attn_launch_s"]
    one = kdb.interp(t, "prefill_attn", 16, 0)
    assert 0 < launch <= one
    model = get_model("llama-3-8b")
    for b, n in ((8, 256), (4, 1024)):
        rows = db.handle.evaluate_context_ops(db._attn, batch_size=b, s=n)
        truth = sum(float(ms) for _name, ms, *_ in rows) * kdb.MS
        priced = _attention_of_chunks(t, model, [n] * b, kdb)
        assert priced == pytest.approx(b * kdb.interp(t, "prefill_attn", n, 0) - (b - 1) * launch, rel=1e-9)
        assert abs(priced / truth - 1) < 0.30, (b, n, priced, truth)  # the rest: SM occupancy of short chunks
        assert b * kdb.interp(t, "prefill_attn", n, 0) / truth > 1.4  # one launch per chunk was far off


def _attention_of_chunks(table, model, chunks, kdb):
    """The attention part of a step of the given prefill chunks (no cached context), priced by the
    simulator's table backend: the whole step less its linear and per_seq terms (no engine CPU)."""
    from policies.base import StepPlan
    from sim.hardware.gpus import get_gpu
    from sim.latency.base import step_shape
    from sim.latency.table import TableLatency

    latency = TableLatency(table, model, get_gpu("h100-sxm"), 1, 16)
    latency._cpu = None
    plan = StepPlan()
    plan.num_new_tokens, plan.context = list(chunks), [0] * len(chunks)
    plan.scheduled = [None] * len(chunks)
    shape = step_shape(plan)
    rest = kdb.interp(table, "linear", sum(chunks)) + kdb.interp(table, "per_seq", len(chunks))
    return latency.price(shape, plan)[0] - latency._fixed - rest


def test_a_reference_row_faster_than_dram_leaves_aiconfigurators_rate(kdb):
    """gpt-oss-120b (H200, vLLM): half its layers slide over 128 keys, so the reference decode row
    reads far less than 128 x 4096 keys a layer and comes out faster than 4.8 TB/s; such a row says
    nothing of the DRAM's rate, and the floor keeps AIConfigurator's 0.8 x mem_bw."""
    from calib.sources import kernel_db_moe

    db = kernel_db_moe.MoeKernelDb(kdb.resolve_model("openai/gpt-oss-120b"), "h200", kernel_db_moe.Layout(1, 1, 1),
                                   dtype="bf16", engine="vllm")
    keys = kdb.STREAM_REF_CONTEXT + 1
    measured = sum(op.seconds for op in db.decode_attn_ops(kdb.STREAM_REF_BATCH, kdb.STREAM_REF_CONTEXT,
                                                           floor=False).values())
    moved = db.spec.num_layers * kdb.STREAM_REF_BATCH * keys * db.spec.kv_layer_bytes_per_token(1)
    assert moved / measured > 4.8e12
    assert db.kv_stream_rate() == pytest.approx(0.8 * 4.8e12)
