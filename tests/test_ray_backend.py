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

from sim.planning.sweep import make_points, sweep
from tests.helpers import small_scenario

SMALL = small_scenario(seed=4)


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
