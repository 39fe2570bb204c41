"""Each module here registers one ``cbsim`` subcommand on :data:`sim.cli.app`.

Helpers: add your command module to the ONE sorted import line below.
"""

from sim.commands import calibrate, capacity, conformance, plan, plot, policies, run, sweep, validate  # noqa: F401
