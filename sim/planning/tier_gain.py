"""The capacity a KV tier below the GPU buys: the ratio of an entry's capacity with its tiers on to
the same policy's with them off, when a scenario has both (``scenarios/sessions.yaml``: vLLM V1
with ``engine.kv_offloading_size`` and an entry with ``kv_offload: false``; SGLang with and without
``enable_hierarchical_cache``).

Why a module: ``cbsim capacity`` states the gain under its table (and in ``--json``), and the
pairing rule (same policy, same knobs but the tier switch) is the same for rates and for
closed-loop concurrencies.
"""

from __future__ import annotations

TIER_KNOBS = (
    "kv_offload",
    "enable_hierarchical_cache",
    "hicache_ratio",
    "hicache_size",
    "hicache_write_policy",
)


def tiers_on(scn, entry, knobs: dict) -> bool:
    """Whether this policy entry keeps KV in a tier below the GPU."""
    if entry.name == "vllm-v1":
        return scn.engine.kv_offloading_size is not None and bool(knobs.get("kv_offload", True))
    return bool(knobs.get("enable_hierarchical_cache", False))


def tier_pairs(scn) -> list[tuple[str, str]]:
    """``(label with tiers, label without)`` for each entry with tiers whose policy also runs without
    them with otherwise the same knobs (the first such entry)."""
    from sim.runner import policy_knobs

    rows = []
    for e in scn.policies:
        knobs = policy_knobs(scn, e)
        rest = {k: v for k, v in knobs.items() if k not in TIER_KNOBS}
        rows.append((e.label or e.name, e.name, tiers_on(scn, e, knobs), rest))
    pairs = []
    for label, name, on, rest in rows:
        if not on:
            continue
        off = next((lb for lb, nm, o, r in rows if nm == name and not o and r == rest), None)
        if off is not None:
            pairs.append((label, off))
    return pairs


def tier_gains(scn, results: dict) -> list[dict]:
    """Per pair searched: both capacities (``rate_rps``, or ``concurrency`` for closed loops) and their ratio."""
    out = []
    for on, off in tier_pairs(scn):
        a, b = results.get(on), results.get(off)
        if a is None or b is None:
            continue
        key = "concurrency" if a.concurrency is not None else "rate_rps"
        x, y = getattr(a, key), getattr(b, key)
        out.append(
            {
                "with": on,
                "without": off,
                "metric": key,
                "with_value": x,
                "without_value": y,
                "gain": (x / y) if y else None,
            }
        )
    return out


def gain_line(g: dict, sessions: bool) -> str:
    unit = "clients" if g["metric"] == "concurrency" else ("sessions/s" if sessions else "req/s")
    ratio = "unbounded" if g["gain"] is None else f"{g['gain']:.2f}x"
    return (
        f"KV tiers: {g['with']} sustains {ratio} the capacity of {g['without']} "
        f"({g['with_value']:.4g} vs {g['without_value']:.4g} {unit})"
    )
