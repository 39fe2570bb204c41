"""Fuzz tests: mutated scenarios and trace files end in a result or a clean CbsimError, fast.

Users hand cbsim YAML they wrote themselves and traces exported from other tools. The promise
(issue 11) is that any input gets either a result or one clear :class:`sim.errors.CbsimError`,
never another exception (a traceback in the CLI) and never a hang. Hypothesis mutates:

* every shipped scenario (``scenarios/*.yaml``), structurally (a value replaced by an odd one:
  zero, negative, huge, infinite, NaN, text, null, a list, a mapping; a key deleted, misspelt
  or added; a list entry duplicated) and textually (bytes deleted, inserted, lines swapped);
* trace files in all three formats (azure, mooncake, csv), generated valid and then corrupted
  byte by byte and line by line.

Each case runs the whole pipeline a run would: load and validate the scenario, build the
workload, size the KV pool, build the latency model and every policy, and simulate the first
requests (a bounded horizon keeps each case short). A wall-clock alarm fails any case that does
not end in time. Budget: tests/fuzz_profiles.py.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from sim.errors import CbsimError
from sim.runner import run_policy
from sim.scenario.resolved import resolve
from sim.scenario.schema import load_scenario
from sim.workload.synthetic import build_workload
from sim.workload.traces import load_trace
from tests.fuzz_profiles import examples
from tests.helpers import wall_clock_limit

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))
CASE_LIMIT_S = 30  # one case; what the pipeline below needs is well under a second
SIM_REQUESTS = 12  # simulate only the first requests of a mutated workload
SIM_HORIZON_S = 120.0  # ... and at most this much simulated time past the last of them

ODD_VALUES = [0, -1, 1, 3, 17, 2**31, 2**63, 10**30, 0.5, -0.5, 1e-300, 1e308, math.inf, -math.inf,
              math.nan, "", "abc", "16", "1e3", None, True, False, [], {}, [1, 2], {"a": 1},
              "llama-3-8b", "h100", "vllm-v1", "vllm_v1", "trace", "poisson", "roofline", "table",
              "lognormal", "swap"]

_counter = itertools.count()


def test_fuzz_has_shipped_scenarios_to_mutate():
    assert len(SCENARIOS) >= 3, SCENARIOS


def pipeline(source) -> str:
    """Everything ``cbsim run`` does before writing files, on a bounded slice of the workload.
    Returns "ok" or "error: ..." (a CbsimError); any other exception propagates (a failure)."""
    try:
        scn = load_scenario(source)
        specs = build_workload(scn)
        dep = resolve(scn)
        head = specs[:SIM_REQUESTS]
        last = max((s.arrival_s for s in head if s.arrival_s == s.arrival_s), default=0.0)  # closed loop: NaN
        end = last + SIM_HORIZON_S
        scn.horizon_s = min(scn.horizon_s or end, end)
        for entry in scn.policies:
            requests, _, summary, _ = run_policy(dep, entry, head)
            assert summary["requests_total"] == len(head)
            assert summary["requests_finished"] + summary["requests_rejected"] + summary["requests_unfinished"] \
                == len(head)
    except CbsimError as exc:
        message = str(exc)
        assert message and "\n" not in message.strip(), f"not one line: {message!r}"
        assert "Traceback" not in message
        return f"error: {message}"
    return "ok"


# --- structural mutations of the shipped scenarios -----------------------------------------
def _paths(node, prefix=()):
    """Every (path, value) in a nested mapping/list, the root included."""
    yield prefix, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _parent(data, path):
    node = data
    for p in path[:-1]:
        node = node[p]
    return node


def _typo(word: str, i: int) -> str:
    if not word:
        return "x"
    i %= len(word)
    return word[:i] + word[i + 1:] if len(word) > 3 else word + "s"


@st.composite
def mutated_scenario(draw):
    path = draw(st.sampled_from(SCENARIOS), label="scenario")
    data = yaml.safe_load(path.read_text())
    for _ in range(draw(st.integers(1, 3), label="mutations")):
        paths = [p for p, _ in _paths(data) if p]
        target = draw(st.sampled_from(paths), label="path")
        parent, key = _parent(data, target), target[-1]
        action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "typo", "add", "dup"]),
                      label="action")
        if action == "replace":
            parent[key] = copy.deepcopy(draw(st.sampled_from(ODD_VALUES), label="value"))
        elif action == "delete":
            del parent[key]
        elif action == "typo" and isinstance(parent, dict) and isinstance(key, str):
            parent[_typo(key, draw(st.integers(0, 20)))] = parent.pop(key)
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "rate", "name", "value", "block_size", "policy"]))] = \
                copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
        elif action == "dup" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
    return data


@examples(ci=120)
@given(data=mutated_scenario())
def test_fuzz_mutated_scenarios_end_in_a_result_or_a_clean_error(data):
    with wall_clock_limit(CASE_LIMIT_S):
        event(pipeline(data)[:5])


@examples(ci=60)
@given(scenario=st.sampled_from(SCENARIOS), data=st.data())
def test_fuzz_corrupted_scenario_text_ends_in_a_result_or_a_clean_error(scenario, data, tmp_path_factory):
    text = scenario.read_text()
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        text = _corrupt_text(text, data, alphabet=":{}[],-#&*!|>'\"\t\n .0123456789ex")
    path = tmp_path_factory.mktemp("fuzz") / f"s{next(_counter)}.yaml"
    path.write_text(text)
    with wall_clock_limit(CASE_LIMIT_S):
        event(pipeline(path)[:5])


def _corrupt_text(text: str, data, alphabet: str) -> str:
    lines = text.split("\n")
    how = data.draw(st.sampled_from(["cut", "insert", "huge_number", "swap_lines", "dup_line", "drop_line"]),
                    label="edit")
    if how == "huge_number":  # past int64, past a float, past Python's int-parsing limit
        i = data.draw(st.integers(0, len(text)))
        return text[:i] + "9" * data.draw(st.sampled_from([19, 400, 5000])) + text[i:]
    if how == "cut" and text:
        i = data.draw(st.integers(0, len(text) - 1))
        return text[:i] + text[i + data.draw(st.integers(1, 12)):]
    if how == "insert":
        i = data.draw(st.integers(0, len(text)))
        return text[:i] + data.draw(st.text(alphabet=alphabet, min_size=1, max_size=6)) + text[i:]
    if how in ("swap_lines", "dup_line", "drop_line") and len(lines) > 1:
        i = data.draw(st.integers(0, len(lines) - 1))
        j = data.draw(st.integers(0, len(lines) - 1))
        if how == "swap_lines":
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "dup_line":
            lines.insert(j, lines[i])
        else:
            del lines[i]
    return "\n".join(lines)


# --- traces --------------------------------------------------------------------------------
@st.composite
def trace_rows(draw):
    n = draw(st.integers(1, 8))
    t = 0.0
    rows = []
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.25, 1.0, 7.5]))
        rows.append((t, draw(st.integers(1, 2000)), draw(st.integers(1, 300))))
    return rows


def write_trace(fmt: str, rows, path: Path) -> None:
    if fmt == "azure":
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
        for t, p, o in rows:
            sec = 46 + t
            lines.append(f"2023-11-16 18:{15 + int(sec // 60):02d}:{sec % 60:010.7f},{p},{o}")
    elif fmt == "mooncake":
        lines = [json.dumps({"timestamp": int(t * 1000), "input_length": p, "output_length": o,
                             "hash_ids": list(range(-(-p // 512)))}) for t, p, o in rows]
    else:
        lines = ["arrival_s,prompt_tokens,output_tokens,max_tokens"]
        lines += [f"{t},{p},{o},{o + 5}" for t, p, o in rows]
    path.write_text("\n".join(lines) + "\n")


def test_fuzz_generated_traces_are_valid_before_mutation(tmp_path):
    rows = [(0.0, 600, 20), (1.0, 10, 5)]
    for fmt in ("azure", "mooncake", "csv"):
        path = tmp_path / f"t.{fmt}"
        write_trace(fmt, rows, path)
        trace = load_trace(path)
        assert trace.format == fmt
        assert trace.prompt_tokens.tolist() == [600, 10] and trace.arrival_s.tolist() == [0.0, 1.0]


TRACE_ALPHABET = ",\n\r\"'{}[]:.-+eE0123456789 \tTIMESTAMP\x00\ufeffé"


@pytest.mark.parametrize("fmt", ["azure", "mooncake", "csv"])
@examples(ci=70)
@given(rows=trace_rows(), data=st.data())
def test_fuzz_corrupted_traces_end_in_a_result_or_a_clean_error(fmt, rows, data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("trace")
    path = folder / f"t{next(_counter)}.trace"
    write_trace(fmt, rows, path)
    text = path.read_text()
    for _ in range(data.draw(st.integers(0, 3), label="edits")):
        text = _corrupt_text(text, data, TRACE_ALPHABET)
    raw = text.encode("utf-8")
    if data.draw(st.booleans(), label="raw byte"):
        i = data.draw(st.integers(0, len(raw)))
        raw = raw[:i] + bytes([data.draw(st.integers(0, 255))]) + raw[i:]
    path.write_bytes(raw)
    given_format = data.draw(st.sampled_from([None, fmt]), label="format")
    window = data.draw(st.sampled_from([None, [0.0, 5.0], [100.0, 200.0]]), label="window")
    scenario = {
        "name": "fuzz-trace", "model": "tiny", "hardware": {"gpu": "cpu"},
        "latency": {"backend": "constant", "step_s": 0.01},
        "workload": {"trace": {"path": str(path), "format": given_format, "window_s": window}},
        "engine": {"num_gpu_blocks": 256, "max_model_len": 4096, "max_num_batched_tokens": 4096},
        "policies": [{"name": "vllm-v1"}, {"name": "orca"}],
    }
    with wall_clock_limit(CASE_LIMIT_S):
        try:
            trace = load_trace(path, given_format)
            specs = trace.to_specs(4096)
            assert len(specs) == len(trace) >= 1
            assert all(s.prompt_tokens >= 1 and s.output_tokens >= 1 and s.arrival_s >= 0 for s in specs)
            assert [s.arrival_s for s in specs] == sorted(s.arrival_s for s in specs)
        except CbsimError as exc:
            assert str(exc) and "\n" not in str(exc).strip()
        event(pipeline(scenario)[:5])
