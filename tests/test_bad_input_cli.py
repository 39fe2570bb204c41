"""Bad input to every command, not only ``cbsim run`` (issue 21): one clear line or the usual
usage message, never a traceback, a hang or a silently wrong number.

One test (or a parametrized family) per class of the issue, then a fuzz test that hands random
bytes, random JSON shapes and mutated real files to every command that reads a user's file.
Everything drives ``sim.cli.main.main`` in-process, as ``tests/test_bad_input.py`` does.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sim.cli import main as cli
from sim.scenario.errors import show_value
from sim.scenario.overrides import MAX_ALIAS_EXPANSION
from tests.fuzz_profiles import examples
from tests.helpers import TINY_SCENARIO, run_cli, wall_clock_limit

REPO = Path(__file__).resolve().parents[1]
ORACLE = REPO.parent / "shared" / "reference" / "oracle"
CPU_RUNS = REPO.parent / "shared" / "reference" / "vllm-cpu-runs"

BASE = {**TINY_SCENARIO, "name": "bad-input-cli", "slo": {"ttft_s": 1.0}}
UNWRITABLE = Path("/sys/cbsim-test")  # read-only even for root (sysfs); skipped where it is not


def one_line_error(capsys, *args) -> str:
    """Run; assert exit 2 and exactly one ``error:`` line on stderr; return the message."""
    code, out, err = run_cli(capsys, *args)
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0].removeprefix("error: ")


def scenario_file(tmp_path: Path, data: dict | None = None, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data if data is not None else BASE, sort_keys=False))
    return path


def results_folder(capsys, tmp_path: Path) -> Path:
    out = tmp_path / "res"
    code, _, err = run_cli(capsys, "run", scenario_file(tmp_path), "--out", out, "--no-plots", "-q")
    assert code == 0, err
    return out


def steplog_dict(tokens: int = 40) -> dict:
    """A vllm-json step log (sim/recorded/steplog.py) of one request: a prefill, then a decode per
    token, 10 ms each with 1 ms between (enough steps for a fit)."""
    steps, times = [], []
    for i in range(tokens):
        start = i * 0.011
        steps.append({"start_s": start, "end_s": start + 0.01, "scheduled": {"a": 3 if i == 0 else 1},
                      "context": {"a": 0 if i == 0 else 2 + i}, "preempted": []})
        times.append(start + 0.01)
    return {
        "source": "vLLM on cpu, fp32",
        "model": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 4, "head_dim": 16, "vocab_size": 256},
        "config": {"block_size": 16, "num_blocks": 65, "max_num_batched_tokens": 64, "max_num_seqs": 4,
                   "max_model_len": 128, "policy": "fcfs", "enable_prefix_caching": False},
        "requests": [{"id": "a", "arrival_s": 0.0, "prompt_tokens": 3, "max_tokens": tokens,
                      "token_times_s": times, "preemptions": 0}],
        "steps": steps,
    }


def golden_dict() -> dict:
    """A two-step golden log (reference/oracle format) of one request."""
    return {
        "name": "tiny",
        "config": {"block_size": 16, "num_blocks": 11, "max_num_batched_tokens": 64, "max_num_seqs": 4,
                   "max_model_len": 128},
        "requests": [{"id": "a", "arrival_step": 0, "prompt_tokens": 3, "max_tokens": 2}],
        "steps": [{"step": 0, "scheduled": {"a": 3}, "admitted": ["a"], "free_blocks": 9, "num_running": 1, "num_waiting": 0},
                  {"step": 1, "scheduled": {"a": 1}, "free_blocks": 10, "num_running": 0, "num_waiting": 0,
                   "finished": ["a"]}],
    }


# --- 1. usage errors: the usual usage message, exit 2 ------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["run", "{s}", "--polcy", "orca"], "No such option: --polcy"),
    (["policies", "bogus"], "unexpected extra argument"),
    (["run"], "Missing argument"),
    (["sweep", "{s}", "--rates", "1", "--workers", "abc"], "Invalid value for '--workers'"),
    (["capacity", "{s}", "--tolerance", "x"], "Invalid value for '--tolerance'"),
    (["no-such-command"], "No such command"),
])
def test_usage_errors_print_the_usage_message_and_exit_2(capsys, tmp_path, args, says):
    s = scenario_file(tmp_path)
    code, out, err = run_cli(capsys, *[a.format(s=s) for a in args])
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    assert "Usage: cbsim" in err and says in err, err


def test_no_command_prints_the_help(capsys):
    code, out, err = run_cli(capsys)
    assert code == 2 and "Traceback" not in out + err
    assert "Commands" in out + err


# --- 2. a YAML alias bomb ----------------------------------------------------------------------
def nested_aliases(levels: int, width: int = 9) -> str:
    """A YAML flow list whose aliases expand to width**levels entries, in a few hundred bytes."""
    expr = "&l0 [" + ", ".join(["x"] * width) + "]"
    for i in range(1, levels + 1):
        expr = f"&l{i} [{expr}, " + ", ".join([f"*l{i - 1}"] * (width - 1)) + "]"
    return expr


def test_alias_bomb_is_refused_at_once(capsys, tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False).replace("slo:\n  ttft_s: 1.0\n", "")
                    + f"slo:\n  ttft_s: {nested_aliases(12)}\n")  # 9**13 ≈ 2.5e12 values
    assert path.stat().st_size < 2000
    with wall_clock_limit(20):
        msg = one_line_error(capsys, "run", path, "-q", "--out", tmp_path / "out")
    assert f"expand to more than {MAX_ALIAS_EXPANSION:,} values" in msg
    assert msg.startswith(f"{path}:") and ": slo.ttft_s: its aliases" in msg  # the field it sits in


def test_alias_use_below_the_bound_gets_the_type_error(capsys, tmp_path):
    path = tmp_path / "aliases.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False).replace("slo:\n  ttft_s: 1.0\n", "")
                    + f"slo:\n  ttft_s: {nested_aliases(3)}\n")
    msg = one_line_error(capsys, "run", path, "-q", "--out", tmp_path / "out")
    assert msg.endswith("slo.ttft_s: expected a number, got a list")


def test_error_message_never_renders_a_huge_value():
    value: list = ["x"] * 9
    for _ in range(40):  # 9**41 entries by reference: rendering it whole would never end
        value = [value] * 9
    start = time.process_time()
    assert show_value(value) == "a list"
    assert show_value([1, 2]) == "[1, 2]"
    assert time.process_time() - start < 5  # a hang guard, not a speed assertion: the walk is bounded


# --- 3. guarded readers: golden logs, step logs, latency tables ---------------------------------
@pytest.mark.parametrize("content, says", [
    ("42", "expected a JSON object"),
    ({"config": [1], "requests": [], "steps": []}, "config: expected a JSON object, got [1]"),
    ({"config": {"num_blocks": "ten"}, "requests": [], "steps": []}, "config.num_blocks: expected an integer"),
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not a UTF-8 text file"),
    ("[" * 100_000, "nested too deeply"),
    ("{\"config\": 1" + "0" * 5000 + "}", "unreadable value"),
])
def test_conformance_on_a_malformed_log_names_the_file_and_field(capsys, tmp_path, content, says):
    path = tmp_path / "log.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    msg = one_line_error(capsys, "conformance", path)
    assert str(path) in msg and says in msg, msg


@pytest.mark.parametrize("where, value, says", [
    (("steps", 0, "free_blocks"), 9.5, "steps[0].free_blocks: expected an integer, got 9.5"),
    (("steps", 0, "scheduled"), {"a": -3}, "steps[0].scheduled.a: must be >= 0"),
    (("requests", 0, "prompt_tokens"), "3", "requests[0].prompt_tokens: expected an integer"),
    (("requests", 0, "prefix_len"), 99, "requests[0].prefix_len: is 99, longer than the prompt"),
    (("config", "num_blocks"), 10**12, "config.num_blocks: must be <= 16,777,217"),
    (("steps",), {"0": 1}, "steps: expected a list"),
])
def test_golden_log_fields_are_checked_before_the_replay(capsys, tmp_path, where, value, says):
    data = golden_dict()
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    assert says in one_line_error(capsys, "conformance", path)


def test_the_minimal_golden_log_replays(capsys, tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(golden_dict()))
    code, out, err = run_cli(capsys, "conformance", path)
    assert code == 0, out + err
    assert "matched 2/2 steps" in out


@pytest.mark.parametrize("where, value, says", [
    (("config", "num_blocks"), 0, "config.num_blocks: must be >= 2, got 0"),
    (("requests", 0, "arrival_s"), -1, "requests[0].arrival_s: must be >= 0"),
    (("requests", 0, "token_times_s"), [0.1, float("inf")], "token_times_s[1]: expected a number"),
    (("steps", 1, "context"), {"a": 2.5}, "steps[1].context.a: expected an integer, got 2.5"),
    (("model",), [], "model: expected a JSON object"),
])
def test_steplog_fields_are_checked_by_calibrate_and_validate(capsys, tmp_path, where, value, says):
    data = steplog_dict()
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    assert says in one_line_error(capsys, "calibrate", "--from-steplog", path, "--out", tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_latency_table_reader_names_the_file_and_field(tmp_path):
    from sim.errors import CbsimError
    from sim.latency.fit import fit_steplog
    from sim.latency.table_format import METADATA_FILE, TABLE_FILE, read_table, write_table
    from sim.recorded.steplog import read_steplog

    log_path = tmp_path / "run.json"
    log_path.write_text(json.dumps(steplog_dict()))
    folder = write_table(tmp_path / "t", fit_steplog(read_steplog(log_path), heldout_fraction=0.2).table)
    read_table(folder)
    meta = json.loads((folder / METADATA_FILE).read_text())
    for key, value, says in [("grid", {"linear": 5}, "grid must map each component to {dimension: [numbers]}"),
                             ("heldout_error", 0.1, "heldout_error must be a mapping or null"),
                             ("device", 7, "device must be a string")]:
        (folder / METADATA_FILE).write_text(json.dumps({**meta, key: value}))
        with pytest.raises(CbsimError, match=r"metadata\.json: " + __import__("re").escape(says)):
            read_table(folder)
    (folder / METADATA_FILE).write_text(json.dumps(meta))
    (folder / TABLE_FILE).write_bytes(b"component,x,y,seconds\noverhead,,,\x00 1\n")
    with pytest.raises(CbsimError, match=r"table\.csv:2: seconds must be a number, got '\\x00 1'"):
        read_table(folder)
    (folder / TABLE_FILE).write_text("component,x,y,seconds\noverhead,,," + "9" * 200_000 + "\n")
    with pytest.raises(CbsimError, match=r"table\.csv: not a readable CSV file \(field larger than field limit"):
        read_table(folder)
    (folder / TABLE_FILE).write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CbsimError, match=r"table\.csv: not a UTF-8 text file"):
        read_table(folder)


# --- 4. cbsim plot on a damaged results folder -------------------------------------------------
@pytest.mark.parametrize("damage, file, says", [
    ("truncate", "steps.parquet", "steps.parquet is unreadable"),
    ("truncate", "requests.parquet", "requests.parquet is unreadable"),
    ("garbage", "summary.json", "summary.json is unreadable"),
    ("shape", "summary.json", "summary.json: policies: expected a JSON object"),
    ("garbage", "scenario.yaml", "scenario.yaml"),
])
def test_plot_on_a_damaged_results_folder_names_the_file_and_the_rerun(capsys, tmp_path, damage, file, says):
    folder = results_folder(capsys, tmp_path)
    path = folder / file
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xffnot this file\xfe" * 10)
    else:
        path.write_text(json.dumps({"policies": 3}))
    msg = one_line_error(capsys, "plot", folder)
    assert says in msg and "a re-run writes it again: cbsim run" in msg, msg
    if file != "scenario.yaml":  # the re-run the message names writes the folder again
        code, _, err = run_cli(capsys, "run", folder / "scenario.yaml", "--out", folder, "-q", "--no-plots")
        assert code == 0, err
        code, out, err = run_cli(capsys, "plot", folder)
        assert code == 0 and "wrote" in out, err


# --- 5. output paths checked before work starts ------------------------------------------------
def output_commands(tmp_path: Path, s: Path, log: Path, res: Path, bad: Path) -> list[list]:
    return [
        ["run", s, "-q", "--no-plots", "--out", bad],
        ["plot", res, "--out", bad],
        ["calibrate", "--from-steplog", log, "--out", bad],
        ["validate", "--against", log, "--table", tmp_path / "no-table", "--json", bad / "v.json"],
        ["capacity", s, "--json", bad / "c.json"],
        ["plan", s, "--target-rate", "1", "--json", bad / "p.json"],
        ["sweep", s, "--rates", "1,2", "-q", "--out", bad],
    ]


def test_unwritable_output_is_refused_before_any_work(capsys, tmp_path):
    try:
        UNWRITABLE.mkdir()
        UNWRITABLE.rmdir()
        pytest.skip(f"{UNWRITABLE.parent} is writable here")
    except OSError:
        pass
    log = tmp_path / "run.json"
    log.write_text(json.dumps(steplog_dict()))
    res = results_folder(capsys, tmp_path)
    for args in output_commands(tmp_path, scenario_file(tmp_path), log, res, UNWRITABLE):
        with wall_clock_limit(60):
            msg = one_line_error(capsys, *args)
        assert msg.startswith("cannot write ") and str(UNWRITABLE) in msg and "give a path" in msg, (args, msg)


def test_output_of_the_wrong_kind_is_refused_before_any_work(capsys, tmp_path):
    log = tmp_path / "run.json"
    log.write_text(json.dumps(steplog_dict()))
    res = results_folder(capsys, tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    s = scenario_file(tmp_path)
    for args in output_commands(tmp_path, s, log, res, a_file):
        msg = one_line_error(capsys, *args)
        assert msg.startswith("cannot write ") and str(a_file) in msg, (args, msg)
        assert "it is a file; give a folder name (--out DIR)" in msg or f"{a_file} is a file, not a folder" in msg
    for cmd in (["capacity", s], ["plan", s, "--target-rate", "1"], ["validate", "--against", log, "--table", res]):
        msg = one_line_error(capsys, *cmd, "--json", tmp_path)
        assert msg.endswith("it is a folder; give a file name (--json FILE)"), msg


# --- 6. the float clock's resolution ----------------------------------------------------------
def test_an_arrival_rate_the_clock_cannot_resolve_is_an_error(capsys, tmp_path):
    msg = one_line_error(capsys, "run", scenario_file(tmp_path), "-q", "--out", tmp_path / "o",
                         "--set", "workload.arrival.rate=1e-300")
    assert msg.startswith("workload.arrival.rate: the arrivals span") and "raise workload.arrival.rate" in msg


def trace_scenario(tmp_path: Path, arrivals: list[float]) -> Path:
    rows = ["arrival_s,prompt_tokens,output_tokens"] + [f"{t:.0f},20,5" for t in arrivals]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    data = {**BASE, "workload": {"trace": {"path": "t.csv"}, "arrival": {"process": "trace"},
                                 "prompt_tokens": {"dist": "trace"}, "output_tokens": {"dist": "trace"}}}
    return scenario_file(tmp_path, data)


def test_epoch_timestamps_are_rebased_and_latencies_are_not_zero(capsys, tmp_path):
    s = trace_scenario(tmp_path, [1.7e18 + i * 512 for i in range(4)])  # epoch-sized, gaps the clock holds
    code, out, err = run_cli(capsys, "run", s, "-q", "--no-plots", "--out", tmp_path / "o")
    assert code == 0, err
    assert err.strip().startswith("warning: workload.trace.path (t.csv): the arrivals start at 1.7e+18 s")
    assert "re-based them to start at 0" in err
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())["policies"]["vllm-v1"]
    assert summary["ttft_s"]["p50"] > 0 and summary["e2e_s"]["p50"] > summary["ttft_s"]["p50"]
    assert summary["tpot_s"]["p50"] == pytest.approx(0.01)  # one 10 ms step per token


def test_nanoseconds_read_as_seconds_are_an_error_naming_the_trace(capsys, tmp_path):
    s = trace_scenario(tmp_path, [1.7e18 + i * 3.6e12 for i in range(3)])  # an hour apart, in ns
    msg = one_line_error(capsys, "run", s, "-q", "--out", tmp_path / "o")
    assert msg.startswith("workload.trace.path (t.csv): the arrivals span 7.2e+12 s")
    assert "its arrival_s must be seconds" in msg


# --- 7. values never quietly rounded -----------------------------------------------------------
def test_inline_model_without_head_dim_must_divide(capsys, tmp_path):
    model = {"num_layers": 2, "hidden_size": 1000, "num_heads": 3, "intermediate_size": 256, "vocab_size": 1000}
    msg = one_line_error(capsys, "run", scenario_file(tmp_path, {**BASE, "model": model}), "-q",
                         "--out", tmp_path / "o")
    assert msg.startswith(f"{tmp_path / 's.yaml'}: model.head_dim: not given, and hidden_size 1000 is not a "
                          f"multiple of num_heads 3")
    code, _, err = run_cli(capsys, "run", scenario_file(tmp_path, {**BASE, "model": {**model, "head_dim": 333}}),
                           "-q", "--no-plots", "--out", tmp_path / "o")
    assert code == 0, err  # an explicit head_dim is the user's word


# --- 8. errors found before anything runs or is created ------------------------------------------
def test_a_long_scenario_name_fails_before_the_simulation(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    msg = one_line_error(capsys, "run", scenario_file(tmp_path, {**BASE, "name": "n" * 300}), "-q")
    assert "name: must be at most 200 bytes" in msg and "got 300 bytes" in msg
    assert not (tmp_path / "results").exists()


def test_an_unknown_sweep_backend_creates_nothing(capsys, tmp_path):
    out = tmp_path / "sw"
    msg = one_line_error(capsys, "sweep", scenario_file(tmp_path), "--rates", "1,2", "--backend", "dask",
                         "--out", out, "-q")
    assert msg == "unknown --backend 'dask': use local or ray"
    assert not out.exists()


def test_a_failed_save_leaves_no_empty_results_folder(tmp_path):
    from sim.runner import run

    result = run(BASE)
    target = tmp_path / "results" / "deeper" / "x"
    result.scenario = None  # to_yaml fails half-way through the save
    with pytest.raises(AttributeError):
        result.save(target, plots=False)
    assert not (tmp_path / "results").exists()


# --- the fuzz test: every command that reads a user's file --------------------------------------
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                        st.text(max_size=8))
JSON_SHAPES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


def mutate(data, path: list, value):
    """A copy of ``data`` with the node at ``path`` (indices into lists and dicts) replaced."""
    if not path:
        return value
    data = json.loads(json.dumps(data))
    node = data
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return data


def leaf_paths(data, prefix=()) -> list[tuple]:
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in leaf_paths(v, (*prefix, k))] + [prefix]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in leaf_paths(v, (*prefix, i))] + [prefix]
    return [prefix]


def _golden():
    return golden_dict()


def _steplog():
    return steplog_dict()


def _request_run():
    """The step log's one request as a request-level run (sim/recorded/request_run.py)."""
    log = steplog_dict()
    m = log["model"]
    model = {"name": "tiny-run", "num_layers": m["num_hidden_layers"], "hidden_size": m["hidden_size"],
             "num_heads": m["num_attention_heads"], "num_kv_heads": m["num_key_value_heads"],
             "head_dim": m["head_dim"], "intermediate_size": m["intermediate_size"], "vocab_size": m["vocab_size"]}
    times = log["requests"][0]["token_times_s"]
    return {"format": "cbsim-request-run", "format_version": 1, "source": "vLLM on cpu, fp32",
            "engine": {"name": "vllm", "version": "0.32.0"}, "model": model,
            "hardware": {"gpu": "cpu", "tensor_parallel": 1, "gpu_memory_utilization": 0.9},
            "config": {"block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 128,
                       "num_gpu_blocks": 64, "enable_prefix_caching": False},
            "requests": [{"id": "a", "arrival_s": 0.0, "prompt_tokens": 3, "output_tokens": len(times),
                          "first_token_s": times[0], "last_token_s": times[-1], "token_times_s": times}]}


