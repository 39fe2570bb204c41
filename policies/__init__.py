"""Scheduling policies: the engine's brain, with no clock, no SimPy and no torch.

``POLICIES`` maps each policy name to its class; ``make_policy`` builds one from a scenario's
policy entry.
"""
