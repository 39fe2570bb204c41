"""``cbsim observe`` against a small local fake server (tests/fake_openai_server.py, 127.0.0.1 only):
every request measured with the workload's lengths, the server's facts in the run, and a clear
line, a run file with what was measured and a non-zero exit when the server refuses requests,
dies mid-run or never answers. Also the pure parts: Prometheus parsing, prompts, steps rebuilt
from token times and from vLLM's iteration log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("aiohttp")

from sim.observe.prompts import text_of_words, token_id_prompt, token_range  # noqa: E402
from sim.observe.server_facts import parse_prometheus, vllm_metrics_facts  # noqa: E402
from sim.recorded.run_readers import read_run  # noqa: E402
from sim.workload.request_spec import RequestSpec  # noqa: E402
from tests.fake_openai_server import BLOCK_SIZE, MAX_MODEL_LEN, NUM_GPU_BLOCKS, FakeServer  # noqa: E402
from tests.helpers import run_cli

SCENARIO = {
    "name": "observe-test",
    "seed": 5,
    "model": "tiny",
    "hardware": {"gpu": "cpu"},
    "engine": {"block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 256, "max_model_len": 512},
    "workload": {"num_requests": 12, "arrival": {"process": "poisson", "rate": 80.0},
                 "prompt_tokens": {"dist": "uniform", "min": 8, "max": 40},
                 "output_tokens": {"dist": "uniform", "min": 3, "max": 8}},
}


@pytest.fixture
def scenario(tmp_path) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(SCENARIO))
    return p


def workload():
    from sim.scenario.schema import load_scenario
    from sim.workload.synthetic import build_workload

    return build_workload(load_scenario(SCENARIO))


def test_every_request_is_measured_with_the_workloads_lengths(capsys, tmp_path, scenario):
    run = tmp_path / "run.json"
    with FakeServer() as server:
        code, out, err = run_cli(capsys, "observe", scenario, "--url", server.url + "/v1", "--out", run, "-q")
        bodies = server.bodies
    assert code == 0, err
    assert "12 of 12 requests measured (token-ids prompts)" in out
    specs = workload()
    doc = json.loads(run.read_text())
    assert doc["complete"] is True and doc["unmeasured_requests"] == []
    by_id = {b_id: b for b_id, b in zip([s.id for s in specs], sorted(bodies, key=lambda b: b["prompt"][:3]))}
    assert len(bodies) == 12 and by_id
    # the bodies: token-id prompts of exactly the workload's lengths, max/min tokens = output, ignore_eos
    lengths = sorted((len(b["prompt"]), b["max_tokens"]) for b in bodies)
    assert lengths == sorted((s.prompt_tokens, s.output_tokens) for s in specs)
    assert all(b["min_tokens"] == b["max_tokens"] and b["ignore_eos"] and b["stream"] for b in bodies)
    assert all(b["stream_options"]["continuous_usage_stats"] for b in bodies)
    for spec, r in zip(specs, doc["requests"]):
        assert r["id"] == spec.id and r["scheduled_s"] == pytest.approx(spec.arrival_s)
        assert r["output_tokens"] == len(r["token_times_s"]) == r["max_tokens"] == spec.output_tokens
        assert r["usage"] == {"prompt_tokens": spec.prompt_tokens, "completion_tokens": spec.output_tokens}
        assert r["arrival_s"] >= spec.arrival_s  # sent no earlier than due
        assert r["arrival_s"] <= r["first_token_s"] <= r["last_token_s"]
    lag = doc["observe"]["send_lag_s"]
    assert lag["n"] == 12 and 0 <= lag["mean"] <= lag["max"]
    # what the server said about itself, usable blocks without vLLM's null block
    assert doc["config"]["block_size"] == BLOCK_SIZE and doc["config"]["num_gpu_blocks"] == NUM_GPU_BLOCKS - 1
    assert doc["config"]["max_model_len"] == MAX_MODEL_LEN
    assert doc["config_sources"]["max_num_seqs"].startswith("scenario")
    assert doc["server"]["before"]["metrics"]["cache_config"]["num_gpu_blocks"] == NUM_GPU_BLOCKS
    assert doc["server"]["preemptions"] == 0
    # and the run reads back as a request-level run
    parsed = read_run(run)
    assert len(parsed.requests) == 12 and parsed.config.num_gpu_blocks == NUM_GPU_BLOCKS - 1 and not parsed.assumed


def test_a_repeat_observation_sends_fresh_prompt_content_unless_seeded(capsys, tmp_path, scenario):
    """Observing the same scenario twice on one server must not resend the same tokens: the first
    run leaves its prompts in the server's prefix cache, and a repeat would hit it (on vLLM 0.32 the
    repeat's mean TTFT halved). Lengths stay the workload's; ``--content-seed`` makes it reproducible."""
    prompts, seeds = [], []
    with FakeServer() as server:
        for i, extra in enumerate(([], [], ["--content-seed", "7"], ["--content-seed", "7"])):
            run = tmp_path / f"run{i}.json"
            server.bodies.clear()
            code, _, err = run_cli(capsys, "observe", scenario, "--url", server.url, "--out", run, "-q", *extra)
            assert code == 0, err
            prompts.append(sorted(tuple(b["prompt"]) for b in server.bodies))
            seeds.append(json.loads(run.read_text())["observe"]["content_seed"])
    assert [sorted(map(len, p)) for p in prompts].count(sorted(map(len, prompts[0]))) == 4  # same lengths
    assert not set(prompts[0]) & set(prompts[1]) and seeds[0] != seeds[1]  # fresh content per run
    assert prompts[2] == prompts[3] and seeds[2] == seeds[3] == 7  # seeded: the same tokens again
    code, _, err = run_cli(capsys, "observe", scenario, "--url", "http://127.0.0.1:9", "--out", tmp_path / "x.json",
                           "--content-seed", "-1")
    assert code == 2 and "--content-seed" in err


def test_text_prompts_are_fitted_with_the_servers_tokenizer(capsys, tmp_path, scenario):
    run = tmp_path / "run.json"
    with FakeServer(token_ids=False) as server:  # refuses token-id prompts: observe falls back to text
        code, out, err = run_cli(capsys, "observe", scenario, "--url", server.url, "--out", run, "-q")
        bodies = server.bodies
    assert code == 0, err
    doc = json.loads(run.read_text())
    assert doc["observe"]["prompt_mode"].startswith("text fitted with the server's /tokenize (12 of 12 exactly")
    assert sorted(len(b["prompt"].split()) for b in bodies) == sorted(s.prompt_tokens for s in workload())
    assert len({b["prompt"] for b in bodies}) == 12  # unique prompts: no accidental prefix-cache hits


def test_chat_api_streams_deltas(capsys, tmp_path, scenario):
    run = tmp_path / "run.json"
    with FakeServer() as server:
        code, _, err = run_cli(capsys, "observe", scenario, "--url", server.url, "--api", "chat", "--out", run,
                               "-q")
    assert code == 0, err
    doc = json.loads(run.read_text())
    assert all(r["output_tokens"] == r["max_tokens"] for r in doc["requests"]) and len(doc["requests"]) == 12


def test_refused_requests_are_recorded_and_the_exit_is_non_zero(capsys, tmp_path, scenario):
    run = tmp_path / "run.json"
    with FakeServer(refuse_every=3) as server:
        code, _, err = run_cli(capsys, "observe", scenario, "--url", server.url, "--out", run, "-q")
    assert code == 1
    assert "error: the run is incomplete: 4 of 12 requests not measured" in err and "HTTP 429" in err
    doc = json.loads(run.read_text())
    assert doc["complete"] is False and len(doc["requests"]) == 8
    assert [u["state"] for u in doc["unmeasured_requests"]] == ["failed"] * 4
    assert all(u["error"].startswith("HTTP 429") for u in doc["unmeasured_requests"])
    assert len(read_run(run).requests) == 8  # what was measured is a readable run


def test_a_server_that_dies_mid_run_leaves_what_was_measured(capsys, tmp_path, scenario):
    run = tmp_path / "run.json"
    with FakeServer(die_after=5, step_s=0.001) as server:
        code, _, err = run_cli(capsys, "observe", scenario, "--url", server.url, "--out", run, "-q")
    assert code == 1
    # which the client sees first depends on timing (a loaded machine): a new request refused, or a
    # stream that was open when the server dropped it; both are the server gone (client.ServerGone)
    gone = ("the server stopped answering", "a stream broke off")
    assert any(f"error: the run is incomplete: {why}" in err for why in gone), err
    doc = json.loads(run.read_text())
    assert doc["complete"] is False and doc["incomplete_reason"].startswith(gone)
    measured = {r["id"] for r in doc["requests"]}
    unmeasured = {u["id"]: u for u in doc["unmeasured_requests"]}
    assert len(measured) + len(unmeasured) == 12 and 1 <= len(measured) <= 5
    assert any(u["state"] == "not sent" for u in unmeasured.values())  # the run stopped sending


def test_a_server_that_never_answers_times_out(capsys, tmp_path, scenario):
    run = tmp_path / "run.json"
    with FakeServer(silent=True) as server:
        code, _, err = run_cli(capsys, "observe", scenario, "--url", server.url, "--out", run, "-q",
                               "--read-timeout", "0.3", "--set", "workload.num_requests=3")
    assert code == 1
    assert "error: the run is incomplete: 3 of 3 requests not measured" in err and "no answer for 0.3 s" in err
    doc = json.loads(run.read_text())
    assert doc["requests"] == [] and all(u["sent_s"] is not None for u in doc["unmeasured_requests"])


def test_no_server_at_the_address_is_one_clear_line(capsys, tmp_path, scenario):
    code, _, err = run_cli(capsys, "observe", scenario, "--url", "http://127.0.0.1:9", "--out", tmp_path / "r.json",
                           "-q", "--read-timeout", "2")
    assert code == 2
    assert err.startswith("error: --url: no server answers at http://127.0.0.1:9") and "Traceback" not in err


@pytest.mark.parametrize("args, expected", [
    (["--url", "127.0.0.1:8000"], "--url: expected an http:// or https:// address"),
    (["--url", "http://127.0.0.1:9", "--api", "grpc"], "--api: expected one of completions, chat"),
    (["--url", "http://127.0.0.1:9", "--read-timeout", "0"], "--read-timeout: 0 is too small: give above 0"),
])
def test_bad_options(capsys, tmp_path, scenario, args, expected):
    code, _, err = run_cli(capsys, "observe", scenario, *args, "--out", tmp_path / "r.json", "-q")
    assert code == 2 and expected in err


# ------------------------------------------------------------------------------------------------
# the pure parts
# ------------------------------------------------------------------------------------------------
def test_prometheus_cache_config_labels_are_typed():
    text = ('# HELP x\nvllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0",'
            'num_gpu_blocks="4096",num_cpu_blocks="None",gpu_memory_utilization="0.92",cache_dtype="auto"} 1.0\n'
            'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n'
            'vllm:num_preemptions_total{engine="1",model_name="m"} 2.0\n'
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 7\n')
    assert parse_prometheus(text)[-1] == ("vllm:e2e_request_latency_seconds_bucket", {"le": "+Inf"}, 7.0)
    facts = vllm_metrics_facts(text)
    assert facts["cache_config"] == {"block_size": 32, "enable_prefix_caching": True, "num_gpu_blocks": 4096,
                                     "num_cpu_blocks": None, "gpu_memory_utilization": 0.92, "cache_dtype": "auto"}
    assert facts["counters"] == {"vllm:num_preemptions_total": 5.0}


def test_prompts_share_exactly_the_workloads_prefixes():
    a = RequestSpec("r0", 0.0, 48, 4, 4, prompt_runs=((("group", 1), 32), (("req", "r0"), 16)))
    b = RequestSpec("r1", 0.0, 40, 4, 4, prompt_runs=((("group", 1), 32), (("req", "r1"), 8)))
    c = RequestSpec("r2", 0.0, 40, 4, 4, prompt_runs=((("group", 2), 32), (("req", "r2"), 8)))
    pa, pb, pc = (token_id_prompt(s, 1000, seed=1) for s in (a, b, c))
    assert (len(pa), len(pb), len(pc)) == (48, 40, 40)
    assert pa[:32] == pb[:32] and pa[32:40] != pb[32:40] and pc[:32] != pa[:32]
    lo, hi = token_range(1000)
    assert all(lo <= t < hi for t in pa + pb + pc)
    assert token_range(128256)[1] < 128000  # clear of Llama-3's special tokens (128000 and up)
    assert token_id_prompt(a, 1000, seed=1) == pa  # reproducible
    assert len(text_of_words(a, 48).split()) == 48 and text_of_words(a, 48).split()[:32] == \
        text_of_words(b, 40).split()[:32]
