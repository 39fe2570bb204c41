"""Models by the names people type (issue 28, item 1): the Hub's ids resolve to a local config.json of
the same architecture, a warning names it, suggestions stay in the family; ``cbsim models`` shows
whole ids at any width, and as JSON."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from sim.errors import CbsimError
from sim.hardware import model_sources
from sim.hardware.model_names import family_suggestions, name_key, same_architecture
from sim.hardware.models import ModelNameResolved, get_model

CFG = Path(__file__).parent / "data" / "hf_configs"
LOCAL = ["meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-8B", "nvidia/Llama-3.1-70B-Instruct-FP8",
         "meta-llama/Llama-4-Scout-17B-16E-Instruct", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-FP8",
         "Qwen/Qwen3-32B", "Qwen/Qwen3-8B", "mistralai/Mixtral-8x7B-v0.1"]


@pytest.mark.parametrize("asked, served", [
    ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),
    ("meta-llama/Meta-Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),
    ("meta-llama/llama-3.1-8b-instruct", "meta-llama/Meta-Llama-3.1-8B"),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B"),
    ("Qwen/Qwen3-30B-A3B-Thinking-2507-FP8", None),  # Thinking is not a release word: another key
    ("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", "Qwen/Qwen3-30B-A3B-FP8"),  # FP8 asked: the FP8 config first
    ("meta-llama/Llama-3.1-70B-FP8", "nvidia/Llama-3.1-70B-Instruct-FP8"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
    ("meta-llama/Llama-3.3-70B-Instruct", None),  # another release number: a suggestion, never a silent swap
    ("Qwen/Qwen3-14B", None),
])
def test_names_resolve_to_the_same_architecture(asked, served):
    assert same_architecture(asked, LOCAL) == served
    assert same_architecture(asked, list(reversed(LOCAL))) == served  # not the listing order


def test_the_key_drops_release_words_only():
    k = name_key("meta-llama/Meta-Llama-3.1-70B-Instruct")
    assert (k.org, k.key, k.family, k.size, k.fp8) == ("meta-llama", "llama-3.1-70b", "llama", "70b", False)
    assert name_key("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8").key == "qwen3-30b-a3b"
    assert name_key("google/gemma-2-9b-it").key == "gemma-2-9b"


def test_suggestions_stay_in_the_family_same_size_first():
    assert family_suggestions("meta-llama/Llama-3.3-70B-Instruct", LOCAL)[:2] == [
        "meta-llama/Meta-Llama-3.1-70B", "nvidia/Llama-3.1-70B-Instruct-FP8"]
    # no 14B: the nearest sizes (8B is 1.75x away, 30B 2.1x, 32B 2.3x), Mixtral and Llama never
    assert family_suggestions("Qwen/Qwen3-14B", LOCAL) == ["Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B",
                                                            "Qwen/Qwen3-30B-A3B-FP8"]
    assert family_suggestions("google/gemma-2-9b-it", LOCAL) == []  # no Gemma here: no Llama offered


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A Hugging Face cache holding one Qwen3 MoE and one Mixtral, aiconfigurator-core hidden."""
    for name, cfg in (("Qwen--Qwen3-30B-A3B", "qwen3-30b-a3b"), ("mistralai--Mixtral-8x7B-v0.1", "mixtral-8x7b")):
        snap = tmp_path / "hub" / f"models--{name}" / "snapshots" / "r1"
        snap.mkdir(parents=True)
        shutil.copy(CFG / f"{cfg}.json", snap / "config.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(model_sources, "aiconfigurator_configs_dir", lambda: None)


def test_a_hub_name_runs_on_its_base_config_with_one_warning(hub):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        spec = get_model("Qwen/Qwen3-30B-A3B-Instruct-2507")
    base = get_model("Qwen/Qwen3-30B-A3B")
    assert spec.name == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert (spec.num_layers, spec.num_experts, spec.num_params()) == (base.num_layers, base.num_experts,
                                                                     base.num_params())
    said = [str(w.message) for w in seen if issubclass(w.category, ModelNameResolved)]
    assert said == ["model 'Qwen/Qwen3-30B-A3B-Instruct-2507': served by the config.json of 'Qwen/Qwen3-30B-A3B' "
                    "(hf-cache), the same architecture under another name; give model: {hf_config: PATH} to use "
                    "another"]


def test_an_fp8_name_on_an_unquantized_config_is_priced_fp8(hub):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        spec = get_model("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8")
    assert spec.quantization == "fp8" and get_model("Qwen/Qwen3-30B-A3B").quantization is None
    assert "priced with quantization fp8" in str(seen[-1].message)


def test_no_config_suggests_the_family_never_another(hub):
    with pytest.raises(CbsimError, match=r"no config.json found locally \(same family: 'Qwen/Qwen3-30B-A3B'\)"):
        get_model("Qwen/Qwen3-14B")
    with pytest.raises(CbsimError) as exc:
        get_model("meta-llama/Llama-3.1-70B-Instruct")
    # the one Llama-3.1 config left here is the one cbsim ships (NVIDIA's FP8 8B): the family, never Qwen
    assert "(same family: 'nvidia/Llama-3.1-8B-Instruct-FP8')" in str(exc.value)
    assert "Qwen" not in str(exc.value)


def test_the_issue_names_run_with_aiconfigurator_configs():
    if model_sources.aiconfigurator_configs_dir() is None:
        pytest.skip("aiconfigurator-core is not installed (pip install 'cbsim[gpu-data]')")
    from sim.runner import run

    for name, served in (("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),
                         ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B")):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            result = run({"model": name, "hardware": {"gpu": "h100-sxm", "tensor_parallel": 4},
                          "workload": {"num_requests": 20, "arrival": {"rate": 2.0}},
                          "policies": [{"name": "vllm-v1"}]})
        assert result.summaries["vllm-v1"]["requests_finished"] == 20
        assert any(f"served by the config.json of {served!r}" in str(w.message) for w in seen)


@pytest.mark.parametrize("columns", ["60", "80", "200"])
def test_cbsim_models_prints_whole_ids_at_any_width(capsys, monkeypatch, columns):
    from sim.cli.models import model_rows, models_cmd

    monkeypatch.setenv("COLUMNS", columns)
    models_cmd(all_=False, json_=False)
    out = capsys.readouterr().out
    assert "…" not in out
    ids = [r["model"] for r in model_rows(False)[0]]
    assert len(ids) >= 6
    lines = out.splitlines()
    for name in ids:
        assert any(name in ln for ln in lines), f"{name} is not whole at COLUMNS={columns}"


def test_cbsim_models_json(capsys):
    from sim.cli.models import models_cmd

    models_cmd(all_=False, json_=True)
    rows = json.loads(capsys.readouterr().out)
    builtin = next(r for r in rows if r["model"] == "llama-3-8b")
    assert (builtin["source"], builtin["layers"], builtin["params_b"]) == ("built in", 32, 8.03)
