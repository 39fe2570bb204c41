"""The Ray backend gives the same sweep table as local processes.

`make test` installs the `ray` extra, so Ray must be there: with CI=true a missing Ray FAILS
this test (an explicit check, not a bare importorskip), and only a developer's machine without
it skips.
"""

from __future__ import annotations

import importlib.util
import os

import pandas as pd
import pytest

from sim.sweep import make_points, sweep

SMALL = {
    "name": "small", "seed": 4, "model": "tiny", "hardware": {"gpu": "cpu"},
    "latency": {"backend": "constant", "step_s": 0.01},
    "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 5.0},
                 "prompt_tokens": {"dist": "uniform", "min": 8, "max": 64},
                 "output_tokens": {"dist": "uniform", "min": 4, "max": 40}, "max_tokens": 64},
    "engine": {"block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 256, "max_model_len": 256,
               "num_gpu_blocks": 128},
    "policies": [{"name": "static", "batch_size": 8}, {"name": "orca"}],
    "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
}


def require_ray():
    if importlib.util.find_spec("ray") is None:
        msg = "ray is not installed: `make test` installs it (pip install -e '.[ray]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    import ray

    return ray


def test_a_four_point_sweep_on_local_ray_equals_the_local_backend(tmp_path):
    ray = require_ray()
    points = make_points([4.0, 8.0, 12.0, 16.0])
    on_ray = sweep(SMALL, points, tmp_path / "ray", backend="ray", workers=2, plot=False)
    assert not ray.is_initialized(), "the sweep must shut down the Ray instance it started"
    local = sweep(SMALL, points, tmp_path / "local", backend="local", workers=2, plot=False)
    assert on_ray.ran == 4 and len(on_ray.table) == 8
    pd.testing.assert_frame_equal(on_ray.table, local.table)
    assert (tmp_path / "ray" / "sweep.parquet").read_bytes() == (tmp_path / "local" / "sweep.parquet").read_bytes()