READERS = {  # name -> (the file's base content, how the command is called on a file)
    "conformance": (_golden, lambda f, tmp: ["conformance", f]),
    "calibrate --from-steplog": (_steplog, lambda f, tmp: ["calibrate", "--from-steplog", f, "--out", tmp / "t"]),
    "validate --against": (_steplog, lambda f, tmp: ["validate", "--against", f, "--table", tmp / "table"]),
    "validate --against a request run": (_request_run,
                                         lambda f, tmp: ["validate", "--against", f, "--table", tmp / "table"]),
    "run with a trace": (None, lambda f, tmp: ["run", tmp / "trace.yaml", "-q", "--no-plots", "--out", tmp / "o"]),
    "latency table": (None, lambda f, tmp: ["validate", "--against", tmp / "good.json", "--table", tmp / "ft"]),
    "plot": (None, lambda f, tmp: ["plot", tmp / "res", "--out", tmp / "png"]),
}


@pytest.fixture(scope="module")
def fuzz_home(tmp_path_factory):
    """Good inputs each fuzz case corrupts one file of: a step log and its table, a results folder."""
    from sim.latency.fit import fit_steplog
    from sim.latency.table_format import write_table
    from sim.recorded.steplog import read_steplog
    from sim.runner import run

    home = tmp_path_factory.mktemp("fuzz")
    (home / "good.json").write_text(json.dumps(steplog_dict()))
    write_table(home / "table", fit_steplog(read_steplog(home / "good.json"), heldout_fraction=0.2).table)
    run({**BASE, "workload": {**BASE["workload"], "num_requests": 3}}).save(home / "res", plots=False)
    return home


