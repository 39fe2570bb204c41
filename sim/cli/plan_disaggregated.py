"""``cbsim plan X.yaml --target-rate R --disaggregated [--tp 1,2]``: the cheapest xPyD split
meeting the SLO at R, against the scenario's colocated policies on the same GPUs
(:mod:`sim.planning.disagg_plan`). A helper of the ``plan`` command, not a command of its own."""

from __future__ import annotations


def parse_tp(text: str | None) -> list[int] | None:
    from sim.errors import CbsimError

    if text is None:
        return None
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise CbsimError(f"--tp takes comma-separated tensor-parallel sizes (1,2,4), got {text!r}") from None
    if not values or min(values) < 1:
        raise CbsimError(f"--tp takes tensor-parallel sizes of at least 1, got {text!r}")
    return values


def print_disaggregated_plan(console, scn, target_rate: float, max_replicas: int, tp: str | None,
                             policies, json_out, workers: int | None = None, seeds: int = 1) -> None:
    """The plan's table and notes; with ``seeds`` > 1 a ``spread`` column and a seeds line (with
    ``seeds`` = 1 neither, as before seeds were judged here)."""
    from rich.table import Table

    from sim.cli import search_options as shared
    from sim.cli.output import show_table
    from sim.cli.search_progress import SearchProgress
    from sim.planning.disagg_plan import DEFAULT_JOBS, plan_disaggregated

    reporter = SearchProgress(console, f"planning xPyD splits for {target_rate:g} req/s")
    p = plan_disaggregated(scn, target_rate, tp_choices=parse_tp(tp), max_instances=max_replicas,
                           policies=policies or None, jobs=DEFAULT_JOBS if workers is None else workers,
                           reporter=reporter, seeds=seeds)
    price = scn.cost_per_gpu_hour
    dis = scn.disaggregation
    gpu = {pool: str((getattr(dis, pool).hardware or scn.hardware).gpu) for pool in ("prefill", "decode")}
    t = Table(title=f"{scn.name}: {target_rate:g} req/s, disaggregated (prefill on {gpu['prefill']}, decode on "
                    f"{gpu['decode']}) against colocated on {scn.hardware.gpu}", header_style="bold")
    cols = ["layout", "split", "TP", "GPUs", "SLO"]
    if price is not None:
        cols += ["cost/h", "cost/1M req"]
    cols += ["p99 TTFT s", "p99 TPOT ms"]
    if seeds > 1:
        cols.append(f"spread over {seeds} seed(s)")
    for c in cols:
        t.add_column(c, justify="left" if c == "layout" else "right")

    def money(gpus):
        if price is None:
            return []
        if gpus is None:
            return ["-", "-"]
        return [f"{gpus * price:,.2f}", f"{gpus * price / (3600 * target_rate) * 1e6:,.2f}"]

    def p99(d):
        if not d:
            return ["-", "-"]
        ttft, tpot = d.get("ttft_s"), d.get("tpot_s")
        return ["-" if ttft is None else f"{ttft:.3g}", "-" if tpot is None else f"{tpot * 1e3:.3g}"]

    def spread(d):
        return [shared.spread_text(d)] if seeds > 1 else []

    b = p.best
    if b is None:
        t.add_row("disaggregated", f"> {p.max_instances}P{p.max_instances}D", "-", "-", "no",
                  *money(None), "-", "-", *spread(None))
    else:
        t.add_row("disaggregated", p.split, f"{b.prefill_tp} / {b.decode_tp}", str(b.gpus), "yes",
                  *money(b.gpus), *p99(b.p99), *spread(b.spread))
    for label, c in p.colocated.items():
        if c["replicas"] is None:
            t.add_row(f"{label}, cheapest", f"> {c['max_replicas']}", "-", "-", "no",
                      *money(None), "-", "-", *spread(None))
        else:
            t.add_row(f"{label}, cheapest", str(c["replicas"]), str(c["tensor_parallel"]),
                      str(c["gpus"]), "yes", *money(c["gpus"]), *p99(c["p99"]), *spread(c["spread"]))
        same = c["same_gpus"]
        if same is not None:
            t.add_row(f"{label}, same GPUs", str(same["replicas"]), str(same["tensor_parallel"]),
                      str(same["gpus"]), "yes" if same["met"] else "NO", *money(same["gpus"]), *p99(same["p99"]),
                      *spread(same["spread"]))
    show_table(console, t)
    for label, c in p.colocated.items():
        same = c["same_gpus"]
        if same is not None and not same["met"] and same.get("saturated"):
            console.print(f"{label} colocated on {same['gpus']} GPUs violates the SLO: each of its {same['replicas']} "
                          f"replicas would get {target_rate / same['replicas']:.3g} req/s, at or above its saturated "
                          f"throughput {same['saturated_rps']:.3g} req/s", highlight=False)
        elif same is not None and not same["met"]:
            bits = [f"p{scn.slo.percentile:g} {m.removesuffix('_s').upper()} {v:.3g} s > {bound:g} s"
                    if v is not None else f"{m.removesuffix('_s').upper()}: no value (requests left unfinished)"
                    for m, (v, bound) in same["violations"].items()]
            console.print(f"{label} colocated on {same['gpus']} GPUs violates the SLO: "
                          f"{', '.join(bits) or 'requests left unfinished'}", highlight=False)
    if not p.stable:
        shaky = ", ".join(f"{x.prefill}P{x.decode}D" if x.decode else f"{x.prefill} × TP{x.prefill_tp} colocated"
                          for x in p.probes if not x.stable)
        console.print(f"[yellow]note:[/] the verdict of {shaky} still changed between the two largest probe sizes "
                      "(up to 32 × workload.num_requests): uncertain there; raise workload.num_requests",
                      highlight=False)
    for x in p.probes:  # layouts that one seed failed and another passed: near the SLO edge
        name = f"{x.prefill}P{x.decode}D" if x.decode else f"{x.prefill} × TP{x.prefill_tp} colocated"
        bound = getattr(scn.slo, x.spread["metric"], None) if x.spread else None
        for n in shared.spread_notes(name, x.spread, bound):
            console.print(f"[yellow]note:[/] {n}", highlight=False)
    if seeds > 1:
        console.print(f"seeds: every layout judged at seeds {scn.seed}-{scn.seed + seeds - 1} and met only when every "
                      f"seed met (in order: the first seed that missed ends a layout's probe; saturation bursts at seed "
                      f"{scn.seed}); spread = the binding percentile's min-max over the seeds judged; p99 figures of the first seed that missed, else of seed {scn.seed}",
                      highlight=False, soft_wrap=True)
    console.print(f"{p.runs} runs; every layout shown was simulated at {target_rate:g} req/s and judged in steady state "
                  "(requests arriving after warm-up and before drain; probe sizes doubled from workload.num_requests "
                  "until two agree; a load at or above the layout's saturated throughput violates). GPUs = instances "
                  "× TP; cost = GPUs × cost_per_gpu_hour for each hour"
                  + ("" if price is not None else " (set cost_per_gpu_hour for money figures)"), highlight=False,
                  soft_wrap=True)
    shared.write_json(console, json_out, {"scenario": scn.name, "target_rate_rps": target_rate,
                                          "disaggregated": p.to_dict()})
