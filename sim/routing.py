"""Routers: which replica a new request goes to (scenario key ``replicas.router``).

A router is a callable ``router(spec, replicas) -> index`` that the engine calls once per
arrival, at the arrival time, with the replicas' live state. Every router here is
deterministic: the same workload gives the same assignment in any process, on any machine, so a
sweep point gives the same result on the local and the Ray backend. Ties always go to the
lowest replica index.

* ``round-robin``: request ``k`` (in arrival order) goes to replica ``k mod N``.
* ``least-outstanding``: the replica with the fewest requests handed to it and not yet ended
  (queued or running), as load balancers' "least outstanding requests" do.
* ``least-kv``: the replica with the smallest fraction of its KV blocks in use; ties (idle
  replicas all at 0 %, or queued requests that hold no KV yet) are broken by outstanding
  requests, then index. KV usage is what a KV-aware router (e.g. the vLLM production stack's)
  reads from each engine's metrics.
* ``prefix-affinity``: requests whose prompts start with the same run (the first
  ``prompt_runs`` key: a shared system prompt or conversation) go to the same replica, so that
  replica's prefix cache serves them; the replica is a stable hash of that key (BLAKE2b of its
  ``repr``: not Python's ``hash``, which is salted per process). A request with no shared
  prefix falls back to ``least-outstanding``: one without ``prompt_runs``, or whose first run is
  its own unique content (key ``("req", id)``, the convention of ``policies.base.Request`` and
  ``sim.workload.synthetic`` for a prompt that shares nothing), since hashing unique prompts would only
  scatter them at random.
  **Sessions** (``RequestSpec.session`` >= 0) stick instead to the replica that served their
  previous turn, which holds their history's KV (on the GPU or in its offload tiers), unless the
  fleet is imbalanced, when the turn goes to the least-outstanding replica and the session moves
  there. Imbalanced is SGLang's cache-aware router's rule (sgl-model-gateway,
  ``policies/cache_aware.rs``: "(max - min) > abs_threshold and max > rel_threshold * min" on
  the workers' loads), with its defaults ``balance_abs_threshold`` 64 and
  ``balance_rel_threshold`` 1.5 and the load read as requests outstanding. A session's first turn
  goes to the least-outstanding replica (its system prompt is cached wherever sessions ran).
  vLLM's production-stack router (``--routing-logic session``) and Dynamo's KV router keep a
  session on the replica with its KV the same way; Dynamo weighs the overlap against load in a
  cost, SGLang switches on the thresholds, which is what is modelled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from sim.errors import CbsimError, nearest

Router = Callable[[object, Sequence[object]], int]


def round_robin() -> Router:
    count = [0]

    def route(spec, replicas) -> int:
        idx = count[0] % len(replicas)
        count[0] += 1
        return idx

    route.reads_kv_state = False  # reads no replica state (sim.engine: a stretch may contain an arrival)
    return route


def _least_outstanding_index(replicas) -> int:
    return min(range(len(replicas)), key=lambda i: (replicas[i].outstanding, i))


def least_outstanding() -> Router:
    def route(spec, replicas) -> int:
        return _least_outstanding_index(replicas)

    route.reads_kv_state = False  # outstanding changes only when a request ends, at a step's end
    return route


def kv_load(replica) -> float:
    """Fraction of a replica's usable KV blocks in use."""
    total = replica.policy.kv_blocks_total()
    return replica.policy.kv_blocks_used() / total if total else 0.0


def least_kv() -> Router:
    def route(spec, replicas) -> int:
        return min(range(len(replicas)), key=lambda i: (kv_load(replicas[i]), replicas[i].outstanding, i))

    return route


def prefix_key(spec):
    """The key of a request's first prompt run, or None when it has no shareable prefix."""
    runs = getattr(spec, "prompt_runs", None)
    if not runs:
        return None
    key = runs[0][0]
    if key == ("req", spec.id):  # the request's own content: shared with nobody
        return None
    return key


def stable_bucket(key, n: int) -> int:
    """A process-independent hash of ``key`` into ``range(n)``."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n


BALANCE_ABS_THRESHOLD = 64  # sgl-model-gateway defaults (CacheAware policy config)
BALANCE_REL_THRESHOLD = 1.5


def imbalanced(replicas) -> bool:
    """SGLang's cache-aware router's test: (max - min) > abs and max > rel * min (outstanding)."""
    loads = [r.outstanding for r in replicas]
    lo, hi = min(loads), max(loads)
    return hi - lo > BALANCE_ABS_THRESHOLD and hi > BALANCE_REL_THRESHOLD * lo


def prefix_affinity() -> Router:
    home: dict[int, int] = {}  # session -> the replica that served its last turn

    def route(spec, replicas) -> int:
        session = getattr(spec, "session", -1)
        if session >= 0:
            idx = home.get(session)
            if idx is None or imbalanced(replicas):
                idx = _least_outstanding_index(replicas)
            home[session] = idx
            return idx
        key = prefix_key(spec)
        if key is None:
            return _least_outstanding_index(replicas)
        return stable_bucket(key, len(replicas))

    return route


ROUTERS: dict[str, Callable[[], Router]] = {
    "round-robin": round_robin,
    "least-outstanding": least_outstanding,
    "least-kv": least_kv,
    "prefix-affinity": prefix_affinity,
}


def make_router(name: str) -> Router:
    """A fresh router (routers keep state, e.g. round-robin's counter: one per simulation)."""
    try:
        return ROUTERS[name]()
    except KeyError:
        raise CbsimError(f"unknown router {name!r} (replicas.router){nearest(name, ROUTERS)}; "
                         f"routers: {', '.join(ROUTERS)}") from None
