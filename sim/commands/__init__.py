"""Each module here registers one ``cbsim`` subcommand on :data:`sim.cli.app` (modules whose
name starts with ``_`` hold what several commands share, and register nothing).

Helpers: add your command module to the ONE sorted import line below.
"""

from sim.commands import calibrate, capacity, conformance, plan, plot, policies, run, sweep, validate  # noqa: F401
