"""Importers that turn published measurements into cbsim latency-table folders, one module per source."""
