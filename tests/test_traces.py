"""Trace readers: the three formats on small files written here (good and malformed, with line
numbers), and the real traces of ../shared/reference/traces/."""

from __future__ import annotations

import pytest

from policies.base import Request
from sim.errors import TraceError
from sim.workload.traces import _load_cached, detect_format, load_trace, read_trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,879,31
"""


def write(tmp_path, name: str, text: str):
    f = tmp_path / name
    f.write_text(text)
    return f


def _error(path, fmt=None, **kw) -> str:
    with pytest.raises(TraceError) as info:
        read_trace(path, fmt, **kw)
    return str(info.value)


# --- Azure ---------------------------------------------------------------------------------------
def test_azure_rows_become_requests(tmp_path):
    specs = read_trace(write(tmp_path, "a.csv", AZURE), "azure")
    assert [s.id for s in specs] == ["r000000", "r000001", "r000002"]
    assert [s.arrival_s for s in specs] == pytest.approx([0.0, 4.314579, 4.31941], abs=1e-9)
    # no client limit in the trace: max_tokens is vLLM's fill-in, max_model_len (8192 here) - prompt
    assert [(s.prompt_tokens, s.output_tokens, s.max_tokens) for s in specs] == [
        (374, 44, 8192 - 374), (396, 109, 8192 - 396), (879, 31, 8192 - 879)]
    # content of its own: left to Request's default run ("req", id), not stored per request
    assert specs[0].prompt_runs is None
    assert Request(specs[0].id, 0.0, 374, 44).prompt_runs == ((("req", "r000000"), 374),)


def test_unsorted_rows_are_sorted_by_arrival(tmp_path):
    lines = AZURE.splitlines()
    f = write(tmp_path, "u.csv", "\n".join([lines[0], lines[2], lines[1], lines[3]]) + "\n")
    specs = read_trace(f)
    assert [s.prompt_tokens for s in specs] == [374, 396, 879] and specs[0].arrival_s == 0.0


def test_azure_malformed_rows_name_file_and_line(tmp_path):
    bad_stamp = AZURE.replace("2023-11-16 18:15:50.9951690", "yesterday")
    f = write(tmp_path, "b1.csv", bad_stamp)
    assert _error(f, "azure") == (f"{f}:3: expected TIMESTAMP like '2023-11-16 18:15:46.6805900', got 'yesterday'")
    f = write(tmp_path, "b2.csv", AZURE.replace(",879,", ",lots,"))
    assert _error(f, "azure") == f"{f}:4: expected ContextTokens to be an integer >= 1, got 'lots'"
    f = write(tmp_path, "b3.csv", AZURE.replace(",109", ",0"))
    assert _error(f, "azure") == f"{f}:3: expected GeneratedTokens to be an integer >= 1, got 0"
    f = write(tmp_path, "b4.csv", AZURE.replace(",396,109", ",396"))
    assert _error(f, "azure").startswith(f"{f}:3: expected 3 comma-separated fields, got 2")
    f = write(tmp_path, "b5.csv", AZURE.replace("ContextTokens", "Context"))
    assert _error(f, "azure").startswith(f"{f}:1: expected a header with columns TIMESTAMP,ContextTokens,GeneratedTokens")


# --- Mooncake ------------------------------------------------------------------------------------
MOONCAKE = """{"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}
{"timestamp": 250, "input_length": 600, "output_length": 3, "hash_ids": [0, 5]}

{"timestamp": 1500, "input_length": 512, "output_length": 1, "hash_ids": [9]}
"""


def test_mooncake_hash_ids_become_prompt_runs(tmp_path):
    specs = read_trace(write(tmp_path, "m.jsonl", MOONCAKE))
    assert [s.arrival_s for s in specs] == [0.0, 0.25, 1.5]
    assert [(s.prompt_tokens, s.output_tokens, s.max_tokens) for s in specs] == [
        (1100, 7, 8192 - 1100), (600, 3, 8192 - 600), (512, 1, 8192 - 512)]
    assert specs[0].prompt_runs == ((("mc", 0), 512), (("mc", 1), 512), (("mc", 2), 76))
    assert specs[1].prompt_runs == ((("mc", 0), 512), (("mc", 5), 88))
    assert specs[2].prompt_runs == ((("mc", 9), 512),)


def _tokens(runs):
    return [(key, i) for key, n in runs for i in range(n)]


@pytest.mark.parametrize("block_size", [16, 32, 128, 512])
def test_equal_hash_ids_give_equal_blocks_at_any_block_size(tmp_path, block_size):
    a, b, _ = read_trace(write(tmp_path, "m.jsonl", MOONCAKE))
    ta, tb = _tokens(a.prompt_runs), _tokens(b.prompt_runs)
    # a block's identity is its tokens and everything before it, so compare prefixes block by block
    shared = [ta[: (i + 1) * block_size] == tb[: (i + 1) * block_size] for i in range(len(tb) // block_size)]
    assert shared == [(i + 1) * block_size <= 512 for i in range(len(tb) // block_size)]


def test_mooncake_malformed_lines(tmp_path):
    f = write(tmp_path, "m1.jsonl", MOONCAKE.replace('"hash_ids": [0, 5]', '"hash_ids": [0]'))
    assert _error(f) == (f"{f}:2: expected hash_ids to be a list of 2 ids (one per 512-token block of "
                         f"input_length 600), got 1 ids")
    f = write(tmp_path, "m2.jsonl", MOONCAKE.replace('"timestamp": 1500,', '"timestamp": 1500'))
    assert _error(f, "mooncake").startswith(f"{f}:4: expected one JSON object per line")
    f = write(tmp_path, "m3.jsonl", MOONCAKE.replace('"output_length": 3, ', ""))
    assert _error(f).startswith(f"{f}:2: missing key(s) output_length")
    f = write(tmp_path, "m4.jsonl", MOONCAKE.replace('"input_length": 1100', '"input_length": "1100"'))
    assert _error(f) == f"{f}:1: expected input_length to be an integer >= 1, got '1100'"
    f = write(tmp_path, "m5.jsonl", MOONCAKE.replace('"timestamp": 250', '"timestamp": -1'))
    assert _error(f) == f"{f}:2: expected timestamp to be milliseconds >= 0, got -1"


# --- plain CSV -----------------------------------------------------------------------------------
def test_plain_csv_with_optional_columns(tmp_path):
    f = write(tmp_path, "p.csv", "arrival_s,prompt_tokens,output_tokens,max_tokens,priority\n"
                                 "0.5,10,3,8,1\n0,20,4,4,-2\n")
    specs = read_trace(f)
    assert [(s.arrival_s, s.prompt_tokens, s.output_tokens, s.max_tokens, s.priority) for s in specs] == [
        (0.0, 20, 4, 4, -2), (0.5, 10, 3, 8, 1)]
    f = write(tmp_path, "q.csv", "prompt_tokens,output_tokens,arrival_s\n10,3,1.5\n")
    assert [(s.arrival_s, s.prompt_tokens, s.max_tokens) for s in read_trace(f, "csv", max_model_len=100)] == [
        (1.5, 10, 90)]


def test_plain_csv_malformed(tmp_path):
    f = write(tmp_path, "p1.csv", "arrival_s,prompt_tokens,output_tokens,max_tokens\n0,10,3,8\n1,10,3,2\n")
    assert _error(f) == f"{f}:3: expected max_tokens >= output_tokens (3), got 2"
    f = write(tmp_path, "p2.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,3\nsoon,10,3\n")
    assert _error(f) == f"{f}:3: expected arrival_s to be seconds >= 0, got 'soon'"
    f = write(tmp_path, "p3.csv", "arrival_s,prompt_tokens,output_tokens,colour\n0,10,3,red\n")
    assert _error(f) == f"{f}:1: unknown column 'colour'; columns are arrival_s, prompt_tokens, output_tokens, max_tokens, priority, session_id, turn"
    f = write(tmp_path, "p4.csv", "arrival_s,prompt_tokens\n0,10\n")
    assert "missing output_tokens" in _error(f)


# --- files, windows, scaling ---------------------------------------------------------------------
def test_missing_and_empty_files(tmp_path):
    assert _error(tmp_path / "nope.csv") == f"trace file {str(tmp_path / 'nope.csv')!r} does not exist"
    assert "is not a file" in _error(tmp_path)
    empty = write(tmp_path, "e.csv", "")
    assert _error(empty) == f"{empty}: the trace is empty (line 1 is blank); expected a header or a JSON object"
    assert _error(empty, "azure").startswith(f"{empty}: the trace is empty; expected a header line")
    assert _error(empty, "mooncake") == f"{empty}: the trace has no requests"
    header_only = write(tmp_path, "h.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert _error(header_only) == f"{header_only}: the trace has no requests"


def test_window_then_rate_scale(tmp_path):
    f = write(tmp_path, "w.csv", "arrival_s,prompt_tokens,output_tokens\n" +
              "".join(f"{t},{t + 1},1\n" for t in range(10)))
    specs = read_trace(f, window_s=(2.5, 6), rate_scale=2.0)
    assert [(s.arrival_s, s.prompt_tokens) for s in specs] == [(0.25, 4), (0.75, 5), (1.25, 6)]
    assert [s.id for s in specs] == ["r000000", "r000001", "r000002"]
    assert [s.arrival_s for s in read_trace(f, window_s=(8, 100))] == [0.0, 1.0]
    assert _error(f, window_s=(20, 30)) == f"{f}: window_s [20, 30) selects no request (the trace's arrivals span 0.000 to 9.000 s)"
    assert "rate_scale must be > 0" in _error(f, rate_scale=0)


def test_format_detection(tmp_path):
    assert detect_format(write(tmp_path, "a", AZURE)) == "azure"
    assert detect_format(write(tmp_path, "m", MOONCAKE)) == "mooncake"
    assert detect_format(write(tmp_path, "c", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n")) == "csv"


def test_parsed_files_are_cached_until_they_change(tmp_path):
    f = write(tmp_path, "c.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n")
    assert load_trace(f) is load_trace(f)
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,2,2\n")
    assert len(load_trace(f)) == 2


# --- the real traces -----------------------------------------------------------------------------
@pytest.mark.shared
def test_reference_traces(shared_ref):
    traces = shared_ref / "traces"
    _load_cached.cache_clear()
    conv = load_trace(traces / "AzureLLMInferenceTrace_conv.csv")  # its parse speed: bench/sim_speed.py
    assert conv.format == "azure" and len(conv) == 19_366
    # README statistics: prompt mean 1155, output mean 211, one hour at 5.5 req/s
    assert conv.prompt_tokens.mean() == pytest.approx(1155, abs=1)
    assert conv.output_tokens.mean() == pytest.approx(211, abs=1)
    assert conv.arrival_s[0] == 0.0 and conv.arrival_s[-1] == pytest.approx(3501.72, abs=0.01)
    code = load_trace(traces / "AzureLLMInferenceTrace_code.csv")
    assert len(code) == 8_819 and code.prompt_tokens.mean() == pytest.approx(2048, abs=1)
    mc = load_trace(traces / "mooncake_conversation_trace.jsonl")
    assert mc.format == "mooncake" and len(mc) == 12_031
    assert all(sum(n for _, n in runs) == p for runs, p in zip(mc.prompt_runs, mc.prompt_tokens.tolist()))
    first_ids = [runs[0][0] for runs in mc.prompt_runs]
    assert first_ids.count(("mc", 0)) > 100, "the Mooncake trace shares a common first block"
    specs = read_trace(traces / "AzureLLMInferenceTrace_conv.csv", window_s=(600, 1200))
    assert all(0 <= s.arrival_s < 600 for s in specs) and 0 < len(specs) < 19_366
