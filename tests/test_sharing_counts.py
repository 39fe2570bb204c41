"""``shareable_tokens`` counts implicit keys from the ids (sim.workload.sharing, issue 33: no tuple
per request for a million requests) and must give exactly what the definition gives: every
request's keys built, a Counter of the requests holding each."""

from __future__ import annotations

import random
from collections import Counter

from sim.workload.request_spec import RequestSpec
from sim.workload.sharing import _keys, shareable_tokens


def _by_definition(specs):
    keyed = [_keys(s) for s in specs]
    holders: Counter = Counter()
    for runs, out in keyed:
        holders.update({k for k, _ in runs} | {out})
    result = []
    for runs, out in keyed:
        t, own = 0, None
        for key, n in runs:
            if holders[key] == 1:
                own = t
                break
            t += n
        if own is None and holders[out] == 1:
            own = t
        result.append(own)
    return result


def test_equals_the_definition_on_workloads_whose_keys_collide():
    """Duplicate ids, empty prompts, explicit runs and output keys naming other requests' implicit
    keys (and their own): all the ways an implicit key's holder count can exceed one."""
    rng = random.Random(1)
    seen = Counter()
    for _ in range(3000):
        n = rng.randint(1, 8)
        specs = []
        for _ in range(n):
            rid = f"r{rng.randint(0, 5)}"
            runs = out = None
            if rng.random() < 0.5:
                keys = [("req", f"r{rng.randint(0, 5)}"), ("out", f"r{rng.randint(0, 5)}"), ("group", 1)]
                runs = tuple((rng.choice(keys), rng.choice([0, 2, 3])) for _ in range(rng.randint(0, 3)))
            if rng.random() < 0.3:
                out = rng.choice(
                    [("req", f"r{rng.randint(0, 5)}"), ("out", f"r{rng.randint(0, 5)}"), ("o", 1)]
                )
            specs.append(RequestSpec(rid, 0.0, rng.choice([0, 1, 5]), 1, 1, 0, runs, out))
        got = shareable_tokens(specs)
        assert got == _by_definition(specs), specs
        seen.update("none" if g is None else "zero" if g == 0 else "later" for g in got)
    assert min(seen.values()) > 500  # every outcome exercised


def test_distinct_implicit_requests_are_their_own_from_token_zero():
    specs = [RequestSpec(f"r{i}", 0.0, 10, 1, 1) for i in range(5)] + [RequestSpec("r9", 0.0, 0, 1, 1)]
    assert shareable_tokens(specs) == [0] * 6
    twice = [RequestSpec("a", 0.0, 10, 1, 1), RequestSpec("a", 0.0, 10, 1, 1)]
    assert shareable_tokens(twice) == [None, None] == _by_definition(twice)
