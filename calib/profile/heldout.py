"""Held-out error: how well the finished table prices random mixed batches it was not built from.

Why a module of its own: the grid measures components one at a time, but the simulator prices
mixed steps; this check prices measured mixed batches through
:class:`sim.latency.table.TableLatency` itself, so the reported error is the simulator's.
"""

from __future__ import annotations

import numpy as np

from calib.profile.plan import Job, ProfileSpec


def heldout_error(spec: ProfileSpec, model_spec, table, jobs: list[Job], step_gap: float):
    """The held-out mixed batches' medians against the table's price (less step_gap)."""
    import warnings

    from policies.base import StepPlan
    from sim.hardware.gpus import get_gpu
    from sim.latency.base import step_shape
    from sim.latency.table import TableExtrapolationWarning, TableLatency

    lat = TableLatency(table, model_spec, get_gpu("cpu"), spec.tp, spec.block_size)
    rows = []
    for job in jobs:
        plan = StepPlan(num_new_tokens=[n for n, _ in job.shapes], context=[c for _, c in job.shapes])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TableExtrapolationWarning)
            predicted = lat.price(step_shape(plan), plan)[0] - step_gap
        rows.append({"shapes": [list(s) for s in job.shapes], "measured_s": job.median, "predicted_s": predicted})
    real = np.array([r["measured_s"] for r in rows])
    pred = np.array([r["predicted_s"] for r in rows])
    rel = (pred - real) / real
    err = {
        "mean_abs_rel": round(float(np.mean(np.abs(rel))), 4),
        "p90_abs_rel": round(float(np.percentile(np.abs(rel), 90)), 4),
        "n": len(rows),
        "measured_on": (f"{len(rows)} random mixed batches (prefill chunks + decodes of unequal contexts, seed "
                        f"{spec.seed + 1}), off the grid, each measured whole (median over the sweep's rounds) "
                        f"and priced by the table less step_gap"),
        "sum_rel": round(float(pred.sum() / real.sum() - 1), 4),
    }
    return err, rows
