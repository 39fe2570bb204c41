"""What ``cbsim`` does with bad input: one clear line on stderr and exit code 2, never a traceback.

Each test here backs one row of the table in docs/bad-input.md, "What cbsim does with bad input", and asserts
the exact shape of the message a user sees. Most drive ``sim.cli.main.main`` in-process (fast);
``test_cli_binary_prints_one_line_and_exits_2`` runs the installed ``cbsim`` script itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import TINY_SCENARIO, run_cli

REPO = Path(__file__).resolve().parents[1]
CBSIM = Path(sys.executable).parent / "cbsim"

BASE = {**TINY_SCENARIO, "name": "bad-input"}


def scenario_file(tmp_path: Path, data: dict | None = None, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data if data is not None else BASE, sort_keys=False))
    return path


def error_of(capsys, tmp_path, *sets, data=None) -> str:
    """Run the scenario with ``--set`` overrides; assert the error contract; return the message."""
    path = scenario_file(tmp_path, data)
    args = ["run", path, "--out", tmp_path / "out", "--no-plots", "-q"]
    for s in sets:
        args += ["--set", s]
    code, out, err = run_cli(capsys, *args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert not (tmp_path / "out").exists(), "an error must not leave a results folder"
    return lines[0].removeprefix("error: ")


def test_the_base_scenario_runs(capsys, tmp_path):
    code, out, err = run_cli(capsys, "run", scenario_file(tmp_path), "--out", tmp_path / "out", "--no-plots", "-q")
    assert code == 0, err
    assert (tmp_path / "out" / "summary.json").exists()


# --- the scenario file --------------------------------------------------------------------------
def test_missing_scenario_file_suggests_the_nearest(capsys, tmp_path):
    scenario_file(tmp_path, name="quickstart.yaml")
    code, _, err = run_cli(capsys, "run", tmp_path / "quikstart.yaml")
    assert code == 2
    assert err.strip() == f"error: scenario file '{tmp_path / 'quikstart.yaml'}' does not exist " \
                          f"(did you mean 'quickstart.yaml'?)"


def test_yaml_syntax_error_names_line_and_column(capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nworkload: {num_requests: 3\n")
    code, _, err = run_cli(capsys, "run", path)
    assert code == 2 and err.startswith(f"error: {path}:3:1: YAML syntax error: ")


def test_absurdly_nested_yaml_is_an_error_not_a_crash(capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: " + "[" * 3000 + "]" * 3000 + "\n")
    code, _, err = run_cli(capsys, "run", path)
    assert code == 2 and err.strip() == f"error: {path}: nested too deeply to read (thousands of levels of [ or {{)"
    msg = error_of(capsys, tmp_path, "workload=" + "[" * 3000)
    assert msg.startswith("--set value '[[[[") and msg.endswith("...: nested too deeply to read")


def test_unknown_key_names_the_path_and_the_nearest_key(capsys, tmp_path):
    msg = error_of(capsys, tmp_path, "engine.max_num_seq=8")
    assert msg.startswith(f"{tmp_path / 's.yaml'}: unknown key 'engine.max_num_seq' (did you mean 'max_num_seqs'?); "
                          "allowed keys: block_size, max_num_seqs, ")
    assert msg.endswith("(from --set engine.max_num_seq=8)")


def test_wrong_type_names_the_key_expected_and_given(capsys, tmp_path):
    msg = error_of(capsys, tmp_path, "engine.block_size='16'")
    assert msg == f"{tmp_path / 's.yaml'}: engine.block_size: expected an integer, got '16' " \
                  "(from --set engine.block_size='16')"


@pytest.mark.parametrize("value, expected", [
    ("0", "must be > 0.0, got 0"),
    ("-2", "must be > 0.0, got -2"),
    (".inf", "expected a finite number, got inf"),
    (".nan", "expected a finite number, got nan"),
])
def test_zero_negative_or_infinite_rates(capsys, tmp_path, value, expected):
    msg = error_of(capsys, tmp_path, f"workload.arrival.rate={value}")
    assert f"workload.arrival.rate: {expected}" in msg


@pytest.mark.parametrize("value, expected", [("0", "must be > 0.0, got 0"), ("100", "must be < 100.0, got 100"),
                                             ("150", "must be < 100.0, got 150")])
def test_percentile_outside_0_100(capsys, tmp_path, value, expected):
    assert f"slo.percentile: {expected}" in error_of(capsys, tmp_path, f"slo.percentile={value}")


@pytest.mark.parametrize("key, value, expected", [
    ("model", "llama3-8b", "model: unknown model 'llama3-8b' (did you mean 'llama-3-8b'?); known models: "),
    ("hardware.gpu", "h100", "hardware.gpu: unknown gpu 'h100' (did you mean 'h100-sxm' or 'h100-pcie'?); known gpus: "),
    ("policies.0.name", "vllm_v1", "policies.0.name: unknown policy 'vllm_v1' (did you mean 'vllm-v1'?); policies: "),
])
def test_unknown_names_suggest_the_nearest(capsys, tmp_path, key, value, expected):
    assert expected in error_of(capsys, tmp_path, f"{key}={value}")


def test_block_size_not_a_power_of_two(capsys, tmp_path):
    assert "engine.block_size: must be a power of two, got 24" in error_of(capsys, tmp_path, "engine.block_size=24")


def test_token_budget_smaller_than_a_block(capsys, tmp_path):
    msg = error_of(capsys, tmp_path, "engine.max_num_batched_tokens=8")
    assert "engine.max_num_batched_tokens: must be >= block_size (16), got 8" in msg


def test_model_that_does_not_fit_states_bytes_needed_and_available(capsys, tmp_path):
    msg = error_of(capsys, tmp_path, "model=llama-3-70b", "hardware.gpu=h200", "engine.num_gpu_blocks=null")
    assert msg.startswith("model 'llama-3-70b' does not fit on h200 with tensor_parallel=1: each GPU needs "
                          "131.42 GiB of weights + 1.22 GiB activation reserve + at least one KV block "
                          "(5.00 MiB) = 142,421,147,648 bytes (132.64 GiB), but 150,119,844,413 bytes × "
                          "gpu_memory_utilization 0.92 = 138,110,256,859 bytes (128.63 GiB) are available.")
    assert msg.endswith("Raise hardware.tensor_parallel, choose a GPU with more memory, raise "
                        "hardware.gpu_memory_utilization, or use a smaller model.")


def test_kv_cache_smaller_than_max_model_len(capsys, tmp_path):
    msg = error_of(capsys, tmp_path, "model=llama-3-8b", "hardware.gpu=l40s", "engine.num_gpu_blocks=null",
                   "engine.max_model_len=1000000", "engine.max_num_batched_tokens=8192")
    assert msg.startswith("the KV cache of 'llama-3-8b' on l40s holds ")
    assert "fewer than engine.max_model_len (1,000,000)" in msg


@pytest.mark.parametrize("sets, expected", [
    (["policies.0.name=sarathi", "policies.0.chunk_size=0"], "policies.0.chunk_size: sarathi chunk_size must be >= 1; got 0"),
    (["policies.0.name=vllm-v0", "policies.0.preemption=swapp"],
     "policies.0.preemption: vllm-v0 preemption must be one of ['recompute', 'swap']; got 'swapp' (did you mean 'swap'?)"),
    (["policies.0.watermark=1.5"], "policies.0.watermark: vllm-v1 watermark must be in [0, 1), got 1.5"),
    (["policies.0.name=static", "policies.0.batch_size=-1"], "policies.0.batch_size: static batch_size must be at least 1"),
])
def test_bad_policy_knob_values(capsys, tmp_path, sets, expected):
    assert expected in error_of(capsys, tmp_path, *sets)


@pytest.mark.parametrize("sets, expected", [
    (["workload.num_requests=100000000000"], "workload.num_requests: must be <= 10000000, got 100000000000"),
    (["engine.num_gpu_blocks=1000000000"], "engine.num_gpu_blocks: must be <= 16777216, got 1000000000"),
    (["model={name: small, num_layers: 1, hidden_size: 8, num_heads: 1, intermediate_size: 8, vocab_size: 8}",
      "hardware.gpu=h200", "engine.num_gpu_blocks=null", "engine.block_size=1", "engine.max_num_batched_tokens=64"],
     "more than the 16,777,216 blocks cbsim simulates; raise engine.block_size"),
])
def test_sizes_that_would_exhaust_memory_are_refused(capsys, tmp_path, sets, expected):
    assert expected in error_of(capsys, tmp_path, *sets)


def test_scenario_name_must_be_a_folder_name(capsys, tmp_path):
    msg = error_of(capsys, tmp_path, "name=../elsewhere")
    assert "name: must be a plain folder name (it names results/<name>/), got '../elsewhere': it contains '/'" in msg


def test_requests_too_long_are_rejected_and_counted_by_every_policy(capsys, tmp_path):
    """Longer than max_model_len, or than the whole KV pool: the run completes, and each policy
    counts the request rejected, with its reason (in requests.parquet), as vLLM does."""
    import json

    import pandas as pd

    data = {**BASE, "engine": {"num_gpu_blocks": 64, "max_model_len": 4096, "max_num_batched_tokens": 4096},
            "workload": {"requests": [{"prompt_tokens": 5000, "output_tokens": 5},   # > max_model_len
                                      {"prompt_tokens": 2000, "output_tokens": 5},   # > 64 blocks of 16
                                      {"prompt_tokens": 50, "output_tokens": 5}]},
            "policies": [{"name": n} for n in ("static", "orca", "vllm-v1", "vllm-v0", "sarathi")]}
    code, out, err = run_cli(capsys, "run", scenario_file(tmp_path, data), "--out", tmp_path / "out",
                             "--no-plots", "-q")
    assert code == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["policies"]
    requests = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    for label, s in summary.items():
        assert (s["requests_finished"], s["requests_rejected"], s["requests_unfinished"]) == (1, 2, 0), label
        mine = requests[requests["policy"] == label].set_index("id")
        assert mine.loc["r000000", "state"] == mine.loc["r000001", "state"] == "rejected"
        assert "max_model_len" in mine.loc["r000000", "reason"], label
        assert "blocks" in mine.loc["r000001", "reason"], label  # more KV blocks than the pool has
        assert f"{label}: 2 requests rejected on their own (left out of the SLO verdicts): r000000: " in " ".join(
            out.split()), label


# --- traces -------------------------------------------------------------------------------------
def _trace_scenario(tmp_path, trace_text: str | None, fmt: str | None = None) -> dict:
    data = {k: v for k, v in BASE.items()}
    path = tmp_path / "t.csv"
    if trace_text is not None:
        path.write_text(trace_text)
    data["workload"] = {"trace": {"path": str(path), "format": fmt}}
    return data


def test_missing_trace_file_says_where_it_looked(capsys, tmp_path):
    msg = error_of(capsys, tmp_path, data=_trace_scenario(tmp_path, None))
    assert msg.startswith(f"workload.trace.path: trace file '{tmp_path / 't.csv'}' does not exist (looked in ")


@pytest.mark.parametrize("text, expected", [
    ("", "t.csv: the trace is empty (line 1 is blank); expected a header or a JSON object"),
    ("arrival_s,prompt_tokens,output_tokens\n", "t.csv: the trace has no requests"),
])
def test_empty_traces(capsys, tmp_path, text, expected):
    assert error_of(capsys, tmp_path, data=_trace_scenario(tmp_path, text)).endswith(expected)


@pytest.mark.parametrize("fmt, text, expected", [
    ("csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,x,3\n",
     "t.csv:3: expected prompt_tokens to be an integer >= 1, got 'x'"),
    ("csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,3\n",
     "t.csv:3: expected 3 comma-separated fields, got 2: '1,3'"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\nyesterday,3,4\n",
     "t.csv:3: expected TIMESTAMP like '2023-11-16 18:15:46.6805900', got 'yesterday'"),
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n{"timestamp": 5,\n',
     "t.csv:2: expected one JSON object per line (Expecting property name enclosed in double quotes at column 18)"),
    ("csv", "arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,99999999999999,3\n",
     "t.csv:3: prompt_tokens 99999999999999 is implausibly large (more than 1,000,000,000); is the column right?"),
])
def test_malformed_trace_rows_name_the_line(capsys, tmp_path, fmt, text, expected):
    assert error_of(capsys, tmp_path, data=_trace_scenario(tmp_path, text, fmt)).endswith(expected)


def test_trace_that_is_not_text(capsys, tmp_path):
    data = _trace_scenario(tmp_path, None, "csv")
    (tmp_path / "t.csv").write_bytes(b"arrival_s,prompt_tokens,output_tokens\n0,1\xff0,5\n")
    msg = error_of(capsys, tmp_path, data=data)
    assert msg.endswith("t.csv: not a UTF-8 text file (undecodable byte at offset 41); expected a csv trace")


# --- output folder ------------------------------------------------------------------------------
def test_out_folder_that_is_not_a_results_folder_is_never_replaced(capsys, tmp_path):
    precious = tmp_path / "project"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    code, out, err = run_cli(capsys, "run", scenario_file(tmp_path), "--out", precious, "--no-plots", "-q")
    assert code == 2 and "Traceback" not in err
    assert err.strip() == (f"error: {precious} already exists and is not a cbsim results folder (notes.txt); "
                           "results replace a folder whole, so give a new folder or an earlier results folder "
                           "(--out DIR)")
    assert (precious / "notes.txt").read_text() == "keep me"


def test_an_earlier_results_folder_is_replaced(capsys, tmp_path):
    path = scenario_file(tmp_path)
    for _ in range(2):
        code, _, err = run_cli(capsys, "run", path, "--out", tmp_path / "out", "--no-plots", "-q")
        assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s.yaml"]  # no temporary leftovers


# --- the installed script -----------------------------------------------------------------------
def test_cli_binary_prints_one_line_and_exits_2(tmp_path):
    path = scenario_file(tmp_path)
    proc = subprocess.run([str(CBSIM), "run", str(path), "--set", "engine.block_size=24", "--set",
                           "workload.arrival.rate=0"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line, even when wider than the terminal
    assert proc.stderr.startswith(f"error: {path}: workload.arrival.rate: must be > 0.0, got 0")
    assert "engine.block_size: must be a power of two, got 24" in proc.stderr
