"""The capacity KV offloading buys on sessions (``cbsim capacity`` on a small variant of
``scenarios/sessions.yaml``), the pairing of entries with and without tiers, and the hits-by-tier
plot's data (read back from the matplotlib figure, not just the file's existence)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.planning.tier_gain import tier_pairs
from sim.runner import run
from sim.scenario.schema import load_scenario

# sessions.yaml time-scaled to a size a test affords: one H100 whose GPU cache holds 32k tokens,
# 32 GiB of host memory (256k tokens), sessions of 3-5 turns 5 s apart on a 2,000-token system
# prompt (probes grow from 40 sessions until their starts span two session lifetimes)
SMALL = [
    "replicas.count=1",
    "engine.num_gpu_blocks=2048",
    "engine.kv_offloading_size=32",
    "workload.sessions.count=40",
    "workload.sessions.turns={dist: uniform, min: 3, max: 5}",
    "workload.sessions.think_time_s={dist: exponential, mean: 5.0}",
    "workload.sessions.new_tokens={dist: uniform, min: 500, max: 1500}",
    "workload.sessions.output_tokens={dist: uniform, min: 50, max: 150}",
    "workload.sessions.system_prompt={num_groups: 2, tokens: 2000}",
]


def cli(*args):
    from sim.cli.main import app

    return CliRunner().invoke(app, list(args), terminal_width=200)


def test_capacity_states_the_gain_of_offloading_on_sessions(repo, tmp_path):
    path = repo / "scenarios" / "sessions.yaml"
    sets = [x for s in SMALL for x in ("--set", s)]
    r = cli(
        "capacity",
        str(path),
        "--tolerance",
        "0.25",
        "--seeds",
        "1",
        "--workers",
        "1",
        "--json",
        str(tmp_path / "cap.json"),
        *sets,
    )
    assert r.exit_code == 0, r.output
    out = json.loads((tmp_path / "cap.json").read_text())
    on, off = out["policies"]["offload"], out["policies"]["no-offload"]
    # offloading sustains a session rate at which the GPU-only entry already violates the SLO
    assert on["rate_rps"] > off["violating_rate_rps"]
    [gain] = out["tier_gains"]
    assert (gain["with"], gain["without"], gain["metric"]) == ("offload", "no-offload", "rate_rps")
    assert gain["gain"] == pytest.approx(on["rate_rps"] / off["rate_rps"]) and gain["gain"] > 1.25
    assert f"KV tiers: offload sustains {gain['gain']:.2f}x the capacity of no-offload" in r.output
    assert "sessions/s" in r.output


def test_entries_pair_by_policy_and_knobs_but_the_tier_switch():
    scn = load_scenario("scenarios/sessions.yaml")
    assert tier_pairs(scn) == [("offload", "no-offload")]
    # no twin without tiers: no pair (engine.kv_offloading_size unset: every vllm-v1 entry is GPU only)
    bare = load_scenario("scenarios/sessions.yaml", ["engine.kv_offloading_size=null"])
    assert tier_pairs(bare) == []
    sg = load_scenario(
        "scenarios/sessions.yaml",
        [
            "engine.kv_offloading_size=null",
            "policies=[{name: sglang, label: hicache, enable_hierarchical_cache: true}, {name: sglang, label: radix}, "
            "{name: sglang, label: lpm, schedule_policy: lpm}]",
        ],
    )
    assert tier_pairs(sg) == [("hicache", "radix")]  # lpm differs in another knob


def test_the_hits_by_tier_plot_stacks_what_the_requests_say():
    from sim.plots.kv_tiers import BINS, SOURCES, plot_kv_tiers

    res = run("scenarios/sessions.yaml", [*SMALL, "workload.arrival.rate=1.0"])
    fig = plot_kv_tiers(res)
    axes = [a for a in fig.axes if a.get_visible()]
    assert [a.get_title(loc="left").split(":")[0] for a in axes] == ["offload", "no-offload"]
    req = res.requests
    edges = np.linspace(0.0, float(req["admitted_s"].max()), BINS + 1)
    for ax, label in zip(axes, res.labels):
        assert [c.get_label() for c in ax.collections] == [name for name, _ in SOURCES]
        r = req[req["policy"] == label]
        parts = (
            r["prompt_tokens"] - r["prefix_hit_tokens"],
            r["prefix_hit_tokens"] - r["tier_hit_tokens"],
            r["tier_hit_tokens"],
        )
        for coll, w in zip(ax.collections, parts):
            x, y = coll.get_paths()[0].vertices.T
            area = 0.5 * abs(
                np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))
            )  # token-seconds / s = tokens
            per_bin = np.histogram(r["admitted_s"], bins=edges, weights=w.to_numpy(dtype=float))[0]
            # a step="mid" fill spans the bin centres: the first and last bins count half
            assert area == pytest.approx(per_bin.sum() - (per_bin[0] + per_bin[-1]) / 2, rel=1e-9, abs=1e-6)
        assert bool(r["tier_hit_tokens"].sum() > 0) is (label == "offload")