@examples(ci=20)
@given(reader=st.sampled_from(sorted(READERS)), kind=st.sampled_from(["bytes", "json", "mutated"]),
       raw=st.binary(max_size=200), shape=JSON_SHAPES, pick=st.integers(0, 10**6))
def test_fuzz_every_reader_gives_a_result_or_one_line(fuzz_home, reader, kind, raw, shape, pick):
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(dir=fuzz_home))
    try:
        base, command = READERS[reader]
        content = content_for(reader, kind, raw, shape, pick, base, fuzz_home)
        target = place(reader, tmp, fuzz_home, content, pick)
        code, out, err = _invoke(command(target, tmp))
        assert "Traceback" not in out + err, (reader, kind, err)
        if code != 0:
            lines = err.strip().splitlines()
            assert code in (1, 2), (code, err)
            # conformance exits 1 with its own report when the steps differ
            assert code == 1 and reader == "conformance" or len(lines) == 1 and lines[0].startswith("error: "), err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def content_for(reader, kind, raw, shape, pick, base, home) -> bytes:
    if kind == "bytes":
        return raw
    if kind == "json" or base is None and reader not in ("latency table", "plot"):
        return json.dumps(shape).encode()
    if base is None:  # a table's metadata or a results summary, one node replaced
        good = json.loads(((home / "table" / "metadata.json") if reader == "latency table"
                           else (home / "res" / "summary.json")).read_text())
    else:
        good = base()
    paths = leaf_paths(good)
    return json.dumps(mutate(good, list(paths[pick % len(paths)]), shape)).encode()


