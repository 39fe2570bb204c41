"""Each module here registers one ``cbsim`` subcommand on :data:`sim.cli.app`."""

from sim.commands import conformance, policies, run  # noqa: F401
from sim.commands import plot  # noqa: F401
