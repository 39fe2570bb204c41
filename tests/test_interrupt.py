"""Ctrl-C during ``cbsim run``: exit code 130, one line on stderr, and nothing half-written.

A subprocess runs the real CLI entry point (``sim.cli.main.main``) through a tiny wrapper that slows
one phase down and drops a marker file when it gets there, so SIGINT lands exactly in that
phase: while simulating, or while the results folder is being written (over nothing, or over
an earlier result that must survive intact). Results are written into a hidden temporary
sibling folder and renamed into place only when complete (sim.results), so afterwards the
target folder is absent (or the earlier result, byte for byte) and no temporary folder is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from sim.cli.main import INTERRUPTED, INTERRUPTED_MESSAGE
from tests.helpers import overload_scenario

REPO = Path(__file__).resolve().parents[1]

SCENARIO = overload_scenario("interrupt-me", num_requests=3000, rate=1000.0, policies=[{"name": "vllm-v1"}],
                             horizon_s=60.0)

WRAPPER = textwrap.dedent('''
    import os, signal, sys, time
    from pathlib import Path

    # Ctrl-C in a terminal: a shell without job control starts background jobs with SIGINT ignored,
    # and a child inherits that; a user's interactive cbsim gets Python's default handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    marker, phase = Path(os.environ["CBSIM_TEST_MARKER"]), os.environ["CBSIM_TEST_PHASE"]
    if phase == "simulate":  # every scheduling step takes a little wall time
        from policies.vllm_v1 import VllmV1Policy
        schedule = VllmV1Policy.schedule
        def slow(self):
            marker.touch()
            time.sleep(0.002)
            return schedule(self)
        VllmV1Policy.schedule = slow
    elif phase == "save":  # the first parquet file is written, then the save stalls
        import pandas as pd
        to_parquet = pd.DataFrame.to_parquet
        def slow(self, *a, **k):
            out = to_parquet(self, *a, **k)
            marker.touch()
            time.sleep(120)
            return out
        pd.DataFrame.to_parquet = slow
    from sim.cli.main import main
    sys.argv = ["cbsim", *sys.argv[1:]]
    main()
''')


def interrupt_run(tmp_path: Path, phase: str, out: Path) -> subprocess.CompletedProcess:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    marker = tmp_path / f"reached-{phase}"
    marker.unlink(missing_ok=True)
    env = {**os.environ, "CBSIM_TEST_MARKER": str(marker), "CBSIM_TEST_PHASE": phase, "COLUMNS": "100"}
    proc = subprocess.Popen([sys.executable, str(wrapper), "run", str(scenario), "--out", str(out), "--no-plots"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None:
            out_, err = proc.communicate()
            pytest.fail(f"the run ended before reaching {phase}: rc {proc.returncode}\n{out_}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never reached {phase}")
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("Ctrl-C did not stop the run within 60 s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _assert_clean_interrupt(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == INTERRUPTED, (done.returncode, done.stderr)
    assert done.stderr == INTERRUPTED_MESSAGE + "\n"  # one line, nothing else
    assert "Traceback" not in done.stdout


def _leftovers(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


@pytest.mark.parametrize("phase", ["simulate", "save"])
def test_ctrl_c_leaves_no_results_and_no_temporary_folder(tmp_path, phase):
    out = tmp_path / "results"
    done = interrupt_run(tmp_path, phase, out)
    _assert_clean_interrupt(done)
    assert not out.exists(), f"half a result was left in {out}"
    assert _leftovers(tmp_path, "results") == []


def test_ctrl_c_while_replacing_keeps_the_earlier_results_intact(tmp_path):
    from sim.runner import run

    out = tmp_path / "results"

    run(SCENARIO, ["horizon_s=2"]).save(out, plots=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    done = interrupt_run(tmp_path, "save", out)
    _assert_clean_interrupt(done)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path, "results") == []


def test_save_puts_the_earlier_results_back_when_interrupted_between_its_renames(tmp_path, monkeypatch):
    """The one window the temporary folder does not cover: the earlier result was moved aside
    and the new one not yet moved in. An interrupt there restores the earlier result."""
    from sim.runner import run

    result = run(SCENARIO, ["horizon_s=1"])
    out = tmp_path / "results"
    result.save(out, plots=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rename = Path.rename

    def interrupted(self, target):
        if self.name.startswith(".results.tmp-"):
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(SCENARIO, ["horizon_s=2"]).save(out, plots=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _leftovers(tmp_path, "results") == []
