"""vllm-v1 against vLLM 0.32's own scheduler: every step of every golden log must match."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sim.errors import CbsimError
from sim.recorded.conformance import check_log, load_golden, replay

GOLDEN = {  # file -> steps (reference/oracle/README.md)
    "v1_ample.json": 74,
    "v1_pressure.json": 618,
    "v1_threshold.json": 319,
    "v1_prefix.json": 160,
    "v1_priority.json": 341,
    "v1_edges.json": 1795,
}


@pytest.mark.shared
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_log_matches_every_step(shared_ref, name):
    result = check_log(shared_ref / "oracle" / name)
    assert result.divergence is None, result.divergence.describe()
    assert result.matched == result.total == GOLDEN[name]
    assert result.ok and result.summary() == f"{name[:-5]}: matched {GOLDEN[name]}/{GOLDEN[name]} steps"


@pytest.mark.shared
def test_every_log_in_the_oracle_folder_is_covered(shared_ref):
    assert sorted(p.name for p in (shared_ref / "oracle").glob("*.json")) == sorted(GOLDEN)


def _mutated(shared_ref, tmp_path, name, index, change):
    data = json.loads((shared_ref / "oracle" / name).read_text())
    change(data["steps"][index])
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.shared
def test_a_changed_decision_is_reported_at_its_step(shared_ref, tmp_path):
    def swap_order(step):
        step["scheduled"] = dict(reversed(list(step["scheduled"].items())))

    path = _mutated(shared_ref, tmp_path, "v1_pressure.json", 100, swap_order)
    result = check_log(path)
    assert not result.ok and result.matched == 100
    div = result.divergence
    assert div.index == 100 and div.fields == ["scheduled"]
    assert div.step == result.ours[100].step
    text = div.describe()
    assert text.startswith(f"step {div.step}: differs in scheduled") and "vLLM: scheduled={r0012: 1" in text


@pytest.mark.shared
def test_a_missing_final_step_is_a_divergence(shared_ref, tmp_path):
    data = json.loads((shared_ref / "oracle" / "v1_ample.json").read_text())
    data["steps"].pop()
    path = tmp_path / "short.json"
    path.write_text(json.dumps(data))
    result = check_log(path)
    assert result.matched == 73 and result.total == 73 and not result.ok
    assert "vLLM had finished every request" in result.divergence.describe()


@pytest.mark.shared
def test_replay_is_deterministic(shared_ref):
    log = load_golden(shared_ref / "oracle" / "v1_edges.json")
    assert replay(log) == replay(log)


def test_bad_files_name_the_problem(tmp_path):
    with pytest.raises(CbsimError, match="no such file"):
        load_golden(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(CbsimError, match="not valid JSON"):
        load_golden(bad)
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"config": {"num_blocks": 10, "watermak": 0.1}, "requests": [], "steps": []}))
    with pytest.raises(CbsimError, match="did you mean 'watermark'"):
        load_golden(typo)


def _cli(*args):
    from sim.cli.main import app

    return CliRunner().invoke(app, ["conformance", *map(str, args)])


@pytest.mark.shared
def test_cli_prints_each_file_and_exits_zero_when_all_match(shared_ref):
    files = sorted((shared_ref / "oracle").glob("*.json"))
    res = _cli(*files)
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines == [f"{p.stem}: matched {GOLDEN[p.name]}/{GOLDEN[p.name]} steps" for p in files]


@pytest.mark.shared
def test_cli_exits_one_and_shows_both_decisions_at_the_first_divergence(shared_ref, tmp_path):
    def drop_block(step):
        step["free_blocks"] += 1

    path = _mutated(shared_ref, tmp_path, "v1_prefix.json", 40, drop_block)
    good = shared_ref / "oracle" / "v1_ample.json"
    res = _cli(good, path)
    assert res.exit_code == 1
    out = res.output.splitlines()
    assert out[0] == "v1_ample: matched 74/74 steps"
    assert out[1] == "v1_prefix: matched 40/160 steps"
    assert out[2].startswith("step ") and out[2].endswith("differs in free_blocks")
    assert out[3].startswith("  vLLM: free_blocks=") and out[4].startswith("  ours: free_blocks=")


def test_cli_unreadable_file_exits_two_with_one_line(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from sim.cli.main import main; main()",
            "conformance",
            str(tmp_path / "nope.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no such file" in proc.stderr and "Traceback" not in proc.stderr