def place(reader, tmp: Path, home: Path, content: bytes, pick: int) -> Path:
    """Write the corrupted file where the command reads it; returns the file given on the command line."""
    import shutil

    if reader == "run with a trace":
        (tmp / "t.csv").write_bytes(content)
        data = {**BASE, "workload": {"trace": {"path": str(tmp / "t.csv"), "format": "csv"},
                                     "arrival": {"process": "trace"}, "prompt_tokens": {"dist": "trace"},
                                     "output_tokens": {"dist": "trace"}}}
        (tmp / "trace.yaml").write_text(yaml.safe_dump(data))
        return tmp / "t.csv"
    if reader == "latency table":
        shutil.copytree(home / "table", tmp / "ft")
        name = ("metadata.json", "table.csv")[pick % 2]
        (tmp / "ft" / name).write_bytes(content)
        return tmp / "ft" / name
    if reader == "plot":
        shutil.copytree(home / "res", tmp / "res")
        name = ("summary.json", "requests.parquet", "steps.parquet", "scenario.yaml")[pick % 4]
        (tmp / "res" / name).write_bytes(content)
        return tmp / "res" / name
    if reader.startswith("validate --against"):
        shutil.copytree(home / "table", tmp / "table")
    path = tmp / "in.json"
    path.write_bytes(content)
    return path


def _invoke(args) -> tuple[int, str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["cbsim", *map(str, args)]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), wall_clock_limit(30):
            cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


def test_fuzz_helpers_mutate_one_node():
    good = golden_dict()
    paths = leaf_paths(good)
    assert ("config", "num_blocks") in paths and () in paths
    changed = mutate(good, ["config", "num_blocks"], "x")
    assert changed["config"]["num_blocks"] == "x" and good["config"]["num_blocks"] == 11
