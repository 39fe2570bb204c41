"""The latency-table backend and its folder format, on a hand-made table whose every value is known:
exact values at and between grid points, linear (not log) interpolation, additive composition,
linear extrapolation with a warning that names the dimension, and errors that name the file."""

from __future__ import annotations

import json
import warnings

import pytest

from policies.base import StepPlan
from sim.errors import CbsimError
from sim.hardware.gpus import get_gpu
from sim.hardware.models import get_model
from sim.latency import make_latency, step_shape
from sim.latency.table import TableExtrapolationWarning, TableLatency
from sim.latency.table_format import LatencyTable, make_component, read_table, write_table

TINY = get_model("tiny")
CPU = get_gpu("cpu")

OVERHEAD, GAP = 0.004, 0.0002
LIN_T = [0, 1, 101]
LIN_V = [0.0, 0.001, 0.011]  # 1 ms at 1 token, then 0.1 ms per token
PRE_N, PRE_C = [1, 101], [0, 1000]
PRE_V = [[0.002, 0.004], [0.012, 0.034]]
DEC_B, DEC_C = [0, 1, 3], [0, 500]
DEC_V = [[0.0, 0.0], [0.0, 0.001], [0.0, 0.002]]


def hand_table(**meta_overrides) -> LatencyTable:
    meta = {
        "source": "calib", "device": "test device", "model": TINY.to_dict(), "dtype": "fp32",
        "block_size": 32, "tensor_parallel": 1, "date": "2026-01-01T00:00:00+00:00", "grid": {},
        "bandwidth": {"h2d_bytes_per_s": 2e9, "d2h_bytes_per_s": 1e9},
        "heldout_error": {"mean_abs_rel": 0.01, "p90_abs_rel": 0.02, "n": 10, "measured_on": "hand"},
    }
    meta.update(meta_overrides)
    comps = {
        "overhead": make_component("overhead", (), OVERHEAD),
        "step_gap": make_component("step_gap", (), GAP),
        "linear": make_component("linear", (LIN_T,), LIN_V),
        "prefill_attn": make_component("prefill_attn", (PRE_N, PRE_C), PRE_V),
        "decode_attn": make_component("decode_attn", (DEC_B, DEC_C), DEC_V),
    }
    return LatencyTable(comps, meta)


@pytest.fixture
def table_dir(tmp_path):
    return write_table(tmp_path / "tab", hand_table())


@pytest.fixture
def lat(table_dir):
    return TableLatency.from_path(table_dir, TINY, CPU, 1, 32)


def plan_of(*entries) -> StepPlan:
    """entries: (new tokens, context) per request."""
    return StepPlan(scheduled=[None] * len(entries), num_new_tokens=[n for n, _ in entries],
                    context=[c for _, c in entries])


def price(lat, *entries) -> float:
    plan = plan_of(*entries)
    return lat.price(step_shape(plan), plan)[0]


FIXED = OVERHEAD + GAP


def test_round_trip_keeps_every_value(table_dir):
    back = read_table(table_dir)
    assert back.scalar("overhead") == OVERHEAD and back.scalar("step_gap") == GAP
    assert back.components["prefill_attn"].values.tolist() == PRE_V
    assert back.components["decode_attn"].axes == (tuple(map(float, DEC_B)), tuple(map(float, DEC_C)))
    assert back.metadata["grid"]["linear"] == {"tokens": LIN_T}
    assert back.metadata["format_version"] == 1


def test_exact_at_grid_points(lat):
    # one decode: linear(1) + decode_attn(1, 500); the request's context 500 is the grid point
    assert price(lat, (1, 500)) == pytest.approx(FIXED + 0.001 + 0.001, abs=1e-15)
    # one prefill chunk of 101 tokens on 1000 context: the far corner of every grid
    assert price(lat, (101, 1000)) == pytest.approx(FIXED + 0.011 + 0.034, abs=1e-15)


def test_linear_between_points_not_log(lat):
    # 51 tokens is halfway between 1 and 101: the mean of 1 ms and 11 ms, not their geometric mean
    assert lat._lin(51) == pytest.approx(0.006, abs=1e-15)
    # a 51-token chunk on 500 context is the centre of the prefill cell: the mean of its corners
    assert lat._pre(51, 500) == pytest.approx(sum(map(sum, PRE_V)) / 4, abs=1e-15)
    # 2 decodes at mean context 250: halfway in both dimensions of the decode cell [1,3] x [0,500]
    assert lat._dec(2, 250) == pytest.approx((0 + 0.001 + 0 + 0.002) / 4, abs=1e-15)


