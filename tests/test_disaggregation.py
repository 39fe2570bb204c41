"""Prefill/decode disaggregation (issue 19): closed-form times, KV blocks conserved across pools,
exact fast-forward, and the planner finding an xPyD layout where chunked prefill misses a TPOT SLO."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sim.disaggregation import topology
from sim.disaggregation.run import run_disaggregated
from sim.errors import ScenarioError
from sim.hardware.models import get_model
from sim.metrics.recorder import HORIZON_REACHED
from sim.runner import policy_knobs, run
from sim.scenario.schema import load_scenario
from sim.workload.synthetic import build_workload
from tests.conftest import REPO
from tests.helpers import long_prompt_disagg_scenario

STEP = 0.25  # constant step time: sums of it are exact in floating point
BLOCK = 16


def tiny(requests, **dis) -> dict:
    """The tiny model on the nominal CPU, constant step times, a pinned KV pool."""
    return {"name": "pd-test", "model": "tiny", "hardware": {"gpu": "cpu"},
            "latency": {"backend": "constant", "step_s": STEP},
            "engine": {"num_gpu_blocks": 256, "max_model_len": 2048, "max_num_seqs": 16,
                       "max_num_batched_tokens": 512, "block_size": BLOCK},
            "workload": {"requests": requests},
            "policies": [{"name": "vllm-v1", "label": "colocated"}],
            "disaggregation": {"label": "pd", **dis}}


def wire_seconds(prompt: int, bandwidth_gbps: float, latency_s: float) -> float:
    """The transfer of one request, from the model's KV layout (independently of the simulator)."""
    blocks = math.ceil(prompt / BLOCK)
    return latency_s + blocks * BLOCK * get_model("tiny").kv_bytes_per_token() / (bandwidth_gbps * 1e9)


def simulate(scn, fast_forward=None):
    scn = load_scenario(scn)
    specs = build_workload(scn)
    return run_disaggregated(scn, specs, knobs_of=policy_knobs, end_s=None, horizon_reason=HORIZON_REACHED,
                             fast_forward=fast_forward)


def test_one_request_ttft_and_e2e_are_prefill_plus_transfer_plus_decode_exactly():
    prompt, output = 1000, 6  # 512-token budget: two prefill steps (512 + 488), then 5 decode steps
    bw, lat = 0.002, 0.125
    result = run(tiny([{"arrival_s": 0.0, "prompt_tokens": prompt, "output_tokens": output}],
                      transfer={"bandwidth_gbps": bw, "latency_s": lat}))
    row = result.requests[result.requests["policy"] == "pd"].iloc[0]
    wire = wire_seconds(prompt, bw, lat)
    prefill = 0.0 + STEP + STEP  # the clock as SimPy advances it
    landed = prefill + wire
    end = landed
    for _ in range(output - 1):  # the decode instance decodes from the moment the KV lands
        end += STEP
    # the client's first token comes from the decode side: prefill + transfer (no queue here) +
    # decode admission (none waiting) + the first decode step, with the prefill's token beside it
    first = landed + STEP
    assert row["ttft_s"] == first
    assert row["ttft_s"] - row["prefill_ttft_s"] >= row["transfer_s"], "TTFT exceeds prefill by the transfer"
    assert row["prefill_ttft_s"] == prefill
    assert row["e2e_s"] == end
    assert row["transfer_s"] == pytest.approx(wire, rel=1e-12)
    assert list(row["token_times_s"]) == [first, *[landed + STEP * (k + 1) for k in range(output - 1)]]
    s = result.summaries["pd"]
    assert s["transfer_wire_s"]["p50"] == pytest.approx(wire, rel=1e-12)
    assert s["transfer_queue_s"]["p99"] == 0.0 and s["decode_queue_s"]["p99"] == 0.0
    assert s["handoff_gap_s"]["p50"] == pytest.approx(wire + STEP, rel=1e-12)
    assert s["ttft_s"]["p50"] == first and s["tpot_s"]["p50"] == pytest.approx((end - first) / (output - 1))
    assert s["decode_itl_s"]["p99"] == STEP
    steps = result.steps[result.steps["policy"] == "pd"]
    assert (steps["pool"] == "prefill").sum() == 2 and (steps["pool"] == "decode").sum() == output - 1
    # the colocated run of the same request has no transfer column values
    assert result.requests.loc[result.requests["policy"] == "colocated", "transfer_s"].isna().all()


