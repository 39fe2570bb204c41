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
    its prompt and output keys are all held by other requests too)."""
    keyed = [_keys(s) for s in specs]
    holders: Counter = Counter()
    for runs, out in keyed:
        holders.update({k for k, _ in runs} | {out})  # once per request that holds the key
    result: list[int | None] = []
    for runs, out in keyed:
        t, own = 0, None
        for key, n in runs:
            if holders[key] == 1:
                own = t
                break
            t += n
        if own is None and holders[out] == 1:
            own = t  # the whole prompt may be shared, the generated tokens are the request's own
        result.append(own)
    return result
