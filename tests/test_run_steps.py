"""Engine steps rebuilt from a request-level run (sim/recorded/run_steps.py), checked on a run whose
steps are known: a tiny first-come first-served engine below serves requests (whole prefills, one
decode token per running request per step, a fixed gap between steps) and writes what a streaming
client and vLLM's iteration log would have seen."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from sim.recorded.run_readers import read_run
from sim.recorded.run_steps import fit_run, steps_from_iteration_log, steps_from_token_times
from sim.recorded.vllm_iteration_log import parse_iteration_log

GAP = 0.001
T0 = dt.datetime(2026, 3, 4, 10, 0, 0).timestamp()  # the run's wall-clock start (local time)


def step_time(batch) -> float:
    return 0.004 + 2e-5 * sum(n for _, n, _ in batch)


def serve(requests):
    """(steps as (start, end, batch), token times per request)."""
    waiting = sorted(requests, key=lambda r: r[1])  # (id, arrival, prompt, output)
    running: dict[str, list] = {}
    times = {r[0]: [] for r in requests}
    steps = []
    t = 0.0
    while waiting or running:
        if not running and waiting and waiting[0][1] > t:
            t = waiting[0][1]
        batch = []
        for rid, (prompt, done, _) in running.items():
            batch.append((rid, 1, prompt + done - 1))
        while waiting and waiting[0][1] <= t:
            rid, _, prompt, out = waiting.pop(0)
            running[rid] = [prompt, 0, out]
            batch.append((rid, prompt, 0))
        end = t + step_time(batch)
        for pos, (rid, _, _) in enumerate(batch):  # the client sees the step's end, some streams a little late
            running[rid][1] += 1
            times[rid].append(end + 1e-5 * (pos % 3))
        for rid in [rid for rid, (p, done, out) in running.items() if done == out]:
            del running[rid]
        steps.append((t, end, tuple(batch)))
        t = end + GAP
    return steps, times


REQUESTS = [(f"r{i}", a, p, o) for i, (a, p, o) in enumerate([
    (0.0, 40, 6), (0.013, 60, 5), (0.031, 30, 7), (0.2, 50, 4), (0.21, 20, 9), (0.215, 70, 3),
    (0.5, 33, 8), (0.52, 44, 6), (0.9, 25, 5), (0.905, 35, 7), (0.91, 45, 6), (1.4, 64, 9)])]


def write_run(tmp_path):
    steps, times = serve(REQUESTS)
    doc = {"format": "cbsim-request-run", "format_version": 1, "source": "a synthetic engine", "model": "tiny",
           "hardware": {"gpu": "cpu"},
           "config": {"block_size": 16, "num_gpu_blocks": 100, "max_num_seqs": 8, "max_num_batched_tokens": 256,
                      "max_model_len": 512},
           "requests": [{"id": rid, "arrival_s": a, "prompt_tokens": p, "output_tokens": o, "max_tokens": o,
                         "token_times_s": times[rid]} for rid, a, p, o in REQUESTS],
           "observe": {"wall_clock_start_unix_s": T0}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    log = tmp_path / "server.log"
    lines = ["INFO 03-04 09:59:58 [loggers.py:199] Engine 000: Iteration(0): 1 context requests, 4 context tokens, "
             "0 generation requests, 0 generation tokens, iteration elapsed time: 3.00 ms, CPU KV cache usage: 0.0%"]
    for i, (start, end, batch) in enumerate(steps, start=1):
        stamp = dt.datetime.fromtimestamp(T0 + end).strftime("%m-%d %H:%M:%S")
        ctx = [n for _, n, c in batch if c == 0]
        gen = [n for _, n, c in batch if c > 0]
        lines.append(f"(APIServer pid=1) INFO {stamp} [loggers.py:199] Engine 000: Iteration({i}): {len(ctx)} "
                     f"context requests, {sum(ctx)} context tokens, {len(gen)} generation requests, {sum(gen)} "
                     f"generation tokens, iteration elapsed time: {(end - start) * 1e3:.2f} ms, CPU KV cache "
                     f"usage: 1.0%")
    log.write_text("\n".join(lines) + "\n")
    return path, log, steps


def test_token_times_show_every_step_and_its_batch(tmp_path):
    path, _, truth = write_run(tmp_path)
    log = steps_from_token_times(read_run(path))
    assert len(log.steps) == len(truth)
    for got, (_start, end, batch) in zip(log.steps, truth):
        assert sorted(got.batch) == sorted(batch)
        assert got.end_s == pytest.approx(end)
    # a step right after another starts at the previous end (the gap is inside its time); after idle, at
    # the arrival of its newest prefill
    assert log.steps[1].start_s == pytest.approx(truth[0][1])
    idle = next(i for i in range(1, len(truth)) if truth[i][0] > truth[i - 1][1] + 2 * GAP)
    assert log.steps[idle].start_s == pytest.approx(truth[idle][0])


def test_the_iteration_log_gives_every_steps_batch(tmp_path):
    path, logfile, truth = write_run(tmp_path)
    iterations = parse_iteration_log(logfile.read_text(), year=2026)
    assert len(iterations) == len(truth) + 1  # the first line (a probe before the run) is not the run's
    log = steps_from_iteration_log(read_run(path), iterations, T0)
    assert len(log.steps) == len(truth)
    stretch_ratio = None
    for i, (got, (start, end, batch)) in enumerate(zip(log.steps, truth)):
        assert sorted(got.batch) == sorted(batch)
        busy = i > 0 and start == pytest.approx(truth[i - 1][1] + GAP)
        if not busy:  # a stretch begins: at the engine's start of it
            assert got.start_s == pytest.approx(start, abs=1e-5)
            stretch_ratio = None
        else:  # steps follow each other, each its model time scaled by the stretch's (the gaps inside)
            assert got.start_s == pytest.approx(log.steps[i - 1].end_s)
        if busy:
            ratio = got.duration_s / (end - start)
            stretch_ratio = stretch_ratio or ratio
            assert ratio == pytest.approx(stretch_ratio, rel=1e-3) and 1 <= ratio < 1 + GAP / 0.004
        else:  # the first step of a stretch: from its request's arrival to its first token
            assert got.end_s == pytest.approx(end, abs=1e-5)
        if i + 1 == len(truth) or truth[i + 1][0] > end + 1.5 * GAP:  # a stretch ends with the client's time
            assert got.end_s == pytest.approx(end, abs=1e-5)
    result, _ = fit_run(path, logfile)
    assert result.step_gap_s == pytest.approx(0.0, abs=1e-4)  # the gaps are inside the steps
    assert result.table.metadata["fit"]["steps_from"].startswith("vLLM iteration log")


def test_a_log_of_another_run_is_refused(tmp_path):
    path, logfile, _ = write_run(tmp_path)
    other = logfile.read_text().replace(" 1 generation requests, 1 generation tokens",
                                        " 2 generation requests, 2 generation tokens")
    from sim.errors import CbsimError

    with pytest.raises(CbsimError, match="no run of consecutive iterations in the log adds up"):
        steps_from_iteration_log(read_run(path), parse_iteration_log(other, year=2026), T0)