def test_transfers_queue_behind_each_other_on_the_same_link():
    """Two prompts finish at the same moment on two prefill instances: on one shared link the
    second transfer waits for the first; on a link per pair they overlap."""
    reqs = [{"arrival_s": 0.0, "prompt_tokens": 256, "output_tokens": 3} for _ in range(2)]
    bw, lat = 0.001, 0.0
    wire = wire_seconds(256, bw, lat)
    pools = {"prefill": {"replicas": 2}, "decode": {"replicas": 2}, "router": "round-robin"}
    shared = run(tiny(reqs, transfer={"link": "shared", "bandwidth_gbps": bw, "latency_s": lat}, **pools))
    pair = run(tiny(reqs, transfer={"link": "per-pair", "bandwidth_gbps": bw, "latency_s": lat}, **pools))
    t_shared = sorted(shared.requests.loc[shared.requests["policy"] == "pd", "transfer_s"])
    t_pair = sorted(pair.requests.loc[pair.requests["policy"] == "pd", "transfer_s"])
    assert t_shared == pytest.approx([wire, 2 * wire], rel=1e-12)
    assert t_pair == pytest.approx([wire, wire], rel=1e-12)
    assert shared.summaries["pd"]["transfer_queue_s"]["mean"] == pytest.approx(wire / 2, rel=1e-12)
    # what the client waits for includes the queue for the link: TTFT = prefill + queue + wire + a step
    pd_rows = shared.requests[shared.requests["policy"] == "pd"].sort_values("transfer_s")
    assert list(pd_rows["ttft_s"] - pd_rows["prefill_ttft_s"]) == pytest.approx([wire + STEP, 2 * wire + STEP],
                                                                                 rel=1e-12)


def _pressure_workload(n=60, seed=3):
    rng = np.random.default_rng(seed)
    return [{"arrival_s": float(t), "prompt_tokens": int(p), "output_tokens": int(o)}
            for t, p, o in zip(np.cumsum(rng.exponential(0.1, n)), rng.integers(40, 700, n), rng.integers(2, 60, n))]


def test_kv_blocks_are_conserved_across_pools(monkeypatch):
    """Every block pinned on a prefill instance is freed there when its transfer lands, every
    decode-side block is freed when its request ends; a small decode pool makes transfers wait
    for room and the decode policy preempt."""
    pinned, unpinned = {}, {}
    real_pin, real_unpin = topology.pin_blocks, topology.unpin_blocks

    def pin(policy, req):
        blocks = real_pin(policy, req)
        pinned[req.id] = (policy, list(blocks))
        return blocks

    def unpin(policy, blocks):
        real_unpin(policy, blocks)
        rid = next(k for k, (pol, b) in pinned.items() if pol is policy and b == list(blocks) and k not in unpinned)
        ref_cnt = policy.kv.pool.ref_cnt  # exact counts, built once
        unpinned[rid] = [ref_cnt[b] for b in blocks]

    monkeypatch.setattr(topology, "pin_blocks", pin)
    monkeypatch.setattr(topology, "unpin_blocks", unpin)
    scn = tiny(_pressure_workload(), prefill={"replicas": 2},
               decode={"replicas": 2, "engine": {"num_gpu_blocks": 60}}, transfer={"bandwidth_gbps": 0.01})
    scn["engine"]["enable_prefix_caching"] = False  # a freed block is then free, not cached
    requests, steps, summary, meta, top = simulate(scn)
    assert (requests["state"] == "finished").all()
    handed = [h for h in top.handoffs if h.handed_off]
    assert len(handed) == len(top.handoffs) and set(pinned) == set(unpinned) == {h.spec.id for h in handed}
    for h in handed:
        assert len(pinned[h.spec.id][1]) == math.ceil(h.spec.prompt_tokens / BLOCK)
        assert unpinned[h.spec.id] == [0] * len(pinned[h.spec.id][1])  # freed there, by the transfer
        assert h.landed_s >= h.room_s >= h.prefilled_s
    assert any(h.room_s > h.prefilled_s for h in handed), "the decode pool never ran short of room"
    assert summary["pools"]["decode"]["preemptions"] > 0 or summary["decode_queue_s"]["p99"] > 0
    for rep in top.prefill + top.decode:
        kv = rep.policy.inner.kv
        kv.pool.check_invariants()
        assert kv.pool.num_used == 0 and not kv.request_states()
    # transfers waiting for decode room hold their prefill blocks: here they fill the prefill pool
    pre = steps[steps["pool"] == "prefill"]
    assert pre["kv_blocks_used"].max() == 256


def test_fast_forward_is_exact_across_pools():
    scn = tiny(_pressure_workload(80, seed=5), prefill={"replicas": 2},
               decode={"replicas": 2, "engine": {"num_gpu_blocks": 120}},
               transfer={"bandwidth_gbps": 0.05, "latency_s": 0.01})
    scn["latency"] = {"backend": "roofline"}  # step times vary with the batch
    fast = simulate(scn, fast_forward=True)
    slow = simulate(scn, fast_forward=False)
    assert sum(r.stretches for r in fast[4].decode) > 0, "nothing was fast-forwarded"
    pd.testing.assert_frame_equal(fast[1], slow[1])
    a, b = fast[0].drop(columns="token_times_s"), slow[0].drop(columns="token_times_s")
    pd.testing.assert_frame_equal(a, b)
    assert all(np.array_equal(x, y) for x, y in zip(fast[0]["token_times_s"], slow[0]["token_times_s"]))


