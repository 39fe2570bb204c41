"""cbsim's simulator: scenarios, workloads, latency models, the SimPy engine, metrics and plots.

``sim.run(scenario)`` is the one-call API the CLI and the notebooks share.
"""

from __future__ import annotations

__all__ = ["run"]


def run(scenario, **kwargs):
    """Run a scenario (a YAML path, a dict or a Scenario) and return a RunResult."""
    from sim.runner import run as _run

    return _run(scenario, **kwargs)
