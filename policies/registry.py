"""Every policy by name, and the one way to build a policy from a scenario's policy entry."""

from __future__ import annotations

from typing import Any

from policies.base import EngineLimits, Policy
from policies.orca import OrcaPolicy
from policies.sarathi import SarathiPolicy
from policies.sglang import SglangPolicy
from policies.static import StaticPolicy
from policies.tgi import TgiPolicy
from policies.trtllm import TrtllmPolicy
from policies.vllm_v0 import VllmV0Policy
from policies.vllm_v1 import VllmV1Policy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        StaticPolicy,
        OrcaPolicy,
        VllmV1Policy,
        VllmV0Policy,
        SarathiPolicy,
        SglangPolicy,
        TgiPolicy,
        TrtllmPolicy,
    )
}


def make_policy(name: str, limits: EngineLimits, **knobs: Any) -> Policy:
    """The named policy; engine limits left unset (None) take that engine's own defaults."""
    cls = POLICIES[name]
    return cls(cls.resolve_limits(limits, knobs), **knobs)