def test_a_request_the_decode_pool_can_never_hold_is_refused_there():
    scn = tiny([{"arrival_s": 0.0, "prompt_tokens": 600, "output_tokens": 4},
                {"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 4}],
               decode={"engine": {"num_gpu_blocks": 20}})
    requests = run(scn, policies=["pd"]).requests
    big, small = requests.iloc[0], requests.iloc[1]
    assert big["state"] == "rejected" and big["reason"].startswith("decode instance: ")
    assert small["state"] == "finished"


def test_colocated_runs_have_no_disaggregation_columns():
    scn = tiny([{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 4}])
    del scn["disaggregation"]
    result = run(scn)
    assert "transfer_s" not in result.requests and "pool" not in result.steps
    assert "pools" not in result.summaries["colocated"]


def test_pool_sections_inherit_the_scenarios_and_bad_ones_name_their_key():
    scn = load_scenario(tiny([{"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 2}],
                             prefill={"hardware": {"tensor_parallel": 2}},
                             decode={"engine": {"max_num_seqs": 64}}))
    pre, dec = scn.disaggregation.prefill, scn.disaggregation.decode
    assert pre.hardware.gpu == "cpu" and pre.hardware.count == 2
    assert dec.engine.max_num_seqs == 64 and dec.engine.num_gpu_blocks == 256 and dec.engine.block_size == BLOCK
    assert scn.disaggregation.name == "pd" and load_scenario(scn, ["disaggregation.label=null"]).disaggregation.name \
        == "1P1D"
    base = tiny([{"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 2}])
    for override, key in (("disaggregation.decode.policy.name=orca", "disaggregation.decode.policy.name"),
                          ("disaggregation.label=colocated", "disaggregation.label"),
                          ("disaggregation.transfer.bandwidth_gbps=0", "disaggregation.transfer.bandwidth_gbps"),
                          ("disaggregation.prefill.hardware.gpu=h2000", "disaggregation.prefill.hardware.gpu")):
        with pytest.raises(ScenarioError) as err:
            load_scenario(base, [override])
        assert key in str(err.value) and "\n" not in str(err.value)


def test_planner_finds_a_disaggregated_layout_where_chunked_prefill_misses_the_tpot_slo():
    """4,000-token prompts, 200-token outputs, p99 TPOT ≤ 7 ms at 6 req/s on H200s: colocated
    chunked prefill (vllm-v1) misses it with up to 4 replicas, since every decode step that
    carries a prefill chunk takes ~80 ms; the planner finds an xPyD layout that meets it and
    reports the colocated layout's violation on the same GPUs. Every verdict is the steady-state
    one of sim.planning.probe.judge on both sides (max_num_seqs 64: the batches at 6 req/s never
    near it; it keeps the saturation bursts, 4 × the slots, small)."""
    from sim.planning.disagg_plan import plan_disaggregated

    scn = long_prompt_disagg_scenario()
    plan = plan_disaggregated(scn, 6.0, max_instances=4)
    best = plan.best
    assert best is not None and best.met and plan.stable
    steady = best.summary["steady"]
    assert steady["slo_met"] is True and best.p99["tpot_s"] == steady["tpot_s"]["p99"] <= 0.007
    # a met verdict is confirmed at twice the size, and the topology's own burst puts 6 req/s below saturation
    assert best.probe_requests == 2 * 320 and not best.saturated and best.saturated_rps > 6.0
    assert plan.cost_per_hour == best.gpus * 2.0
    chunked = plan.colocated["chunked"]
    assert chunked["replicas"] is None, "chunked prefill met the bound: the test lost its point"
    same = chunked["same_gpus"]
    assert same["gpus"] == best.gpus and not same["met"] and not same["saturated"]
    value, bound = same["violations"]["tpot_s"]
    assert value > bound == 0.007
    # every verdict is its run's steady-window one, colocated and disaggregated alike
    for p in plan.probes:
        assert p.met == (p.summary["steady"]["slo_met"] and not p.saturated), p
    colocated = [p for p in plan.probes if p.decode == 0]
    same_run = next(p for p in colocated if p.prefill == same["replicas"])
    assert value == same_run.summary["steady"]["tpot_s"]["p99"]
    # every layout the plan names was simulated; one fewer decode instance does not meet
    probes = {(p.prefill, p.decode, p.decode_tp > 0): p.met for p in plan.probes}
    assert probes[(best.prefill, best.decode, True)]
    assert probes.get((best.prefill, best.decode - 1, True), False) is False
    assert plan.runs > len(plan.probes)  # probe sizes and saturation bursts counted


def test_plan_disaggregated_refuses_a_scenario_without_the_section_in_one_line(capsys):
    from tests.test_bad_input import run_cli

    code, _, err = run_cli(capsys, "plan", REPO / "scenarios/quickstart.yaml", "-r", "2", "--disaggregated",
                           "--set", "slo.tpot_s=0.1")
    assert code != 0 and "needs a disaggregation section" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "plan", REPO / "scenarios/disaggregation.yaml", "-r", "2", "--tp", "1,x")
    assert code != 0 and "--tp takes comma-separated" in err
