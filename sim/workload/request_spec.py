"""One request of a workload, as data: what arrives, when, and how long it really is.

The workload generators and trace readers produce these; the engine turns each into a
:class:`policies.base.Request` (which hides ``output_tokens`` from the policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestSpec:
    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # where the model would emit EOS (what it would generate with no limit)
    max_tokens: int  # the client's limit (or the engine's fill-in): the engine stops the request there
    priority: int = 0
    # prompt content as runs of (key, length): equal runs = shared prefix (see policies.base)
    prompt_runs: tuple[tuple[Any, int], ...] | None = None
    output_key: Any = None
    cut: str = ""  # what the workload changed in this request, and why ("": nothing; counted by the run)
