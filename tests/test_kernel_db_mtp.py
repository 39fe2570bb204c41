"""DeepSeek's multi-token-prediction layer composed from the kernel database
(``cbsim calibrate --from-kernel-db --draft mtp``, calib/sources/kernel_db_mtp.py, issue #30
deliver 4), and the SGLang / TensorRT-LLM drafters priced from it (``speculative.draft_table``).

The MTP layer is one more MLA + MoE decoder layer of the target with the target's LM head, so its
table's attention is exactly the target's per layer (AIConfigurator prices every DeepSeek layer's
``mla_block`` alike) and its per-sequence term (the LM head) is the target's own."""

from __future__ import annotations

import json

import pytest

from sim.errors import CbsimError
from tests.helpers import require_aic

DSV3 = "deepseek-ai/DeepSeek-V3"
LIMITS = dict(max_num_batched_tokens=2048, max_model_len=2048, max_num_seqs=64, block_size=64)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The target's and the MTP layer's tables, DeepSeek-V3 FP8 on 8 x H200 in SGLang and TRT-LLM
    (TP 8), and the MTP layer's for attention DP 8 + EP 8 (TRT-LLM)."""
    require_aic()
    from calib.sources import kernel_db_moe, kernel_db_mtp
    from sim.latency.table_format import write_table

    root = tmp_path_factory.mktemp("mtp")
    out = {}
    for engine in ("sglang", "trtllm"):
        for name, mod in (("target", kernel_db_moe), ("mtp", kernel_db_mtp)):
            comp = mod.build_table(DSV3, "h200", kernel_db_moe.Layout(8), engine=engine, **LIMITS)
            write_table(root / f"{engine}-{name}", comp.table)
            out[engine, name] = root / f"{engine}-{name}"
    for name, mod in (("target-dp8", kernel_db_moe), ("mtp-dp8", kernel_db_mtp)):
        comp = mod.build_table(DSV3, "h200", kernel_db_moe.Layout(1, 8, True), engine="trtllm", **LIMITS)
        write_table(root / f"trtllm-{name}", comp.table)
        out["trtllm", name] = root / f"trtllm-{name}"
    return out


def _table(path):
    from sim.latency.table_format import read_table

    return read_table(path)


def test_the_mtp_source_is_the_targets_config_with_one_moe_layer():
    require_aic()
    from calib.sources.kernel_db import resolve_model
    from calib.sources.kernel_db_mtp import mtp_source
    from sim.speculative.draft_cost import draft_spec

    target = resolve_model(DSV3)
    head = mtp_source(target)
    assert head.config["num_hidden_layers"] == 1 and head.config["first_k_dense_replace"] == 0
    assert head.config["num_nextn_predict_layers"] == 0
    assert head.config["kv_lora_rank"] == target.config["kv_lora_rank"] == 512
    assert head.spec == draft_spec("mtp", target.spec)  # what the scenario's drafter checks the table against
    with pytest.raises(CbsimError, match="ships no multi-token-prediction layer"):
        mtp_source(resolve_model("moonshotai/Kimi-K2-Instruct"))
    with pytest.raises(CbsimError, match="ships no multi-token-prediction layer"):
        mtp_source(resolve_model("llama-3-8b"))


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_the_mtp_table_is_one_of_the_targets_layers_and_its_lm_head(tables, engine):
    from calib.sources.kernel_db import interp

    target, mtp = _table(tables[engine, "target"]), _table(tables[engine, "mtp"])
    layers = target.metadata["model"]["num_layers"]
    assert layers == 61 and mtp.metadata["model"]["num_layers"] == 1
    assert mtp.metadata["model"]["vocab_size"] == target.metadata["model"]["vocab_size"] == 129280
    for b, c in ((1, 1), (8, 1024), (64, 1024)):
        assert interp(mtp, "decode_attn", b, c) * layers == pytest.approx(interp(target, "decode_attn", b, c),
                                                                          rel=1e-6)
    for n, c in ((64, 0), (1024, 1024)):
        whole = interp(target, "prefill_attn", n, c)
        assert interp(mtp, "prefill_attn", n, c) * layers == pytest.approx(whole, rel=1e-6)
    for b in (1, 8, 64):  # the LM head and sampling: the target's own
        assert interp(mtp, "per_seq", b) == pytest.approx(interp(target, "per_seq", b), rel=1e-9)
    # the linear part: one MoE layer of 61 (the target's three dense first layers are cheaper), so
    # between a 61st of the target's and a 58th (the target's MoE layers alone)
    for t in (8, 512):
        lin, whole = interp(mtp, "linear", t), interp(target, "linear", t)
        assert whole / 61 * 0.95 < lin < whole / 58 * 1.05
    assert "mtp" in mtp.metadata["provenance"]["draft"]


