"""The ``cbsim`` command line: :mod:`sim.cli.app` (the typer app), :mod:`sim.cli.main` (the entry
point that turns every error into one line and an exit code), and one module per command."""
