"""Closed-loop clients (issue 26): N clients, each sending its next request when its previous one
ends (plus think time), as ``vllm bench serve --max-concurrency`` runs them.

Closed forms on constant step times and fixed lengths (every prompt in one step, memory ample):
a wave of N prefills, O − 1 decode steps, the next wave sent at the last token, so request i is
sent at ⌊i/N⌋·(O·s + T), exactly N are in flight at every step, E2E = O·s and the throughput is
N / E2E. Then: rejections free a client, ramp spreads the first sends, the cap stops a run that
cannot drain, replicas and disaggregation serve closed loops, and a sweep and a capacity search
vary the concurrency. The fast-forward cases are in tests/test_fast_forward.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.errors import ScenarioError
from sim.runner import run
from sim.scenario.schema import load_scenario
from sim.workload.closed_loop import closed_loop
from sim.workload.synthetic import build_workload, workload_stats

STEP = 0.25  # sums of quarter seconds are exact in floating point


def scenario(concurrency=4, n=40, prompt=100, output=10, think=None, ramp=None, **top) -> dict:
    arrival = {"process": "closed", "concurrency": concurrency}
    if think is not None:
        arrival["think_time_s"] = think
    if ramp is not None:
        arrival["ramp_s"] = ramp
    scn = {"name": "closed", "model": "tiny", "hardware": {"gpu": "cpu"},
           "latency": {"backend": "constant", "step_s": STEP},
           "engine": {"num_gpu_blocks": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 4096,
                      "max_model_len": 2048},
           "workload": {"num_requests": n, "arrival": arrival,
                        "prompt_tokens": {"dist": "fixed", "value": prompt},
                        "output_tokens": {"dist": "fixed", "value": output}},
           "policies": [{"name": "vllm-v1", "enable_prefix_caching": False}]}
    scn.update(top)
    return scn


def in_flight(requests: pd.DataFrame, t: float) -> int:
    return int(((requests["arrival_s"] <= t) & (t < requests["finish_s"])).sum())


@pytest.mark.parametrize("n_clients,think", [(1, None), (4, None), (8, 0.5), (5, 1.25)])
def test_waves_closed_form(n_clients, think):
    output, n = 10, 40
    res = run(scenario(n_clients, n=n, output=output, think=think))
    req, steps, summary = res.requests, res.steps, res.summaries["vllm-v1"]
    t = think or 0.0
    e2e = output * STEP
    wave = np.arange(n) // n_clients
    assert (req["state"] == "finished").all()
    assert np.array_equal(req["arrival_s"].to_numpy(), wave * (e2e + t))  # exact: sums of quarters
    assert np.array_equal(req["client"].to_numpy(), np.arange(n) % n_clients)
    assert (req["ttft_s"] == STEP).all() and (req["e2e_s"] == e2e).all()
    # every step runs a whole wave: N requests in flight; a wave's first step prefills N prompts
    full = n // n_clients * n_clients
    assert (steps["num_seqs"].iloc[: len(steps) - (output if full < n else 0)] == n_clients).all()
    assert len(steps) == -(-n // n_clients) * output
    firsts = steps[steps["prefill_tokens"] > 0]
    assert len(firsts) == -(-n // n_clients)
    assert (firsts["prefill_tokens"].iloc[: n // n_clients] == n_clients * 100).all()
    for start in firsts["start_s"]:
        assert in_flight(req, start) == min(n_clients, n - int(np.searchsorted(req["arrival_s"], start)))
    if not think:
        assert summary["throughput_rps"] == pytest.approx(n_clients / e2e, rel=1e-12)
    waves = -(-n // n_clients)
    assert req["finish_s"].max() == waves * e2e + (waves - 1) * t


def test_ramp_spreads_the_first_sends_and_think_distributions_are_seeded():
    res = run(scenario(4, n=12, ramp=2.0))
    first = res.requests.iloc[:4]
    assert first["arrival_s"].tolist() == [0.0, 0.5, 1.0, 1.5]
    a = load_scenario(scenario(4, n=50, think={"dist": "exponential", "mean": 2.0}))
    b = load_scenario(scenario(16, n=50, think={"dist": "exponential", "mean": 2.0}))
    ta, tb = closed_loop(a, 50).think_s, closed_loop(b, 50).think_s
    assert np.array_equal(ta, tb) and ta.std() > 0  # own stream: concurrency leaves the draws alone
    assert abs(ta.mean() - 2.0) < 0.8


def test_start_even_is_the_ramp_and_random_is_a_seeded_uniform_draw():
    """``even`` is today's ramp exactly; ``random`` draws each first send over [0, ramp_s) from the
    seed, reproducibly, and sends the first requests in time order (the workload's order)."""
    plain = run(scenario(4, n=12, ramp=2.0)).requests
    scn = scenario(4, n=12, ramp=2.0)
    scn["workload"]["arrival"]["start"] = "even"
    assert run(scn).requests.equals(plain)
    together = scenario(4, n=12)
    together["workload"]["arrival"]["start"] = "together"
    assert run(together).requests.equals(run(scenario(4, n=12)).requests)

    def first_sends(seed, concurrency=64, n=640, ramp=3.0):
        scn = scenario(concurrency, n=n, ramp=ramp, seed=seed)
        scn["workload"]["arrival"]["start"] = "random"
        return np.array(closed_loop(load_scenario(scn), n).first_send_s)

    a, b, c = first_sends(1), first_sends(1), first_sends(2)
    assert np.array_equal(a, b) and not np.array_equal(a, c)  # seeded: the same seed, the same phases
    assert len(a) == 64 and (np.diff(a) >= 0).all() and a.min() >= 0 and a.max() < 3.0
    expected = np.sort(np.random.default_rng([1, 12]).uniform(0.0, 3.0, 64))  # the documented stream
    assert np.array_equal(a, expected)
    assert np.array_equal(first_sends(1, n=10), a[:10])  # fewer requests than clients: the same phases
    # uniform over the window, not even: the Kolmogorov-Smirnov distance of 4,096 uniform draws (99 %: 0.025)
    big = np.sort(first_sends(3, concurrency=4096, n=4096, ramp=1.0))
    ks = np.max(np.abs(big - (np.arange(1, 4097) - 0.5) / 4096))
    assert 0.0 < ks < 0.03 and np.diff(big).std() > 0
    scn = scenario(8, n=40, ramp=2.0)
    scn["workload"]["arrival"]["start"] = "random"
    req = run(scn).requests
    firsts = req.iloc[:8]
    assert np.array_equal(firsts["arrival_s"].to_numpy(), closed_loop(load_scenario(scn), 40).first_send_s)
    assert firsts["client"].tolist() == list(range(8)) and (req["state"] == "finished").all()


def test_the_next_send_waits_the_think_time_after_the_previous_end():
    res = run(scenario(3, n=30, think={"dist": "uniform", "min": 0.1, "max": 3.0}))
    req = res.requests
    loop = closed_loop(load_scenario(scenario(3, n=30, think={"dist": "uniform", "min": 0.1, "max": 3.0})), 30)
    ends = req.sort_values(["finish_s", "id"], kind="stable")
    # the k-th end (in time order) frees its client, which takes request N + k and sends it after
    # think_s[k]
    for k, (_, row) in enumerate(ends.iloc[: 30 - 3].iterrows()):
        nxt = req.iloc[3 + k]
        assert nxt["client"] == row["client"]
        assert nxt["arrival_s"] == row["finish_s"] + loop.think_s[k]


def test_rejections_free_the_client():
    # a prompt needing more KV than the pool holds is rejected at once; its client sends the next
    scn = scenario(2, n=20, output=4)
    scn["workload"]["prompt_tokens"] = {"dist": "uniform", "min": 50, "max": 900}
    scn["engine"]["num_gpu_blocks"] = 40  # 640 tokens: the longer prompts can never fit
    req = run(scn).requests
    assert set(req["state"]) == {"finished", "rejected"}
    assert (req["state"] == "rejected").sum() >= 3
    assert req["arrival_s"].notna().all()  # every request was sent
    for _c, mine in req.groupby("client"):
        starts = mine["arrival_s"].to_numpy()
        assert (np.diff(starts) >= 0).all()
    fin = req[req["state"] == "finished"]
    assert max(in_flight(fin, t) for t in fin["arrival_s"]) <= 2


def test_concurrency_above_the_request_count_sends_everything_at_once():
    req = run(scenario(50, n=6)).requests
    assert (req["arrival_s"] == 0).all() and req["client"].tolist() == list(range(6))


def test_the_time_cap_stops_a_loop_that_never_drains(monkeypatch):
    import sim.runner as runner

    monkeypatch.setattr(runner, "DEFAULT_DRAIN_S", 3.0)
    # one client, requests of 16 steps (4 s each): the cap (last send + 3 s) cuts the first one
    res = run(scenario(1, n=5, output=16))
    req, s = res.requests, res.summaries["vllm-v1"]
    assert req["state"].tolist() == ["unfinished"] * 5
    assert s["stopped"] == "time cap" and s["end_s"] == 3.0
    assert s["backlog"] == {"queued": 0, "running": 1, "not_arrived": 4}
    # the step ending at 3.0 is cut, as a horizon cuts it
    assert req["arrival_s"].isna().sum() == 4 and req["generated"].iloc[0] == 11
    assert req["reason"].iloc[0].startswith("simulated-time cap of 3 s")
    # two clients of 2-second requests: every send moves the cap, the run drains
    res = run(scenario(2, n=8, output=8))
    assert res.summaries["vllm-v1"]["stopped"] == "drained"


def test_a_horizon_stops_closed_loops_too():
    res = run(scenario(2, n=40, output=10, horizon_s=6.0))
    s = res.summaries["vllm-v1"]
    assert s["stopped"] == "horizon"
    assert res.requests["arrival_s"].max() < 6.0


def test_replicas_and_routers_serve_one_closed_loop():
    for router in ("round-robin", "least-outstanding"):
        res = run(scenario(6, n=60, output=8, replicas={"count": 3, "router": router}))
        req = res.requests
        assert (req["state"] == "finished").all()
        assert req["replica"].nunique() == 3
        assert (req["e2e_s"] == 8 * STEP).all()  # two per replica: every wave in one step
        assert res.summaries["vllm-v1"]["throughput_rps"] == pytest.approx(6 / (8 * STEP), rel=1e-12)


def test_disaggregated_closed_loop_keeps_n_in_flight():
    scn = scenario(3, n=18, output=6)
    scn["disaggregation"] = {"label": "pd", "transfer": {"bandwidth_gbps": 1000.0}}
    res = run(scn)
    pd_ = res.requests[res.requests["policy"] == "pd"]
    assert (pd_["state"] == "finished").all()
    assert pd_["client"].tolist() == [i % 3 for i in range(18)]
    for t in pd_["arrival_s"]:
        assert in_flight(pd_, t) <= 3
    # each client's next request is sent exactly when its previous one finished
    for _c, mine in pd_.groupby("client"):
        assert np.array_equal(mine["arrival_s"].to_numpy()[1:], mine["finish_s"].to_numpy()[:-1])


def test_trace_lengths_replay_in_order(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" +
                     "".join(f"{i * 10.0},{50 + i},{2 + i % 3}\n" for i in range(9)))
    scn = scenario(2)
    scn["workload"] = {"trace": {"path": str(trace)}, "arrival": {"process": "closed", "concurrency": 2}}
    specs = build_workload(load_scenario(scn))
    assert [s.prompt_tokens for s in specs] == [50 + i for i in range(9)]
    assert all(np.isnan(s.arrival_s) for s in specs)
    assert workload_stats(specs)["duration_s"] is None
    req = run(scn).requests
    assert (req["state"] == "finished").all() and req["arrival_s"].iloc[:2].tolist() == [0.0, 0.0]


def test_sweep_varies_the_concurrency(tmp_path):
    from sim.planning.sweep import make_points, parse_vary, sweep

    points = make_points(vary=parse_vary("workload.arrival.concurrency=2,4"))
    res = sweep(scenario(2, n=24, output=8), points, tmp_path / "sw", plot=False)
    tp = dict(zip(res.table["workload.arrival.concurrency"], res.table["throughput_rps"]))
    assert tp[2] == pytest.approx(2 / (8 * STEP)) and tp[4] == pytest.approx(4 / (8 * STEP))


@pytest.mark.parametrize("bad,message", [
    ({"process": "closed"}, "concurrency"),
    ({"process": "closed", "concurrency": 4, "rate": 2.0}, "rate"),
    ({"process": "poisson", "rate": 2.0, "concurrency": 4}, "concurrency"),
    ({"process": "closed", "concurrency": 4, "think_time_s": -1}, "think_time_s"),
    ({"process": "closed", "concurrency": 4, "think_time_s": {"dist": "exponential"}}, "mean"),
    ({"process": "closed", "concurrency": 0}, "concurrency"),
    ({"process": "closed", "concurrency": 4, "start": "random"}, "ramp_s"),
    ({"process": "closed", "concurrency": 4, "start": "even", "ramp_s": 0}, "ramp_s"),
    ({"process": "closed", "concurrency": 4, "start": "together", "ramp_s": 1.0}, "start"),
    ({"process": "closed", "concurrency": 4, "start": "jitter", "ramp_s": 1.0}, "start"),
    ({"process": "poisson", "rate": 2.0, "start": "random"}, "start"),
])
def test_bad_closed_loop_keys_are_one_line_errors(bad, message):
    scn = scenario()
    scn["workload"]["arrival"] = bad
    with pytest.raises(ScenarioError) as err:
        load_scenario(scn)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_disaggregated_closed_loop_fast_forward_is_exact():
    from sim.disaggregation.run import run_disaggregated
    from sim.metrics.recorder import HORIZON_REACHED
    from sim.runner import policy_knobs

    scn = scenario(10, n=80, output=1)
    scn["workload"]["prompt_tokens"] = {"dist": "uniform", "min": 20, "max": 600}
    scn["workload"]["output_tokens"] = {"dist": "uniform", "min": 1, "max": 150}
    scn["workload"]["arrival"]["think_time_s"] = {"dist": "exponential", "mean": 0.2}
    scn["latency"] = {"backend": "roofline"}  # step times vary with the batch
    scn["engine"]["num_gpu_blocks"] = 300
    scn["disaggregation"] = {"label": "pd", "prefill": {"replicas": 2}, "decode": {"replicas": 2},
                             "transfer": {"bandwidth_gbps": 0.05, "latency_s": 0.01}}
    s = load_scenario(scn)
    specs = build_workload(s)
    out = [run_disaggregated(s, specs, knobs_of=policy_knobs, end_s=None, horizon_reason=HORIZON_REACHED,
                             fast_forward=ff, clients=closed_loop(s, len(specs)), drain_s=3600.0)
           for ff in (True, False)]
    fast, slow = out
    assert sum(r.stretches for r in fast[4].decode) > 0, "nothing was fast-forwarded"
    pd.testing.assert_frame_equal(fast[1], slow[1])
    pd.testing.assert_frame_equal(fast[0].drop(columns="token_times_s"), slow[0].drop(columns="token_times_s"))
    assert all(np.array_equal(x, y) for x, y in zip(fast[0]["token_times_s"], slow[0]["token_times_s"]))
    assert (fast[0]["state"] == "finished").all() and fast[0]["client"].nunique() == 10


def test_capacity_is_the_highest_concurrency_meeting_the_slo():
    """Every wave fits one step while the clients fit max_num_seqs (E2E = O·s exactly); one client
    more waits a whole request: the capacity is max_num_seqs, found from any start."""
    from sim.planning.capacity import capacity

    scn = scenario(3, n=400, output=8, slo={"e2e_s": 8 * STEP * 1.01})
    scn["engine"]["max_num_seqs"] = 8
    res = capacity(scn)["vllm-v1"]
    assert res.concurrency == 8 and res.violating_concurrency == 9
    assert res.throughput_rps == pytest.approx(8 / (8 * STEP), rel=1e-9)  # throughput there: N / E2E
    assert dict(res.probes) == {3.0: True, 6.0: True, 12.0: False, 9.0: False, 7.0: True, 8.0: True}


def test_plan_counts_replicas_for_a_target_concurrency():
    from sim.errors import CbsimError
    from sim.planning.plan import plan

    scn = scenario(16, n=400, output=8, slo={"e2e_s": 8 * STEP * 1.01})
    scn["engine"]["max_num_seqs"] = 8
    p = plan(scn, None)["vllm-v1"]
    assert p.replicas == 2 and p.target_concurrency == 16 and dict(p.probes) == {1: False, 2: True}
    assert p.summary["throughput_rps"] == pytest.approx(16 / (8 * STEP), rel=1e-9)
    assert plan(scn, None, target_concurrency=30)["vllm-v1"].replicas == 4
    with pytest.raises(CbsimError, match="--target-concurrency"):
        plan(scn, 5.0)


def test_an_slo_met_at_any_concurrency_is_said_so():
    from sim.errors import CbsimError
    from sim.planning.capacity import capacity

    scn = scenario(3, n=100, output=8, slo={"tpot_s": 1.0})  # TPOT levels off: more clients only queue
    scn["engine"]["max_num_seqs"] = 2
    with pytest.raises(CbsimError, match="met at every concurrency up to 16 clients"):
        capacity(scn)


def test_results_written_before_the_client_columns_still_load(tmp_path):
    from sim.results import RunResult

    res = run(scenario(2, n=6))
    folder = tmp_path / "old"
    res.save(folder)
    frame = pd.read_parquet(folder / "requests.parquet")
    assert frame["client"].tolist() == [0, 1] * 3 and (frame["session"] == -1).all()
    frame.drop(columns=["client", "session", "turn"]).to_parquet(folder / "requests.parquet")
    back = RunResult.load(folder).requests
    assert (back[["client", "session", "turn"]] == -1).all().all()
