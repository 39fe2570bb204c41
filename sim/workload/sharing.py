"""Which part of each request's content another request of the workload can share.

Why: a prefix cache (vLLM's block hashes, SGLang's and TGI's radix trees) only ever pays off on
content two requests hold, or on a request's own content when it is recomputed after a
preemption. A request's tokens are identified by run keys (``policies.base.Request``: token ``i``
of run ``(key, n)`` is ``(key, i)``, generated token ``j`` is ``(output_key, j)``), so the whole
workload tells exactly which keys more than one request holds. From the first run whose key no
other request holds, every block's identity includes that run (a block's identity is its tokens
and everything before it), so no other request can ever hit it. ``Request.shareable_tokens`` is
that position; the KV managers skip the hashing and indexing work beyond it and decide exactly
as if they had done it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from sim.workload.request_spec import RequestSpec


def _keys(spec: RequestSpec) -> tuple[list[tuple[Any, int]], Any]:
    """The request's runs and output key as ``policies.base.Request`` fills in their defaults."""
    runs = spec.prompt_runs if spec.prompt_runs is not None else ((("req", spec.id), spec.prompt_tokens),)
    out = spec.output_key if spec.output_key is not None else ("out", spec.id)
    return [(k, n) for k, n in runs if n > 0], out


def shareable_tokens(specs: Sequence[RequestSpec]) -> list[int | None]:
    """Per request: the position from which its content is its own, or None (all may be shared:
    its prompt and output keys are all held by other requests too).

    ``holders(key)`` is the number of requests whose keys include ``key``. A request that leaves
    its runs or output key to ``Request``'s defaults holds ``("req", id)`` / ``("out", id)``;
    those keys are not built (a million requests would make two million tuples and a Counter of
    them, the largest allocation of a long run's start): they are counted from the ids, one per
    request holding them implicitly, plus the requests whose explicit keys name them."""
    if getattr(specs, "all_own", False):  # sim.workload.spec_columns: own content, distinct ids
        return [0] * len(specs)
    counted: Counter = Counter()  # explicit runs' and output keys, once per request holding them
    req_ids, out_ids = [], []  # requests holding ("req", id) / ("out", id) implicitly
    for s in specs:
        own_runs, own_out = s.prompt_runs is None, s.output_key is None
        if own_runs and s.prompt_tokens > 0:
            req_ids.append(s.id)
        if own_out:
            out_ids.append(s.id)
        if own_runs and own_out:
            continue
        runs, out = _keys(s)
        keys = {k for k, _ in runs} | {out}
        if own_runs and s.prompt_tokens > 0:
            keys.discard(("req", s.id))  # counted from req_ids
        if own_out:
            keys.discard(("out", s.id))
        counted.update(keys)
    implicit = {"req": _Holders(req_ids), "out": _Holders(out_ids)}
    del req_ids, out_ids

    def holders(key) -> int:
        n = counted.get(key, 0)
        if type(key) is tuple and len(key) == 2 and (key[0] == "req" or key[0] == "out"):
            n += implicit[key[0]](key[1])
        return n

    result: list[int | None] = []
    for s in specs:
        if s.prompt_runs is None and s.output_key is None:  # Request's defaults, not built
            t = 0
            if s.prompt_tokens > 0:
                if holders(("req", s.id)) == 1:
                    result.append(0)
                    continue
                t = s.prompt_tokens
            result.append(t if holders(("out", s.id)) == 1 else None)
            continue
        runs, out = _keys(s)
        t, own = 0, None
        for key, n in runs:
            if holders(key) == 1:
                own = t
                break
            t += n
        if own is None and holders(out) == 1:
            own = t  # the whole prompt may be shared, the generated tokens are the request's own
        result.append(own)
    return result


class _Holders:
    """How many requests hold ``(kind, id)`` implicitly: a set while every id is distinct."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = set(ids)
        self.counts = None if len(self.ids) == len(ids) else Counter(ids)

    def __call__(self, rid) -> int:
        if self.counts is not None:
            return self.counts[rid]
        return 1 if rid in self.ids else 0