def test_step_is_the_sum_of_its_components(lat):
    # two decodes (contexts 100 and 400, mean 250), one prefill chunk (51 on 500), one fresh
    # 1-token prompt (n == 1 but context 0: a prefill, not a decode)
    got = price(lat, (1, 100), (51, 500), (1, 400), (1, 0))
    tokens = 1 + 51 + 1 + 1
    want = (FIXED + lat._lin(tokens) + lat._pre(51, 500) + lat._pre(1, 0) + lat._dec(2, 250))
    assert got == pytest.approx(want, abs=1e-15)
    assert lat._pre(1, 0) == 0.002 and lat._lin(tokens) == pytest.approx(0.001 + 53 * 1e-4)


def test_shape_only_pricing_recovers_the_single_chunk(lat):
    plan = plan_of((51, 500), (1, 300))
    shape = step_shape(plan)
    assert lat.price(shape, None)[0] == pytest.approx(lat.price(shape, plan)[0], abs=1e-15)


def test_flops_and_bytes_come_from_the_base_class(lat):
    plan = plan_of((51, 500), (1, 300))
    shape = step_shape(plan)
    assert lat.price(shape, plan)[1:] == lat.step_flops_bytes(shape)


def test_extrapolation_warns_once_per_dimension_naming_it_and_how_far(lat):
    with pytest.warns(TableExtrapolationWarning) as record:
        # 5 decodes: batch 5 is 2 above the last point 3; mean context 600 is 100 above 500
        value = price(lat, *[(1, 600)] * 5)
        price(lat, *[(1, 700)] * 6)  # same dimensions again: no new warning
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert any("decode_attn.batch = 5" in m and "2 above its last point 3" in m for m in messages)
    assert any("decode_attn.mean_context = 600" in m and "100 above its last point 500" in m for m in messages)
    # linear extrapolation from the last two points of each dimension
    dec = 0.001 + (5 - 1) / 2 * 0.001  # along batch at context 500: 1 ms + 0.5 ms per sequence
    dec *= 600 / 500  # along context (zero at context 0)
    assert value == pytest.approx(FIXED + lat._lin(5) + dec, rel=1e-12)


def test_inside_the_grid_is_silent(lat):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        price(lat, (1, 10), (1, 20), (1, 500), (64, 900))


def test_swap_uses_the_measured_bandwidths(lat):
    per_byte = (1 / 2e9 + 1 / 1e9) / 2
    assert lat.swap_time(3) == pytest.approx(3 * TINY.kv_bytes_per_token() * 32 * per_byte)
    assert lat.swap_time(0) == 0.0


def test_swap_falls_back_to_the_gpu_pcie_figure(tmp_path):
    path = write_table(tmp_path / "t", hand_table(bandwidth=None))
    lat = TableLatency.from_path(path, TINY, CPU, 1, 32)
    assert lat.swap_time(2) == pytest.approx(2 * TINY.kv_bytes_per_token() * 32 / CPU.pcie_bandwidth)


def test_scenario_backend_table_runs_through_make_latency(table_dir):
    from sim.runner import run

    scn = {
        "model": "tiny", "hardware": {"gpu": "cpu"},
        "latency": {"backend": "table", "path": str(table_dir)},
        "workload": {"requests": [{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 3}]},
        "engine": {"block_size": 32, "num_gpu_blocks": 8, "max_model_len": 512, "max_num_batched_tokens": 256},
        "policies": [{"name": "vllm-v1"}],
    }
    result = run(scn)
    steps = result.steps
    # step 1: a 40-token prefill on no context; steps 2-3: one decode on context 40, 41
    want = [FIXED + 0.001 + 0.01 * 39 / 100 + 0.002 + 0.01 * 39 / 100,
            FIXED + 0.001 + 0.001 * 40 / 500, FIXED + 0.001 + 0.001 * 41 / 500]
    assert steps["duration_s"].tolist() == pytest.approx(want, abs=1e-15)
    cfg = type("Cfg", (), {"backend": "table", "path": str(table_dir)})()
    assert isinstance(make_latency(cfg, TINY, CPU, 1, 32), TableLatency)


