"""SGLang's waiting-queue orders (sglang 0.5.23 ``schedule_policy.py::SchedulePolicy.calc_priority`` L213;
reference/schedulers.md §7.4), kept apart from the scheduler because each is a small sort.

* ``fcfs``: arrival order, retracted requests at the back (they are appended when retracted).
* ``lpm``: longest cached prefix first. Every waiting request is matched against the radix
  tree; one whose own match is at most 32 tokens but that shares at least 32 tokens with an earlier
  waiting request (a throw-away tree of the waiting prompts) goes last this round, so that one of
  them computes the shared prefix and the others hit it next round
  (``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`` / ``DEPRIORITIZE_THRESHOLD`` = 32). With more than
  128 waiting requests the matching is skipped and the order is fcfs
  (``_determine_active_policy``).
* ``dfs-weight``: a node's weight is the number of waiting requests whose match ends in its
  subtree; the tree is walked heaviest child first and a node's requests follow its subtree.
* ``lof``: longest ``max_tokens`` first. ``random``: a shuffle (seeded, so runs repeat).

Sorts are stable, as Python's ``list.sort`` in SGLang.
"""

from __future__ import annotations

import random
from typing import Any

from policies.base import Request
from policies.kv.radix import RadixCache, RadixNode, request_tokens

# ``pol`` below is the calling SglangPolicy (typed Any: this module must not import it back)
SglangPolicy = Any

SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")
IN_BATCH_PREFIX_CHECK = 32
IN_BATCH_PREFIX_DEPRIORITIZE = 32
LPM_MAX_QUEUE = 128  # WAITING_QUEUE_PREFIX_MATCH_MAX


def active_policy(policy: str, queue_len: int) -> str:
    return "fcfs" if policy == "lpm" and queue_len > LPM_MAX_QUEUE else policy


def order_waiting_queue(policy: str, waiting: list[Request], pol: SglangPolicy, rng: random.Random) -> None:
    """Reorder ``waiting`` in place as SGLang's ``calc_priority`` does."""
    policy = active_policy(policy, len(waiting))
    if policy == "fcfs" or len(waiting) < 2:
        return
    if policy == "lof":
        waiting.sort(key=lambda r: -pol.max_new_tokens(r))
    elif policy == "random":
        rng.shuffle(waiting)
    elif policy == "lpm":
        deprioritized = _match_and_deprioritize(waiting, pol)
        waiting.sort(key=lambda r: float("inf") if id(r) in deprioritized else -pol._st(r).match)
    elif policy == "dfs-weight":
        _match_and_deprioritize(waiting, pol)
        waiting[:] = _dfs_weight_order(waiting, pol)


def _match_and_deprioritize(waiting: list[Request], pol: SglangPolicy) -> set[int]:
    """``_compute_prefix_matches``: the radix match of every waiting request, and the in-batch
    prefix rule."""
    sim = RadixCache(1 << 62)
    out: set[int] = set()
    for r in waiting:
        pol.init_next_round_input(r)
        if pol._st(r).match <= IN_BATCH_PREFIX_CHECK:
            seq = request_tokens(r)
            shared, _ = sim.match_prefix(seq, r.num_tokens)
            if shared >= IN_BATCH_PREFIX_DEPRIORITIZE:
                out.add(id(r))
            else:
                sim.private += r.num_tokens
                sim.insert(seq, r.num_tokens, 0)
    return out


def _dfs_weight_order(waiting: list[Request], pol: SglangPolicy) -> list[Request]:
    by_node: dict[int, list[Request]] = {}
    for r in waiting:
        by_node.setdefault(id(pol._st(r).match_node), []).append(r)
    weight: dict[int, int] = {}

    def calc(node: RadixNode) -> int:
        w = len(by_node.get(id(node), ()))
        for child in node.children.values():
            w += calc(child)
        weight[id(node)] = w
        return w

    root = pol.cache.root
    calc(root)
    out: list[Request] = []

    def emit(node: RadixNode) -> None:
        for child in sorted(node.children.values(), key=lambda c: -weight[id(c)]):
            if weight[id(child)]:
                emit(child)
        out.extend(by_node.get(id(node), ()))

    emit(root)
    return out