def _scenario(engine, target, draft, hardware=None, k=2):
    from sim.scenario.schema import load_scenario

    return load_scenario({
        "seed": 1,
        "model": DSV3,
        "hardware": hardware or {"gpu": "h200", "tensor_parallel": 8},
        "engine": {"block_size": 64, "max_model_len": 2048, "max_num_batched_tokens": 2048},
        "latency": {"backend": "table", "path": str(target)},
        "workload": {"num_requests": 16, "arrival": {"rate": 8.0},
                     "prompt_tokens": {"dist": "uniform", "min": 64, "max": 512},
                     "output_tokens": {"dist": "uniform", "min": 8, "max": 64}},
        "policies": [{"name": engine, "speculative": {"method": "mtp", "num_speculative_tokens": k,
                                                      "acceptance": {"rate": 0.7},
                                                      **({"draft_table": str(draft)} if draft else {})}}],
    })


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_sglang_and_trtllm_draft_with_the_mtp_table_and_every_token_is_emitted_once(tables, engine):
    import sim

    res = sim.run(_scenario(engine, tables[engine, "target"], tables[engine, "mtp"]))
    req, steps = res.requests, res.steps
    assert (req["state"] == "finished").all()
    assert (req["generated"] == req["output_tokens"]).all()
    assert all(len(t) == g for t, g in zip(req["token_times_s"], req["generated"]))
    assert int(steps["spec_accepted"].sum()) == int(req["spec_accepted"].sum()) > 0
    assert (steps["spec_accepted"] <= steps["spec_proposed"]).all()
    # the drafter priced from the table is not the roofline's: the same run without draft_table differs
    roof = sim.run(_scenario(engine, tables[engine, "target"], None)).steps
    assert float(steps["duration_s"].sum()) != pytest.approx(float(roof["duration_s"].sum()), rel=1e-3)


def test_the_mtp_drafter_on_its_table_is_the_sum_of_the_tables_rows(tables):
    """k = 2 for 8 requests after a verify step at context 700: one pass over the step's 24 rows
    (decode rows of context 700), one one-token pass at context 703; linear + per_seq + decode_attn
    of the MTP table, plus eh_proj (2 hidden -> hidden) on the roofline."""
    from calib.sources.kernel_db import interp
    from sim.hardware.gpus import get_gpu
    from sim.hardware.models import get_model
    from sim.latency.base import step_shape
    from sim.latency.table import TableLatency
    from sim.speculative.draft_cost import DraftCost
    from tests.test_speculative import _decode_plan

    target, gpu = get_model(DSV3), get_gpu("h200")
    cost = DraftCost("mtp", 2, target, gpu, 8, 64)
    cost.use_table(TableLatency.from_path(tables["sglang", "mtp"], cost.spec, gpu, 8, 64))
    t = cost.table.table
    plan = _decode_plan(8, 700, 2)
    shape = step_shape(plan)
    shape.spec_tokens = 16
    got = cost.price(plan, shape)[0]
    first = interp(t, "linear", 24) + interp(t, "per_seq", 8) + interp(t, "decode_attn", 8, 700)
    later = interp(t, "linear", 8) + interp(t, "per_seq", 8) + interp(t, "decode_attn", 8, 703)
    roof = cost.roof
    fc = max(cost._fc_flops * 24 / roof.linear_rate, (cost._fc_bytes + cost._fc_act * 24) / roof.memory_rate)
    assert got == pytest.approx(first + later + fc, rel=1e-9)


def test_an_mtp_table_serves_the_layout_it_was_made_for_only(tables):
    """Attention DP 8 + EP 8 (TensorRT-LLM's wide-EP rows): the MTP layer's table made for that
    layout drafts for it, ranks in lockstep; the TP 8 scenario refuses it, naming the layout."""
    import sim

    meta = json.loads((tables["trtllm", "mtp-dp8"] / "metadata.json").read_text())
    assert meta["parallel"] == {"data_parallel": 8, "expert_parallel": 8, "moe_tensor_parallel": 1}
    dp8 = {"gpu": "h200", "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": True}
    res = sim.run(_scenario("trtllm", tables["trtllm", "target-dp8"], tables["trtllm", "mtp-dp8"], dp8))
    assert (res.requests["state"] == "finished").all()
    assert (res.requests["generated"] == res.requests["output_tokens"]).all()
    assert int(res.steps["spec_accepted"].sum()) == int(res.requests["spec_accepted"].sum()) > 0
    with pytest.raises(CbsimError, match="tensor_parallel 1 but the scenario has hardware.tensor_parallel 8"):
        sim.run(_scenario("trtllm", tables["trtllm", "target"], tables["trtllm", "mtp-dp8"]))


def test_cli_draft_mtp_writes_the_layers_table_and_refuses_what_it_cannot_compose(tmp_path):
    require_aic()
    from typer.testing import CliRunner

    from sim.cli.main import app

    base = ["calibrate", "--from-kernel-db", "--gpu", "h200", "--engine", "sglang", "--tp", "8",
            "--max-num-batched-tokens", "1024", "--max-model-len", "1024", "--max-num-seqs", "16",
            "--block-size", "64"]
    out = tmp_path / "mtp"
    res = CliRunner().invoke(app, [*base, "--model", DSV3, "--draft", "mtp", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "DeepSeek-V3-mtp-head" in res.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["model"]["num_layers"] == 1 and meta["model"]["num_experts"] == 256
    res = CliRunner().invoke(app, [*base, "--model", DSV3, "--draft", "mtp", "--draft-vocab-size", "1000",
                                   "--out", str(tmp_path / "x")])
    assert "--draft-vocab-size goes with --draft eagle or eagle3" in str(res.exception)
    res = CliRunner().invoke(app, [*base, "--model", "moonshotai/Kimi-K2-Instruct", "--draft", "mtp",
                                   "--out", str(tmp_path / "y")])
    assert "ships no multi-token-prediction layer" in str(res.exception)
