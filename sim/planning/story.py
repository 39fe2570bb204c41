"""The capacity story `cbsim run` tells when a scenario compares static batching with continuous
batching: how many times the requests continuous batching serves on the same GPU, and why.

Why here: the comparison table of one run at one load cannot show it. At a load static batching
can carry, every policy looks alike; at one it cannot, continuous batching merely keeps up. The
figure a newcomer needs is each policy's *saturated throughput* (requests per second it finishes
when every request arrives at once: :func:`sim.planning.probe.saturated_rate`), the ceiling no
SLO can lift, and its ratio to static's. The reasons are named from the run's own figures:
*idle slots* (static computes a full batch until its longest member finishes: the padding share
of its batch tokens) and *fragmentation* (reservation policies hold KV for ``max_tokens`` that
requests never write: the reserved-but-unused share), which bound how many sequences run at once.
"""

from __future__ import annotations

CONTINUOUS = ("orca", "vllm-v1", "vllm-v0", "sarathi", "sglang", "tgi")


def applies(scn) -> bool:
    """Static and a continuous policy on a synthetic arrival process (the burst rescales it)."""
    from sim.planning.sweep import arrival_rate

    names = [e.name for e in scn.policies]
    return "static" in names and any(n in CONTINUOUS for n in names) and arrival_rate(scn) is not None


def saturated_rates(scn) -> dict[str, float | None]:
    """Label -> saturated throughput (req/s, one replica), every policy of the scenario."""
    return {label: block["rps"] for label, block in measure(scn).items()}


def measure(scn) -> dict[str, dict]:
    """Label -> the ``saturated`` block of its summary: each policy's saturated throughput and how
    full its batch, memory and GPU were while the burst ran (:func:`saturated_block`)."""
    from sim.planning.probe import saturated_run
    from sim.scenario.resolved import resolve

    gpu = resolve(scn).gpu
    out = {}
    for e in scn.policies:
        label = e.label or e.name
        res, n = saturated_run(scn, label)
        out[label] = saturated_block(res, label, n, gpu.peak_flops, gpu.hbm_bandwidth)
    base = out.get(next((e.label or e.name for e in scn.policies if e.name == "static"), ""), {}).get("rps")
    for block in out.values():
        block["vs_static"] = block["rps"] / base if base and block["rps"] else None
    return out


def saturated_block(burst, label: str, burst_requests: int, peak_flops: float, hbm_bandwidth: float) -> dict:
    """Figures of one saturated burst (every request arriving at once) over the window its
    throughput is measured in, the 10th to 90th percentile finish (:func:`sim.metrics.steady.
    saturated_throughput`): the batch refilling, not the last stragglers draining. The
    utilizations are the summary's comparable ones (:mod:`sim.metrics.summary`)."""
    import numpy as np

    from sim.metrics.steady import saturated_throughput
    from sim.metrics.summary import weighted_mean

    requests = burst.requests
    summary = burst.summaries[label]
    rps = saturated_throughput(requests)
    finish = np.sort(requests.loc[requests["state"] == "finished", "finish_s"].to_numpy(dtype=float))
    block = {"rps": rps, "burst_requests": burst_requests, "window_s": None, "mean_batch": None,
             "batch_vs_memory": None, "kv_written": None, "kv_waste": None, "mfu": None, "mbu": None}
    if rps is None:
        return block
    lo, hi = float(finish[int(0.1 * finish.size)]), float(finish[int(0.9 * finish.size)])
    steps = burst.steps
    steps = steps[(steps["start_s"] >= lo) & (steps["start_s"] < hi)]
    dur = steps["duration_s"]
    mem = summary.get("memory_sequences")
    meta = burst.meta.get(label, {})
    kv_tokens = (meta.get("kv_blocks_total") or 0) * (meta.get("block_size") or 0)
    batch = weighted_mean(steps["num_seqs"].astype(float), dur)
    reserved = steps["kv_reserved_tokens"].astype(float)
    block.update({
        "window_s": [lo, hi], "mean_batch": batch,
        "batch_vs_memory": batch / mem if batch is not None and mem else None,
        "kv_written": weighted_mean(steps["kv_used_tokens"] / kv_tokens, dur) if kv_tokens else None,
        "kv_waste": weighted_mean((reserved - steps["kv_used_tokens"]) / reserved.where(reserved > 0), dur),
        "mfu": weighted_mean(steps["flops"] / (peak_flops * dur), dur) if peak_flops else None,
        "mbu": weighted_mean(steps["bytes"] / (hbm_bandwidth * dur), dur) if hbm_bandwidth else None,
    })
    return block


def attach(result, blocks: dict[str, dict]) -> None:
    """Store each policy's ``saturated`` block in its summary (summary.json), where the quickstart
    plot (:mod:`sim.plots.capacity`) and ``cbsim plot`` read it."""
    for label, block in blocks.items():
        if label in result.summaries:
            result.summaries[label]["saturated"] = block


def story(result, saturated: dict[str, float | None]) -> list[str]:
    """Lines for `cbsim run`: the capacity ratio of each continuous policy over static, and the
    waste that explains it (from ``result``'s summaries and steps)."""
    blocks = {k: v for k, v in saturated.items() if isinstance(v, dict)}  # from :func:`measure`
    saturated = {k: (v["rps"] if isinstance(v, dict) else v) for k, v in saturated.items()}
    scn = result.scenario
    static = next((e.label or e.name for e in scn.policies if e.name == "static"), None)
    base = saturated.get(static)
    if static is None or not base:
        return []
    lines = []
    best = max((lbl for lbl in saturated if lbl != static and saturated[lbl]), key=lambda k: saturated[k],
               default=None)
    if best is not None:
        lines.append(f"continuous batching serves {saturated[best] / base:.1f}x the requests of static batching "
                     f"on this GPU ({best}: {saturated[best]:.3g} req/s vs {static}: {base:.3g} req/s saturated "
                     f"throughput, every request arriving at once)")
    lines.append("saturated throughput (req/s): " + ", ".join(
        f"{lbl} {v:.3g}" + ("" if lbl == static or not v else f" ({v / base:.1f}x static)")
        for lbl, v in saturated.items() if v))
    steps = result.steps
    for lbl in result.labels:
        s = result.summaries[lbl]
        st = steps[steps["policy"] == lbl]
        tokens = float(st["batch_tokens"].sum())
        pad = float(st["padding_tokens"].sum()) / tokens if tokens else 0.0
        why = []
        if pad > 0:
            why.append(f"idle slots: {100 * pad:.0f} % of its batch tokens are padding for finished members")
        if s["kv_waste"]:
            why.append(f"fragmentation: {100 * s['kv_waste']:.0f} % of the KV it reserves holds nothing")
        b = blocks.get(lbl)
        if b and b.get("batch_vs_memory") is not None:  # at saturation: the same yardstick for every policy
            why.append(f"saturated, its batch averages {b['mean_batch']:.3g} sequences = "
                       f"{100 * b['batch_vs_memory']:.0f} % of the {s['memory_sequences']:.0f} that KV memory "
                       f"holds at this workload's mean size, MFU {100 * (b['mfu'] or 0):.0f} %")
        else:
            why.append(f"mean batch {s['mean_batch']:.3g} sequences, MFU {100 * (s['utilization']['mfu'] or 0):.1f} %")
        lines.append(f"{lbl}: " + "; ".join(why))
    return lines
