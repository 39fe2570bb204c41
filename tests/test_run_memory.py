"""What a run keeps per request while it summarizes: nothing but the frames. The per-request
records and, for the last policy entry, the workload's specs are let go once the frames are
built (sim.runner.run_policy), so a long run's peak memory is its frames, not the frames and
every record beside them (issue 33: peak RSS flat in the run's length)."""

from __future__ import annotations

import gc

import sim.runner as runner
from sim.metrics.requests import RequestRecord
from sim.workload.request_spec import RequestSpec
from tests.helpers import small_scenario


def _live(kind) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def test_records_and_specs_are_let_go_before_the_summary(monkeypatch):
    seen = []
    real = runner.summarize

    def counting(requests, steps, **kw):
        seen.append((len(requests), _live(RequestRecord), _live(RequestSpec)))
        return real(requests, steps, **kw)

    monkeypatch.setattr(runner, "summarize", counting)
    gc.collect()
    before = _live(RequestRecord), _live(RequestSpec)
    res = runner.run(small_scenario(num_requests=60))  # two policy entries on one workload
    assert [n for n, _, _ in seen] == [60, 60]
    # the first entry's summary: its own records gone, the workload kept for the second entry
    assert seen[0][1] == before[0] and seen[0][2] == before[1] + 60
    # the last entry's: neither records nor specs are left
    assert seen[1][1:] == before
    assert (res.requests["state"] == "finished").all()


def test_the_frames_do_not_depend_on_when_the_records_go():
    """The frames are built before anything is let go: the same as a Simulation's own."""
    import pandas as pd

    from sim.engine import Simulation
    from sim.runner import make_policy, policy_knobs, resolve
    from sim.scenario.schema import load_scenario
    from sim.workload.synthetic import build_workload

    scn = load_scenario(small_scenario(num_requests=40, policies=[{"name": "orca"}]))
    dep = resolve(scn)
    entry = scn.policies[0]
    limits = dep.limits_for(entry.name, policy_knobs(scn, entry))
    specs = build_workload(scn)
    sim = Simulation(specs, [(make_policy(entry.name, limits), dep.latency())], limits.max_model_len)
    direct = sim.run().requests_frame()
    res = runner.run(scn)
    pd.testing.assert_frame_equal(res.requests.drop(columns="policy"), direct)


def test_a_workload_keeps_one_int_object_per_distinct_length():
    """Lengths are Python ints kept for the whole run: one object per distinct value, not one per
    request (sim.workload.synthetic), with the values unchanged."""
    from sim.scenario.schema import load_scenario
    from sim.workload.synthetic import build_workload

    scn = small_scenario(num_requests=500)  # lengths above 256: ints CPython does not cache itself
    scn["workload"].update(
        prompt_tokens={"dist": "uniform", "min": 300, "max": 340},
        output_tokens={"dist": "uniform", "min": 300, "max": 320},
        max_tokens=1000,
    )
    scn["engine"].update(max_model_len=2048, num_gpu_blocks=1024, max_num_batched_tokens=2048)
    specs = build_workload(load_scenario(scn))
    for field in ("prompt_tokens", "output_tokens", "max_tokens"):
        values = [getattr(s, field) for s in specs]
        assert all(type(v) is int and v > 256 for v in values)
        assert len({id(v) for v in values}) == len(set(values)) < len(values)
