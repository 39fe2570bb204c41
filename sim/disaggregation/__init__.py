"""Prefill/decode disaggregation: a topology of two pools of replicas with a KV transfer between them.

DESIGN.md: "Disaggregation is a topology, not a policy." Each instance is the engine's own
:class:`sim.engine.Replica` loop driving an unmodified policy; what this package adds is the story
between the pools: the routers, the hand-off of a request's KV blocks and the links they cross.
``handoff`` (what one request carries from pool to pool), ``topology`` (the SimPy processes),
``results`` (frames and summary), ``run`` (from a scenario to results).
"""
