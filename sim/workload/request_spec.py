"""One request of a workload, as data: what arrives, when, and how long it really is.

The workload generators and trace readers produce these; the engine turns each into a
:class:`policies.base.Request` (which hides ``output_tokens`` from the policy). A closed-loop
request's ``arrival_s`` is NaN until a client sends it: the engine replaces the spec then, with
the send time and the client (``sim.clients``); so is a session's later turn's (turn >= 1),
unless a trace gave it a timestamp: it is sent ``think_s`` after the previous turn ended (and not
before that timestamp).
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
    client: int = -1  # closed loop: the client that sent it (sim.clients); -1: an open-loop arrival
    session: int = -1  # multi-turn sessions: the session and the turn (0-based); -1: not a session
    turn: int = -1
    think_s: float = 0.0  # a session's later turn: sent this long after the previous turn ended
    cut: str = ""  # what the workload changed in this request, and why ("": nothing; counted by the run)