def test_refuses_a_table_of_another_model(table_dir):
    with pytest.raises(CbsimError, match=r"measured for model 'tiny'.*llama-3-8b"):
        TableLatency.from_path(table_dir, get_model("llama-3-8b"), CPU, 1, 32)


def test_refuses_another_tensor_parallel_degree(tmp_path):
    path = write_table(tmp_path / "t", hand_table(model=get_model("llama-3-8b").to_dict()))
    with pytest.raises(CbsimError, match=r"at tensor_parallel 1 .*hardware\.tensor_parallel 2"):
        TableLatency.from_path(path, get_model("llama-3-8b"), CPU, 2, 32)


def test_warns_on_another_block_size(table_dir):
    with pytest.warns(UserWarning, match="block_size 32.*block_size 16"):
        TableLatency.from_path(table_dir, TINY, CPU, 1, 16)


# --- format errors: each names the file and says what to do --------------------------------------
def _edit_csv(table_dir, fn):
    p = table_dir / "table.csv"
    p.write_text(fn(p.read_text()))


def test_missing_folder_or_file(tmp_path, table_dir):
    with pytest.raises(CbsimError, match="does not exist"):
        read_table(tmp_path / "nope")
    (table_dir / "metadata.json").unlink()
    with pytest.raises(CbsimError, match=r"has no metadata\.json"):
        read_table(table_dir)


def test_missing_component(table_dir):
    _edit_csv(table_dir, lambda t: "\n".join(ln for ln in t.splitlines() if not ln.startswith("step_gap")) + "\n")
    with pytest.raises(CbsimError, match=r"table\.csv: component\(s\) step_gap missing"):
        read_table(table_dir)


def test_grid_with_a_hole(table_dir):
    _edit_csv(table_dir, lambda t: "\n".join(ln for ln in t.splitlines() if not ln.startswith("prefill_attn,101,0,"))
              + "\n")
    with pytest.raises(CbsimError, match=r"prefill_attn is not a full grid: \{'chunk_tokens': 101.0, 'context': 0.0\}"):
        read_table(table_dir)


def test_bad_value_names_the_line(table_dir):
    _edit_csv(table_dir, lambda t: t.replace("overhead,,,0.004", "overhead,,,-1"))
    with pytest.raises(CbsimError, match=r"table\.csv:2: seconds must be >= 0"):
        read_table(table_dir)
    _edit_csv(table_dir, lambda t: t.replace("overhead,,,-1", "overhed,,,1"))
    with pytest.raises(CbsimError, match=r"unknown component 'overhed' \(did you mean 'overhead'\?\)"):
        read_table(table_dir)


def test_metadata_errors(table_dir):
    p = table_dir / "metadata.json"
    meta = json.loads(p.read_text())
    del meta["block_size"]
    p.write_text(json.dumps(meta))
    with pytest.raises(CbsimError, match=r"metadata\.json: required key 'block_size' is missing"):
        read_table(table_dir)
    meta["block_size"], meta["sorce"] = 32, "x"
    p.write_text(json.dumps(meta))
    with pytest.raises(CbsimError, match=r"unknown key 'sorce' \(did you mean 'source'\?\)"):
        read_table(table_dir)
    del meta["sorce"]
    meta["grid"]["linear"]["tokens"] = [0, 1, 99]
    p.write_text(json.dumps(meta))
    with pytest.raises(CbsimError, match=r"grid\.linear\.tokens is \[0, 1, 99\]"):
        read_table(table_dir)


@pytest.mark.parametrize(("b", "context", "k"), [(1, 10, 40), (2, 300, 400), (3, 5, 700), (5, 2000, 30)])
def test_decode_stretch_prices_equal_single_steps(lat, b, context, k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TableExtrapolationWarning)
        secs, flops, bytes_ = lat.price_decodes(b, context, k)
        base = [context // b + (1 if r < context % b else 0) for r in range(b)]  # any split of the sum
        for j in range(k):
            plan = plan_of(*[(1, c + j) for c in base])
            assert (secs[j], flops[j], bytes_[j]) == lat.price(step_shape(plan), plan), j
