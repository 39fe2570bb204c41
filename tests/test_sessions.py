"""Multi-turn sessions (issue 31, item 1): turn k+1 is sent think_time_s after turn k's last token
and resends the whole history, so the engines' prefix caches hit on it.

Closed forms on constant step times (s = 0.25) and a 16-token block: one session, system prompt
S = 64, first message n0 = 40, answer o0 = 8, think T = 2, second message n1 = 40. Turn 0 takes one
prefill step and 7 decode steps: it ends at 8 × 0.25 = 2.0 s; turn 1 is sent at 2.0 + T = 4.0 with a
prompt of S + n0 + o0 + n1 = 152 tokens. Turn 0 computed the KV of its prompt and of 7 of its 8
answer tokens (the last one is emitted, never fed back): 111 tokens. So turn 1's first step
computes 152 − 96 = 56 tokens on vllm-v1 (6 full 16-token blocks hit), 152 − 111 = 41 on sglang
(its radix tree holds tokens), 152 − 104 = 48 on tgi (its radix tree holds prompts only), and all
152 without a prefix cache.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.errors import ScenarioError
from sim.runner import run
from sim.scenario.schema import load_scenario
from sim.workload.synthetic import build_workload

STEP = 0.25


def scenario(count=1, turns=2, think=2.0, new=40, answer=8, system=64, groups=1, arrival=None, policy="vllm-v1",
             **top) -> dict:
    scn = {"name": "sessions", "model": "tiny", "hardware": {"gpu": "cpu"},
           "latency": {"backend": "constant", "step_s": STEP},
           "engine": {"num_gpu_blocks": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 4096,
                      "max_model_len": 4096, "block_size": 16},
           "workload": {"arrival": arrival or {"process": "poisson", "rate": 0.01},
                        "sessions": {"count": count, "turns": {"dist": "fixed", "value": turns},
                                     "think_time_s": think, "new_tokens": {"dist": "fixed", "value": new},
                                     "output_tokens": {"dist": "fixed", "value": answer},
                                     "system_prompt": {"num_groups": groups, "tokens": system}}},
           "policies": [{"name": policy}]}
    scn.update(top)
    return scn


def first_prefill(steps: pd.DataFrame, at: float) -> int:
    return int(steps.loc[(steps["start_s"] == at) & (steps["prefill_tokens"] > 0), "prefill_tokens"].iloc[0])


def test_one_session_two_turns_closed_form():
    specs = build_workload(load_scenario(scenario()))
    t0, t1 = specs
    assert (t0.prompt_tokens, t1.prompt_tokens) == (64 + 40, 64 + 40 + 8 + 40)
    assert t0.prompt_runs == ((("system", 0), 64), (("user", 0, 0), 40))
    assert t1.prompt_runs == ((("system", 0), 64), (("user", 0, 0), 40), (("answer", 0, 0), 8),
                              (("user", 0, 1), 40))
    assert t0.output_key == ("answer", 0, 0) and (t1.session, t1.turn, t1.think_s) == (0, 1, 2.0)
    res = run(scenario())
    req, steps = res.requests, res.steps
    assert req["session"].tolist() == [0, 0] and req["turn"].tolist() == [0, 1]
    assert req["finish_s"].iloc[0] == 8 * STEP
    assert req["arrival_s"].iloc[1] == 8 * STEP + 2.0  # the answer's last token plus the think time
    assert req["ttft_s"].tolist() == [STEP, STEP] and (req["state"] == "finished").all()
    assert first_prefill(steps, 0.0) == 104
    assert first_prefill(steps, 4.0) == 152 - 96  # six full blocks of the history hit the cache


@pytest.mark.parametrize("policy,knobs,computed", [
    ("vllm-v1", {}, 152 - 96),  # block hashes: full 16-token blocks of prompt + fed-back answer
    ("vllm-v1", {"enable_prefix_caching": False}, 152),
    ("sglang", {}, 152 - 111),  # a radix tree of tokens: prompt + the 7 answer tokens with KV
    ("tgi", {}, 152 - 104),  # radix.rs: prompts only, inserted when a request finishes
    ("vllm-v0", {}, 152),  # prefix caching off by default
])
def test_the_second_turn_hits_the_prefix_cache_on_its_history(policy, knobs, computed):
    scn = scenario(policy=policy)
    scn["policies"] = [{"name": policy, **knobs}]
    steps = run(scn).steps
    assert first_prefill(steps, 4.0) == computed


def test_sessions_share_their_system_prompt_group():
    # two sessions, same system prompt: the second session's first turn hits the first's system prompt
    scn = scenario(count=2, turns=1, system=64, arrival={"process": "constant", "rate": 0.5})
    steps = run(scn).steps
    assert first_prefill(steps, 0.0) == 104 and first_prefill(steps, 2.0) == 104 - 64


def test_closed_loop_clients_run_one_session_after_another():
    scn = scenario(count=5, turns=3, think=1.0, arrival={"process": "closed", "concurrency": 2, "think_time_s": 0.5})
    req = run(scn).requests
    assert (req["state"] == "finished").all()
    assert sorted(req.groupby("session")["client"].nunique().tolist()) == [1] * 5  # a session stays on its client
    for _, mine in req.sort_values("arrival_s").groupby("client"):
        sessions = mine["session"].tolist()
        assert sessions == sorted(sessions)  # one session after another, each whole
        ends, sends = mine["finish_s"].to_numpy()[:-1], mine["arrival_s"].to_numpy()[1:]
        turns = mine["turn"].to_numpy()[1:]
        assert np.array_equal(sends - ends, np.where(turns == 0, 0.5, 1.0))  # client think, turn think
    assert max(((req["arrival_s"] <= t) & (t < req["finish_s"])).sum() for t in req["arrival_s"]) <= 2


def test_a_session_ends_when_its_context_is_full():
    specs = build_workload(load_scenario(scenario(turns=10, new=100, answer=100, system=0,
                                                  engine={"max_model_len": 512, "num_gpu_blocks": 512})))
    # turn 2's 500-token prompt fits (511 at most), its answer is cut to the 12 tokens left, and a
    # fourth turn (612 tokens) would not fit: the session ends after three turns
    assert [(s.prompt_tokens, s.output_tokens) for s in specs] == [(100, 100), (300, 100), (500, 12)]


def test_csv_trace_sessions_replay_turn_after_turn(tmp_path):
    trace = tmp_path / "sessions.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,session_id,turn\n"
                     "0.0,100,8,chat-a,0\n0.5,60,4,chat-b,0\n1.0,140,8,chat-a,1\n20.0,200,6,chat-a,2\n"
                     "2.0,90,4,chat-b,1\n")
    scn = scenario()
    scn["workload"] = {"trace": {"path": str(trace)}}
    specs = build_workload(load_scenario(scn))
    a1 = next(s for s in specs if (s.session, s.turn) == (0, 1))
    assert a1.prompt_runs == ((("trace", 0, 0), 100), (("answer", "trace", 0, 0), 8), (("trace", 0, 1), 32))
    req = run(scn).requests.set_index(["session", "turn"])
    assert req.loc[(0, 1), "arrival_s"] == req.loc[(0, 0), "finish_s"] == 2.0  # after turn 0, not at 1.0
    assert req.loc[(0, 2), "arrival_s"] == 20.0  # its own time: turn 1 had ended long before
    assert req.loc[(1, 1), "arrival_s"] == 2.0  # its timestamp (turn 0 ended at 1.5)


def test_fast_forward_is_exact_with_sessions(monkeypatch):
    scn = scenario(count=12, turns=4, think={"dist": "exponential", "mean": 1.0}, new=60, answer=60,
                   arrival={"process": "poisson", "rate": 2.0}, latency={"backend": "roofline"})
    scn["workload"]["sessions"]["turns"] = {"dist": "uniform", "min": 1, "max": 6}
    scn["workload"]["sessions"]["output_tokens"] = {"dist": "uniform", "min": 20, "max": 200}
    closed = {**scn, "workload": {**scn["workload"], "arrival": {"process": "closed", "concurrency": 5}}}
    import sim.engine

    stretches = []
    apply = sim.engine.Replica._apply_stretch

    def counted(self, *args):
        stretches.append(args[1])
        return apply(self, *args)

    monkeypatch.setattr(sim.engine.Replica, "_apply_stretch", counted)
    for s in (scn, closed, {**scn, "replicas": {"count": 2, "router": "least-outstanding"}}):
        stretches.clear()
        on = run(s)
        assert sum(stretches) > 100, "hardly anything was fast-forwarded: the comparison would prove little"
        monkeypatch.setenv("CBSIM_NO_FAST_FORWARD", "1")
        off = run(s)
        monkeypatch.delenv("CBSIM_NO_FAST_FORWARD")
        pd.testing.assert_frame_equal(on.steps, off.steps, check_exact=True)
        pd.testing.assert_frame_equal(on.requests.drop(columns="token_times_s"),
                                      off.requests.drop(columns="token_times_s"), check_exact=True)
        assert (on.requests["state"] == "finished").all()


def test_sessions_are_seeded():
    a = build_workload(load_scenario(scenario(count=20, turns=3)))
    b = build_workload(load_scenario(scenario(count=20, turns=3)))
    assert repr(a) == repr(b)  # arrival_s of later turns is NaN: compare the text


@pytest.mark.parametrize("change,message", [
    ({"num_requests": 10}, "num_requests"),
    ({"prefix": {"prefix_len": 10}}, "prefix"),
    ({"trace": {"path": "x.csv"}}, "trace"),
])
def test_bad_session_keys_are_one_line_errors(change, message):
    scn = scenario()
    scn["workload"].update(change)
    with pytest.raises(ScenarioError) as err:
        load_scenario(scn)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_turns_cannot_be_a_token_table():
    scn = scenario()
    scn["workload"]["sessions"]["turns"] = {"dist": "azure-conv"}
    with pytest.raises(ScenarioError, match="turns"):
        load_scenario(scn)


def test_capacity_of_closed_loop_sessions_is_max_num_seqs():
    """Closed-loop clients running 3-turn sessions: every send lands on a step end, so TTFT is one
    step (0.25 s) while the clients fit max_num_seqs (8); a ninth client waits a step more."""
    from sim.planning.capacity import capacity

    scn = scenario(count=40, turns=3, think=1.0, arrival={"process": "closed", "concurrency": 4},
                   slo={"ttft_s": 0.3})
    scn["engine"]["max_num_seqs"] = 8
    res = capacity(scn)["vllm-v1"]
    assert (res.concurrency, res.violating_concurrency) == (8, 9)


def test_a_saved_sessions_scenario_loads_back_to_itself():
    import yaml

    for arrival in ({"process": "poisson", "rate": 2.0}, {"process": "closed", "concurrency": 3, "ramp_s": 1.0}):
        scn = load_scenario(scenario(count=4, arrival=arrival))
        again = load_scenario(yaml.safe_load(scn.to_yaml()))
        assert again.to_yaml() == scn.to_yaml()
        assert repr(build_workload(again)) == repr(build_workload(scn))
