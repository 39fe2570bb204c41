"""Scenarios: every shipped file loads, --set reaches any key, and mistakes give one message that
names the key path, what was expected and the nearest valid key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from policies.base import Knob, Policy
from sim.errors import ScenarioError
from sim.scenario import schema as scenario_mod
from sim.scenario.docs import field_docs, field_docs_markdown
from sim.scenario.overrides import apply_overrides, parse_value
from sim.scenario.schema import Scenario, load_scenario

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "scenarios").glob("*.yaml"))


def _minimal(**extra) -> dict:
    data = {
        "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 2.0}},
        "policies": [{"name": "orca"}],
    }
    data.update(extra)
    return data


def _error(source, overrides=()) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(source, overrides)
    return str(info.value)


# --- shipped scenarios ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_scenario_loads_and_round_trips(path):
    scn = load_scenario(path)
    assert scn.source == str(path)
    again = load_scenario(yaml.safe_load(scn.to_yaml()))
    # to_dict: files a scenario names (a latency table) are written as absolute paths on both sides
    assert again.to_dict() == scn.to_dict(), "the resolved YAML must load back to the same scenario"


def test_there_are_shipped_scenarios():
    assert {"quickstart.yaml", "seed_toy.yaml"} <= {p.name for p in SHIPPED}


# --- defaults and documentation ------------------------------------------------------------------
def test_defaults_are_the_documented_ones():
    scn = load_scenario({})
    assert scn.model == "llama-3-8b"
    assert (scn.hardware.gpu, scn.hardware.count, scn.hardware.tensor_parallel) == ("h200", 1, 1)
    assert scn.hardware.gpu_memory_utilization == 0.92
    assert scn.latency.backend == "roofline"
    e = scn.engine
    assert (e.block_size, e.max_num_seqs, e.max_num_batched_tokens, e.max_model_len) == (16, None, None, 8192)
    assert e.swap_space_gib == 4.0 and e.num_gpu_blocks is None and e.enable_prefix_caching is None
    assert [p.name for p in scn.policies] == ["vllm-v1"] and scn.policies[0].label == "vllm-v1"
    assert scn.workload.num_requests == 1000
    assert (scn.workload.arrival.process, scn.workload.arrival.rate) == ("poisson", 1.0)
    # the Azure conversation trace's lengths by quantiles (sim.workload.azure_conv)
    assert scn.workload.prompt_tokens.dist == scn.workload.output_tokens.dist == "azure-conv"
    assert scn.slo.percentile == 99 and scn.slo.ttft_s is None
    assert scn.horizon_s is None and scn.replicas.count == 1 and scn.replicas.router == "round-robin"


def test_every_key_is_documented():
    docs = field_docs(Scenario)
    keys = {d["key"] for d in docs}
    for key in ("engine.max_num_seqs", "workload.arrival.rate", "workload.trace.window_s",
                "policies.N.label", "hardware.activation_reserve_gib", "model.num_layers", "slo.percentile"):
        assert key in keys
    assert all(d["description"] for d in docs), [d["key"] for d in docs if not d["description"]]
    assert all(d["default"] != "" for d in docs)
    row = next(d for d in docs if d["key"] == "engine.block_size")
    assert row["default"] == "16" and row["type"] == "int"
    assert "| `engine.block_size` | int | 16 |" in field_docs_markdown(Scenario)


def test_seed_toy_shape_loads():
    scn = load_scenario({
        "model": "tiny", "hardware": {"gpu": "cpu"},
        "latency": {"backend": "constant", "step_s": 1.0},
        "workload": {"requests": [{"prompt_tokens": 4, "output_tokens": 3}, {"prompt_tokens": 4, "output_tokens": 8}]},
        "engine": {"max_num_seqs": 3, "num_gpu_blocks": 1000},
        "policies": [{"name": "static", "batch_size": 3}, {"name": "orca"}],
    })
    assert scn.workload.num_requests is None and len(scn.workload.requests) == 2
    assert scn.engine.num_gpu_blocks == 1000 and scn.latency.step_s == 1.0
    assert scn.policies[0].knobs() == {"batch_size": 3} and scn.policies[1].knobs() == {}
    dumped = yaml.safe_load(scn.to_yaml())
    assert "arrival" not in dumped["workload"], "unused generator keys are left out with written-out requests"


def test_trace_workload_defaults_follow_the_trace():
    scn = load_scenario(_minimal(workload={"trace": {"path": "t.csv"}}))
    w = scn.workload
    assert w.arrival.process == "trace" and w.arrival.rate is None
    assert w.prompt_tokens.dist == "trace" and w.output_tokens.dist == "trace"
    assert w.num_requests is None, "a trace replays all its rows unless num_requests is given"
    mixed = load_scenario(_minimal(workload={"trace": {"path": "t.csv"}, "arrival": {"rate": 3.0}, "num_requests": 5}))
    assert (mixed.workload.arrival.process, mixed.workload.arrival.rate) == ("poisson", 3.0)
    assert mixed.workload.num_requests == 5


def test_hardware_count_follows_tensor_parallel():
    scn = load_scenario(_minimal(model="llama-3-70b", hardware={"tensor_parallel": 4}, replicas={"count": 2}))
    assert scn.hardware.count == 4 and scn.total_gpus == 8
    msg = _error(_minimal(hardware={"count": 2, "tensor_parallel": 4}))
    assert msg.startswith("hardware.count: 2 GPUs per replica") and "tensor_parallel × data_parallel is 4" in msg


def test_inline_model_resolves_its_derived_fields():
    model = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "intermediate_size": 128, "vocab_size": 100}
    scn = load_scenario(_minimal(model={**model, "context_length": 4096}))
    assert scn.model.num_kv_heads == 4 and scn.model.head_dim == 16
    assert scn.engine.max_model_len == 4096, "engine.max_model_len defaults to the model's context length"
    with pytest.raises(ScenarioError, match=r"^engine\.max_model_len: is unset and the model 'inline' states no "
                                            r"context length; set engine\.max_model_len"):
        load_scenario(_minimal(model=model))
    assert load_scenario(_minimal(model=model, engine={"max_model_len": 512})).engine.max_model_len == 512


def test_max_model_len_defaults_to_the_model_s_own_length_as_vllm_derives_it():
    llama31 = load_scenario({"model": "meta-llama/Meta-Llama-3.1-8B"})  # rope_type llama3: not scaled again
    assert llama31.engine.max_model_len == 131072
    assert "max_model_len" not in llama31.engine.model_fields_set
    assert load_scenario(llama31, ["model=llama-2-7b"]).engine.max_model_len == 4096, "filled, not set"
    assert load_scenario({}).engine.max_model_len == 8192  # Meta-Llama-3-8B's max_position_embeddings
    from sim.hardware.hf_config import context_length

    assert context_length({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4}}) == 16384
    assert context_length({"max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}) == 131072
    assert context_length({"max_position_embeddings": 4096, "seq_length": 2048}) == 2048, "the smallest key"
    assert context_length({}) == 0


def test_a_model_whose_kv_cannot_hold_its_own_length_fails_in_one_line():
    from sim.errors import CbsimError
    from sim.scenario.resolved import resolve

    with pytest.raises(CbsimError) as exc:
        resolve(load_scenario({"model": "meta-llama/Meta-Llama-3.1-8B", "hardware": {"gpu": "rtx-4090"}}))
    msg = str(exc.value)
    assert "\n" not in msg
    assert "fewer than engine.max_model_len (131,072, unset: the model's own context length)" in msg
    assert "set engine.max_model_len to at most 43,872" in msg and "gpu_memory_utilization" in msg


# --- --set ---------------------------------------------------------------------------------------
def test_set_nested_and_list_keys():
    scn = load_scenario(SHIPPED_QUICKSTART, ["workload.arrival.rate=12", "policies.0.batch_size=16",
                                             "engine.max_num_seqs=64", "slo.e2e_s=30"])
    assert scn.workload.arrival.rate == 12.0
    assert scn.policies[0].knobs() == {"batch_size": 16}
    assert scn.engine.max_num_seqs == 64 and scn.slo.e2e_s == 30.0


def test_set_appends_a_list_entry_and_creates_missing_sections():
    scn = load_scenario(_minimal(), ["policies.1.name=static", "policies.1.batch_size=8",
                                     "workload.trace.path=t.csv", "workload.trace.window_s=[0, 600]"])
    assert [(p.name, p.knobs()) for p in scn.policies] == [("orca", {}), ("static", {"batch_size": 8})]
    assert scn.workload.trace.window_s == [0.0, 600.0]


def test_set_reaches_the_default_policy_list():
    scn = load_scenario({"workload": {"num_requests": 3, "arrival": {"rate": 1.0}}}, ["policies.0.label=v1"])
    assert [(p.name, p.label) for p in scn.policies] == [("vllm-v1", "v1")]


def test_set_on_a_scenario_object_keeps_everything_else():
    base = load_scenario(SHIPPED_QUICKSTART)
    scn = load_scenario(base, ["workload.arrival.rate=9"])
    assert scn.workload.arrival.rate == 9.0 and base.workload.arrival.rate == 6.0
    assert scn.model_dump(exclude={"workload"}) == base.model_dump(exclude={"workload"})
    assert scn.source == base.source


def test_set_values_are_yaml():
    assert parse_value("12") == 12 and parse_value("1e3") == 1000.0 and parse_value(".5") == 0.5
    assert parse_value("-2.5e-3") == -2.5e-3 and parse_value("[0, 600]") == [0, 600]
    assert parse_value("true") is True and parse_value("") is None and parse_value("llama-3-8b") == "llama-3-8b"
    assert parse_value("{name: orca}") == {"name": "orca"}


def test_apply_overrides_errors_name_the_path():
    data = {"engine": {"block_size": 16}, "policies": [{"name": "orca"}]}
    with pytest.raises(ScenarioError, match=r"--set 'engine\.block_size': expected KEY=VALUE"):
        apply_overrides(data, ["engine.block_size"])
    with pytest.raises(ScenarioError, match=r"engine\.block_size is a number \(16\), not a section"):
        apply_overrides(data, ["engine.block_size.x=1"])
    with pytest.raises(ScenarioError, match=r"policies has 1 entries \(indices 0\.\.0\); index 3 is out of range"):
        apply_overrides(data, ["policies.3.name=orca"])
    with pytest.raises(ScenarioError, match=r"policies is a list; address an entry by its index"):
        apply_overrides(data, ["policies.name=orca"])
    with pytest.raises(ScenarioError, match=r"empty part"):
        apply_overrides(data, ["engine..block_size=1"])
    assert data == {"engine": {"block_size": 16}, "policies": [{"name": "orca"}]}, "the input is not modified"


# --- error messages ------------------------------------------------------------------------------
SHIPPED_QUICKSTART = REPO / "scenarios" / "quickstart.yaml"


def test_unknown_key_names_path_nearest_and_allowed_keys(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("engine: {max_num_seq: 3}\nworkload: {num_requests: 1, arrival: {rate: 1.0}}\n")
    msg = _error(f)
    assert msg.startswith(f"{f}: unknown key 'engine.max_num_seq' (did you mean 'max_num_seqs'?); allowed keys: "
                          "block_size, max_num_seqs, max_num_batched_tokens, max_model_len")
    assert "\n" not in msg


def test_unknown_key_at_top_level_and_deep():
    assert _error(_minimal(modle="tiny")).startswith("unknown key 'modle' (did you mean 'model'?); allowed keys: name, seed")
    msg = _error(_minimal(workload={"num_requests": 1, "arrival": {"rate": 1.0, "rat": 2}}))
    assert msg.startswith("unknown key 'workload.arrival.rat' (did you mean 'rate'?); allowed keys: process, rate, cv")
    msg = _error(_minimal(model={"num_layer": 2, "num_layers": 2, "hidden_size": 64, "num_heads": 4,
                                 "intermediate_size": 128, "vocab_size": 100}))
    assert msg.startswith("unknown key 'model.num_layer' (did you mean 'num_layers'?); allowed keys: name, num_layers")


def test_unknown_key_from_set_says_so():
    msg = _error(SHIPPED_QUICKSTART, ["engine.max_num_seq=3"])
    assert "unknown key 'engine.max_num_seq' (did you mean 'max_num_seqs'?)" in msg
    assert msg.endswith("(from --set engine.max_num_seq=3)")


def test_wrong_types():
    assert _error(_minimal(engine={"block_size": "abc"})) == "engine.block_size: expected an integer, got 'abc'"
    assert _error(_minimal(engine={"block_size": 16.0})) == "engine.block_size: expected an integer, got 16.0"
    assert _error(_minimal(engine={"enable_prefix_caching": "on"})) == \
        "engine.enable_prefix_caching: expected true or false, got 'on'"
    assert _error(_minimal(model=42)) == "model: expected a string or a mapping (key: value), got 42"
    inline = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 3, "intermediate_size": 128,
              "vocab_size": 100}
    assert _error(_minimal(model=inline)) == \
        "model: model 'inline': num_heads (4) must be a multiple of num_kv_heads (3) (grouped-query attention)"
    assert _error(_minimal(engine=[1, 2])) == "engine: expected a mapping (key: value), got [1, 2]"
    assert _error(_minimal(policies=[{"name": "orca"}, {"label": "x"}])) == "policies.1.name: required key is missing"


def test_bad_values():
    assert _error(_minimal(engine={"block_size": 24})) == "engine.block_size: must be a power of two, got 24"
    assert _error(_minimal(hardware={"gpu_memory_utilization": 1.5})) == \
        "hardware.gpu_memory_utilization: must be <= 1.0, got 1.5"
    msg = _error(_minimal(workload={"num_requests": 1, "arrival": {"process": "poison", "rate": 1.0}}))
    assert msg == ("workload.arrival.process: expected one of poisson, gamma, constant, trace, closed, got 'poison' "
                   "(did you mean 'poisson'?)")
    assert _error(_minimal(model="llama3-8b")).startswith("model: unknown model 'llama3-8b' (did you mean 'llama-3-8b'?)")
    assert _error(_minimal(hardware={"gpu": "h300"})).startswith("hardware.gpu: unknown gpu 'h300' (did you mean 'h200'?)")
    assert "does not divide its 32 attention heads" in _error(_minimal(hardware={"tensor_parallel": 3, "count": 3}))
    assert _error(_minimal(latency={"backend": "constant"})) == \
        "latency.step_s: required for backend 'constant' (seconds per step)"
    assert _error(_minimal(latency={"backend": "table"})).startswith("latency.path: required for backend 'table'")
    assert _error(_minimal(latency={"step_s": 1.0})) == "latency.step_s: only used by backend 'constant', not 'roofline'"
    w = {"num_requests": 1, "arrival": {"process": "gamma", "rate": 1.0}}
    assert _error(_minimal(workload=w)).startswith("workload.arrival.cv: required for process 'gamma'")
    w = {"num_requests": 1, "arrival": {"rate": 1.0}, "prompt_tokens": {"dist": "uniform", "min": 9, "max": 3}}
    assert _error(_minimal(workload=w)) == "workload.prompt_tokens.min: must be <= max (3), got 9"
    w = {"num_requests": 1, "arrival": {"rate": 1.0}, "prompt_tokens": {"dist": "lognormal", "mean": 100, "p99": 5000}}
    assert "p99 can be at most 14.97 × mean" in _error(_minimal(workload=w))
    w = {"num_requests": None, "arrival": {"rate": 1.0}}
    assert _error(_minimal(workload=w)).startswith("workload.num_requests: required for a synthetic workload")
    w = {"num_requests": 1, "arrival": {"process": "trace"}}
    assert _error(_minimal(workload=w)).startswith("workload.arrival.process: 'trace' needs workload.trace")
    w = {"requests": [{"prompt_tokens": 4, "output_tokens": 5, "max_tokens": 3}]}
    assert _error(_minimal(workload=w)) == "workload.requests.0.max_tokens: must be >= output_tokens (5), got 3"


def test_several_problems_are_reported_together():
    msg = _error(_minimal(engine={"block_size": "x", "max_num_seqs": 0}))
    assert msg == "engine.block_size: expected an integer, got 'x'; engine.max_num_seqs: must be >= 1, got 0"


def test_yaml_problems(tmp_path):
    assert "does not exist (did you mean 'quickstart.yaml'?)" in _error(REPO / "scenarios" / "quickstar.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nengine: {block_size: 16\nseed: 1\n")
    assert _error(bad).startswith(f"{bad}:3:")
    assert "YAML syntax error" in _error(bad)
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: a\nseed: 1\nname: b\n")
    msg = _error(dup)
    assert msg.startswith(f"{dup}:3:1: YAML syntax error: found duplicate key 'name' (first at line 1)")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert "is empty" in _error(empty)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    assert "a scenario is a mapping" in _error(listy)


def test_floats_in_exponent_form_are_numbers_in_files(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("workload: {num_requests: 3, arrival: {rate: 1e3}}\npolicies: [{name: orca}]\n")
    assert load_scenario(f).workload.arrival.rate == 1000.0


# --- policy entries ------------------------------------------------------------------------------
class _Fake(Policy):
    name = "fake"
    KNOBS = {
        "batch_size": Knob(None, "slots", type=int),
        "watermark": Knob(0.01, "free fraction", type=float),
        "preemption": Knob("recompute", "mode", type=str),
        "flag": Knob(False, "a switch", type=bool),
    }


@pytest.fixture
def fake_registry(monkeypatch):
    monkeypatch.setattr(scenario_mod, "policy_registry", lambda: {"fake": _Fake, "other": _Fake})


def test_policy_knobs_are_validated_against_the_policy(fake_registry):
    scn = load_scenario(_minimal(policies=[{"name": "fake", "batch_size": 4, "watermark": 0, "flag": True},
                                           {"name": "fake", "label": "b", "batch_size": None}]))
    assert scn.policies[0].knobs() == {"batch_size": 4, "watermark": 0, "flag": True}
    assert scn.policies[1].knobs() == {"batch_size": None} and scn.policies[1].label == "b"
    msg = _error(_minimal(policies=[{"name": "fake", "watermak": 0.1}]))
    assert msg == ("unknown key 'policies.0.watermak' for policy 'fake' (did you mean 'watermark'?); "
                   "allowed keys: name, label, batch_size, watermark, preemption, flag")
    assert _error(_minimal(policies=[{"name": "fake", "batch_size": "8"}])) == \
        "policies.0.batch_size: expected an integer, got '8'"
    assert _error(_minimal(policies=[{"name": "fake", "batch_size": True}])) == \
        "policies.0.batch_size: expected an integer, got true"
    assert _error(_minimal(policies=[{"name": "fake", "flag": 1}])) == "policies.0.flag: expected true or false, got 1"
    assert _error(_minimal(policies=[{"name": "fake", "watermark": None}])) == \
        "policies.0.watermark: expected a number, got null"
    assert _error(_minimal(policies=[{"name": "fak"}])) == \
        "policies.0.name: unknown policy 'fak' (did you mean 'fake'?); policies: fake, other"


def test_policy_labels_default_to_the_name_and_must_be_unique(fake_registry):
    scn = load_scenario(_minimal(policies=[{"name": "fake"}, {"name": "other"}]))
    assert [p.label for p in scn.policies] == ["fake", "other"]
    msg = _error(_minimal(policies=[{"name": "fake"}, {"name": "other"}, {"name": "fake"}]))
    assert msg == "policies.2.label: 'fake' is already the label of policies.0; give each entry a distinct label"


def test_policy_entries_use_the_real_registry():
    from policies.registry import POLICIES

    scn = load_scenario(_minimal(policies=[{"name": name} for name in POLICIES]))
    assert [p.name for p in scn.policies] == list(POLICIES)


# --- files a scenario names ----------------------------------------------------------------------
def test_relative_paths_resolve_beside_the_scenario_file(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n")
    f = tmp_path / "sub" / "s.yaml"
    f.write_text("workload: {trace: {path: t.csv}}\npolicies: [{name: orca}]\n")
    monkeypatch.chdir(REPO)
    scn = load_scenario(f)
    assert scn.resolve_path("t.csv") == tmp_path / "sub" / "t.csv"
    assert scn.resolve_path("scenarios/quickstart.yaml") == Path("scenarios/quickstart.yaml")
    assert scn.resolve_path("missing.csv") == Path("missing.csv")
