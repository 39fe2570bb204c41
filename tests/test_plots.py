"""sim.plots: every PNG exists at its fixed size and shows data, `cbsim plot` redraws a saved run,
and the timeline's data shows what the seeds' chart shows (static's idle slots, Orca's refills)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex, to_rgb
from typer.testing import CliRunner

import sim
from sim.cli.main import app
from sim.errors import CbsimError
from sim.plots import FILES, png_size, timeline_data, write_all
from sim.plots.latency import ecdf
from sim.plots.paged import plot_paged_vs_contiguous
from sim.plots.series import step_series
from sim.plots.style import PHASE_COLORS, policy_colors
from sim.results import RunResult

REPO = Path(__file__).resolve().parents[1]

# 30 requests into 40 blocks of 16 tokens: every kind of policy, with preemption and swapping
SMALL_PAGED = {
    "name": "small-paged", "seed": 3, "model": "tiny", "hardware": {"gpu": "cpu"},
    "latency": {"backend": "constant", "step_s": 0.02},
    "workload": {"num_requests": 30, "arrival": {"process": "poisson", "rate": 20.0},
                 "prompt_tokens": {"dist": "uniform", "min": 16, "max": 200},
                 "output_tokens": {"dist": "uniform", "min": 4, "max": 60}, "max_tokens": 64},
    "engine": {"block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 256, "max_model_len": 512,
               "num_gpu_blocks": 40, "swap_space_gib": 0.001},
    "policies": [{"name": "static", "batch_size": 4}, {"name": "orca"},
                 {"name": "vllm-v0", "label": "v0-recompute"},
                 {"name": "vllm-v0", "preemption": "swap", "label": "v0-swap"},
                 {"name": "vllm-v1"}, {"name": "sarathi", "chunk_size": 64}],
}


@pytest.fixture(scope="module")
def toy() -> RunResult:
    return sim.run(REPO / "scenarios" / "seed_toy.yaml")


@pytest.fixture(scope="module")
def paged() -> RunResult:
    result = sim.run(SMALL_PAGED)
    s = result.summaries
    assert s["vllm-v1"]["preemptions"] > 0 and s["v0-swap"]["swapped_blocks"] > 0, "the fixture must stress memory"
    return result


# --- the PNGs ---------------------------------------------------------------------------------
def read_rgb(path: Path) -> np.ndarray:
    return mpimg.imread(path)[..., :3]


def pixel_variance(path: Path) -> float:
    return float(read_rgb(path).mean(axis=2).var())


def share_of_colour(path_or_rgb, colour: str) -> float:
    """Share of pixels painted in ``colour`` at least half opaque over white (antialiased lines
    blend into the background, so an exact match would miss a thin line)."""
    rgb = read_rgb(path_or_rgb) if isinstance(path_or_rgb, Path) else path_or_rgb
    d = rgb.reshape(-1, 3).astype(np.float32) - 1.0
    v = np.array(to_rgb(colour)) - 1.0
    a = d @ v / (v @ v)
    residual = np.abs(d - a[:, None] * v).max(axis=1)
    return float(((a > 0.5) & (residual < 0.06)).mean())


def check_png(path: Path, size: tuple[int, int], colours) -> None:
    assert path.exists(), f"{path.name} was not written"
    rgb = read_rgb(path)
    height, width = rgb.shape[:2]
    assert (width, height) == size, f"{path.name} is {width}x{height}, expected {size[0]}x{size[1]}"
    assert float(rgb.mean(axis=2).var()) > 0.005, f"{path.name} is blank"
    for colour in colours:  # the data is drawn, not only empty axes
        assert share_of_colour(rgb, colour) > 3e-4, f"{path.name} shows no {colour}"


def test_the_blank_check_can_fail(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 7), dpi=100)
    fig.savefig(tmp_path / "blank.png")
    assert pixel_variance(tmp_path / "blank.png") < 1e-6
    fig.subplots().plot([0, 1], [0, 1], color="#0072B2")
    fig.savefig(tmp_path / "line.png")
    assert share_of_colour(tmp_path / "blank.png", "#0072B2") == 0
    assert share_of_colour(tmp_path / "line.png", "#0072B2") > 3e-4


def expected_colours(result, key):
    if key == "timeline":
        return [PHASE_COLORS[p] for p in ("queued", "prefill", "decode")]
    colours = policy_colors(result.labels)
    if key == "paged_vs_contiguous":
        return [colours["orca"], colours["vllm-v1"]]
    return list(colours.values())


def test_write_all_on_the_seed_toy(toy, tmp_path):
    written = write_all(toy, tmp_path)
    assert sorted(p.name for p in written) == sorted(
        FILES[k] for k in ("utilization", "kv", "latency_cdf", "timeline"))  # both policies are contiguous
    for key, name in FILES.items():
        if (tmp_path / name).exists():
            check_png(tmp_path / name, png_size(key, toy), expected_colours(toy, key))


def test_write_all_on_a_paged_run(paged, tmp_path):
    written = write_all(paged, tmp_path)
    # capacity.png needs the saturated blocks `cbsim run` measures (test_capacity_figure_*); kv_tiers.png
    # a policy with KV tiers (tests/test_kv_tiers.py)
    assert sorted(p.name for p in written) == sorted(v for k, v in FILES.items() if k not in ("capacity", "kv_tiers"))
    assert png_size("timeline", paged) == (1200, 2100)  # taller: six policies
    for key, name in FILES.items():
        if key not in ("capacity", "kv_tiers"):
            check_png(tmp_path / name, png_size(key, paged), expected_colours(paged, key))


def test_timeline_only_for_small_runs(toy, tmp_path):
    names = {p.name for p in write_all(toy, tmp_path, max_requests=5)}
    assert "timeline.png" not in names and "utilization.png" in names


def test_paged_vs_contiguous_needs_both_kinds(toy, paged):
    assert plot_paged_vs_contiguous(toy) is None
    only_paged = RunResult(paged.scenario, paged.requests[paged.requests["policy"] == "vllm-v1"],
                           paged.steps[paged.steps["policy"] == "vllm-v1"],
                           {"vllm-v1": paged.summaries["vllm-v1"]}, {"vllm-v1": paged.meta["vllm-v1"]})
    assert plot_paged_vs_contiguous(only_paged) is None
    assert plot_paged_vs_contiguous(paged) is not None


def test_figures_do_not_pile_up_in_pyplot(toy, tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    write_all(toy, tmp_path)
    toy.plot_timeline()
    assert plt.get_fignums() == before


def test_run_result_forwards_plot_methods(toy):
    from matplotlib.figure import Figure

    for name in ("plot_utilization", "plot_kv", "plot_latency_cdfs", "plot_timeline"):
        assert isinstance(getattr(toy, name)(), Figure)
    assert toy.plot_paged_vs_contiguous() is None


def test_a_policy_keeps_its_colour_across_figures(paged):
    util_axes = paged.plot_utilization().axes
    kv_axes = paged.plot_kv().axes
    for i, label in enumerate(paged.labels):
        batch_line = util_axes[i].get_lines()[0]
        assert to_hex(batch_line.get_color()) == policy_colors(paged.labels)[label].lower()
        assert to_hex(kv_axes[i].get_lines()[0].get_color()) == to_hex(batch_line.get_color())
        assert kv_axes[i].get_title(loc="left").startswith(label)
        assert util_axes[i].get_title(loc="left").startswith(label)


def test_utilization_is_one_panel_per_policy_on_shared_axes(paged):
    """Six policies: six panels (small multiples), one batch curve each, the same y range, and the
    memory bound drawn where the summary puts it."""
    fig = paged.plot_utilization()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == len(paged.labels) == 6
    assert len({ax.get_ylim() for ax in axes}) == 1 and len({ax.get_xlim() for ax in axes}) == 1
    for ax, label in zip(axes, paged.labels):
        steps = paged.steps[paged.steps["policy"] == label]
        _, y = ax.get_lines()[0].get_data()
        assert np.nanmax(y) == steps["num_seqs"].max()
        hlines = {round(float(line.get_ydata()[0]), 6) for line in ax.get_lines()[2:]}
        assert round(paged.summaries[label]["memory_sequences"], 6) in hlines
        assert paged.meta[label]["max_slots"] in hlines


def saturated_fixture(result) -> RunResult:
    """``result`` with the saturated blocks `cbsim run` would attach (figures made up, distinct)."""
    summaries = {lbl: dict(s) for lbl, s in result.summaries.items()}
    for i, lbl in enumerate(result.labels):
        summaries[lbl]["saturated"] = {"rps": 2.0 + 3 * i, "vs_static": (2.0 + 3 * i) / 2.0, "burst_requests": 40,
                                       "window_s": [0.1, 1.0], "mean_batch": 4.0 + i, "batch_vs_memory": 0.1 * (i + 1),
                                       "kv_written": 0.08 * (i + 1), "kv_waste": 0.5, "mfu": 0.05, "mbu": 0.3}
    return RunResult(result.scenario, result.requests, result.steps, summaries, result.meta)


def test_capacity_figure_only_with_saturated_blocks(toy, tmp_path):
    from sim.plots import plot_capacity

    assert plot_capacity(toy) is None
    sat = saturated_fixture(toy)
    fig = plot_capacity(sat)
    ax_rate, ax_util = fig.axes[:2]
    heights = [p.get_height() for p in ax_rate.patches]
    assert heights == [2.0, 5.0]  # one bar per policy: its saturated throughput
    texts = " ".join(t.get_text() for t in ax_rate.texts)
    assert "2.5x static" in texts and fig.get_suptitle().startswith("Continuous batching serves 2.5x")
    util = [round(p.get_height(), 6) for p in ax_util.patches]
    assert util[:4] == [10.0, 8.0, 5.0, 30.0]  # static: batch vs memory, KV written, MFU, MBU (%)
    written = write_all(sat, tmp_path)
    assert tmp_path / FILES["capacity"] in written
    check_png(tmp_path / FILES["capacity"], png_size("capacity", sat), expected_colours(sat, "capacity"))


def test_cbsim_plot_redraws_the_capacity_figure_from_summary_json(toy, tmp_path):
    folder = saturated_fixture(toy).save(tmp_path / "sat", plots=False)
    res = CliRunner().invoke(app, ["plot", str(folder)])
    assert res.exit_code == 0, res.output
    assert (folder / FILES["capacity"]).exists()
    assert RunResult.load(folder).summaries["orca"]["saturated"]["rps"] == 5.0


def test_cbsim_plot_says_why_it_drew_no_timeline(paged, tmp_path):
    folder = paged.save(tmp_path / "p", plots=False)
    res = CliRunner().invoke(app, ["plot", str(folder), "--max-requests", "20"], terminal_width=300)
    assert res.exit_code == 0, res.output
    assert not (folder / FILES["timeline"]).exists()
    lines = [ln for ln in res.output.splitlines() if "timeline.png not written" in ln]
    assert len(lines) == 1 and "30 requests per policy" in lines[0] and "--max-requests 20" in lines[0]
    res = CliRunner().invoke(app, ["plot", str(folder), "--max-requests", "30"], terminal_width=300)
    assert "not written" not in res.output and (folder / FILES["timeline"]).exists()


def test_kv_marks_every_preempting_step(paged):
    fig = paged.plot_kv()
    i = paged.labels.index("vllm-v1")
    steps = paged.steps[paged.steps["policy"] == "vllm-v1"]
    marks = fig.axes[i].collections[0].get_offsets()
    assert len(marks) == int((steps["preempted"] > 0).sum()) > 0
    np.testing.assert_allclose(np.sort(marks[:, 0]), np.sort(steps.loc[steps["preempted"] > 0, "start_s"]))


# --- `cbsim plot` -----------------------------------------------------------------------------
def test_cbsim_plot_redraws_a_saved_run(toy, tmp_path):
    folder = toy.save(tmp_path / "toy", plots=False)
    assert not list(folder.glob("*.png"))
    runner = CliRunner()
    res = runner.invoke(app, ["plot", str(folder)])
    assert res.exit_code == 0, res.output
    loaded = RunResult.load(folder)
    for key in ("utilization", "kv", "latency_cdf", "timeline"):
        check_png(folder / FILES[key], png_size(key, loaded), expected_colours(loaded, key))
    res = runner.invoke(app, ["plot", str(folder), "--out", str(tmp_path / "elsewhere")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "elsewhere").glob("*.png")) == sorted(p.name for p in folder.glob("*.png"))


def test_cbsim_plot_names_a_folder_that_is_not_a_result(tmp_path):
    res = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert isinstance(res.exception, CbsimError)
    assert "not a cbsim results folder" in str(res.exception)


def test_save_writes_the_plots(toy, tmp_path):
    folder = toy.save(tmp_path / "with-plots")
    assert {p.name for p in folder.glob("*.png")} == {FILES[k] for k in ("utilization", "kv", "latency_cdf", "timeline")}


# --- what the timeline draws --------------------------------------------------------------------
def bars_of(tl, row):
    b = tl.bars[tl.bars["row"] == row].sort_values("start_s")
    return [(p, s, e) for p, s, e in zip(b["phase"], b["start_s"], b["end_s"])]


def test_seed_toy_static_shows_idle_slots_and_no_refill(toy):
    tl = timeline_data(toy, "static")
    s = tl.slots
    assert s["busy"].tolist() == [3, 3, 3, 1, 1, 1, 1, 1, 3, 3, 1, 1]  # 22 of 36 slot-steps
    # steps 4-8: two slots idle while R4-R6 wait behind R2 (head-of-line blocking)
    assert s["idle_waiting"].tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 0, 0, 0, 0]
    assert s["joined"].tolist() == [3, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]  # whole batches only
    assert not s["refill"].any()
    assert bars_of(tl, 3) == [("queued", 0, 8), ("prefill", 8, 9), ("decode", 9, 12)]  # R4
    assert bars_of(tl, 1) == [("prefill", 0, 1), ("decode", 1, 8)]  # R2, the long one


def test_seed_toy_orca_refills_freed_slots(toy):
    tl = timeline_data(toy, "orca")
    s = tl.slots
    assert s["busy"].tolist() == [3, 3, 3, 3, 3, 3, 3, 1]  # 22 of 24
    assert s["joined"].tolist() == [3, 0, 0, 2, 0, 1, 0, 0]
    assert s.loc[s["refill"], "step"].tolist() == [3, 5]  # R4, R5 join at step 4, R6 at step 6 (0-based 3, 5)
    assert s["idle_waiting"].sum() == 0
    assert bars_of(tl, 3) == [("queued", 0, 3), ("prefill", 3, 4), ("decode", 4, 7)]  # R4
    assert bars_of(tl, 5) == [("queued", 0, 5), ("prefill", 5, 6), ("decode", 6, 7)]  # R6


@pytest.mark.parametrize("label", [p.get("label", p["name"]) for p in SMALL_PAGED["policies"]])
def test_bars_tile_each_request_from_arrival_to_finish(paged, label):
    tl = timeline_data(paged, label)
    req = paged.requests[paged.requests["policy"] == label].set_index("id")
    for rid, b in tl.bars.groupby("id"):
        b = b.sort_values("start_s")
        r = req.loc[rid]
        assert b["start_s"].iloc[0] == pytest.approx(r["arrival_s"])
        assert b["end_s"].iloc[-1] == pytest.approx(r["finish_s"])
        np.testing.assert_allclose(b["start_s"].iloc[1:], b["end_s"].iloc[:-1])  # no gap, no overlap
        assert (b["phase"] == "preempted").sum() <= r["preemptions"]
    phases = set(tl.bars["phase"])
    if label in ("static", "orca"):  # every running request computes in every step
        assert not phases & {"stalled", "preempted"}
    if label.startswith("v0"):  # prefill-only steps pause running decodes
        assert "stalled" in phases
    if paged.summaries[label]["preemptions"]:
        assert "preempted" in phases or label == "sarathi"


def synthetic(preemptions: int) -> RunResult:
    """One request on one replica; five 1 s steps; it sits out steps 3 and 4."""
    steps = pd.DataFrame({"policy": "p", "replica": 0, "step": range(5), "start_s": [0.0, 1, 2, 3, 4],
                          "duration_s": 1.0, "num_seqs": [1, 1, 0, 0, 1], "admitted": [1, 0, 0, 0, 0],
                          "waiting": 0, "running": 1, "finished": [0, 0, 0, 0, 1]})
    requests = pd.DataFrame({"policy": ["p"], "id": ["a"], "replica": [0], "arrival_s": [0.0], "admitted_s": [0.0],
                             "first_token_s": [1.0], "finish_s": [5.0], "state": ["finished"],
                             "preemptions": [preemptions], "token_times_s": [[1.0, 2.0, 5.0]]})
    return RunResult(SimpleNamespace(name="synthetic", slo=None), requests, steps, {"p": {}}, {"p": {"max_slots": 1}})


@pytest.mark.parametrize(("preemptions", "phase"), [(0, "stalled"), (1, "preempted")])
def test_a_gap_between_tokens_is_stalled_or_preempted(preemptions, phase):
    tl = timeline_data(synthetic(preemptions))
    assert bars_of(tl, 0) == [("prefill", 0, 1), ("decode", 1, 2), (phase, 2, 4), ("decode", 4, 5)]


# --- helpers ----------------------------------------------------------------------------------
def test_one_bin_mean_is_the_summary_utilization(paged):
    for label in paged.labels:
        steps = paged.steps[paged.steps["policy"] == label]
        util = steps["num_seqs"] / paged.meta[label]["max_slots"]
        _, y = step_series(steps, util, exact_max_steps=0, bins=1)
        assert y[0] == pytest.approx(paged.summaries[label]["utilization"]["slots"])


def test_exact_series_breaks_at_idle_gaps():
    steps = pd.DataFrame({"replica": 0, "start_s": [0.0, 1.0, 5.0], "duration_s": [1.0, 1.0, 2.0]})
    t, y = step_series(steps, [1, 2, 3])
    assert t.tolist()[:4] == [0, 1, 1, 2] and y.tolist()[:4] == [1, 1, 2, 2]
    assert np.isnan(y[4]) and t[5:].tolist() == [5, 7] and y[5:].tolist() == [3, 3]


def test_ecdf_counts_missing_values_in_the_denominator():
    x, y = ecdf([3.0, 1.0, np.nan, 2.0], n_total=4)
    assert x.tolist() == [1, 2, 3] and y.tolist() == [0.25, 0.5, 0.75]
