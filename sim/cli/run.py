"""``cbsim run X.yaml``: simulate every policy of a scenario and compare them in one table."""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app


def _session_ttft(s) -> str:
    ss = s.get("sessions")
    if not ss:
        return "-"
    return f"{_fmt(ss['first_turn']['ttft_p50_s'], 1e3)} / {_fmt(ss['returning_turns']['ttft_p50_s'], 1e3)}"


def _kv(s, fn) -> str:
    k = s.get("kv_tiers")
    return fn(k) if k else "-"


def _tier_hits(s) -> str:
    return _kv(s, lambda k: " / ".join(f"{name} {t['hit_tokens']:,}" for name, t in k["tiers"].items()))


def _tier_bytes(s) -> str:
    gib = 1 << 30
    return _kv(s, lambda k: " / ".join(f"{name} {t['bytes_written'] / gib:,.1f} / {t['bytes_read'] / gib:,.1f}"
                                       for name, t in k["tiers"].items()))


def _fmt(v, scale: float = 1.0, digits: int = 3) -> str:
    """Numbers a person reads at a glance: no exponents, thousands separated."""
    if v is None:
        return "-"
    if not isinstance(v, float):
        return str(v)
    x = v * scale
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}g}"


def comparison_table(result):
    """The rich table `cbsim run` prints: one column per policy."""
    from rich.table import Table

    slo = result.scenario.slo
    t = Table(title=f"{result.scenario.name}: {len(result.requests) // max(len(result.labels), 1)} requests",
              header_style="bold")
    t.add_column("metric")
    for label in result.labels:
        t.add_column(label, justify="right")
    rows = [
        ("finished / refused / invalid / unfinished", _ends),
        ("throughput (req/s)", lambda s: _fmt(s["throughput_rps"])),
        ("output tokens/s", lambda s: _fmt(s["output_tps"], digits=4)),
        ("goodput (req/s)", lambda s: _fmt(s["goodput_rps"])),
        ("TTFT p50 / p99 (ms)", lambda s: f"{_fmt(s['ttft_s']['p50'], 1e3)} / {_fmt(s['ttft_s']['p99'], 1e3)}"),
        ("TPOT p50 / p99 (ms)", lambda s: f"{_fmt(s['tpot_s']['p50'], 1e3)} / {_fmt(s['tpot_s']['p99'], 1e3)}"),
        ("ITL p99 (ms)", lambda s: _fmt(s["itl_s"]["p99"], 1e3)),
        ("E2E p50 / p99 (s)", lambda s: f"{_fmt(s['e2e_s']['p50'])} / {_fmt(s['e2e_s']['p99'])}"),
        ("batch vs memory (of the seqs KV holds)", _batch_vs_memory),
        ("KV holding written tokens", lambda s: _pct(s["utilization"].get("kv_written"))),
        ("slot utilization (of its own max)", lambda s: _pct(s["utilization"]["slots"])),
        ("KV utilization", lambda s: _pct(s["utilization"]["kv"])),
        ("KV waste (reserved, unused)", lambda s: _pct(s["kv_waste"])),
        ("mean batch (sequences per step)", lambda s: _fmt(s["mean_batch"])),
        ("MFU / MBU", lambda s: f"{_pct(s['utilization']['mfu'])} / {_pct(s['utilization']['mbu'])}"),
        ("steady state: offered / achieved (req/s)", _steady_rates),
        ("preemptions", lambda s: str(s["preemptions"])),
        ("recomputed tokens", lambda s: str(s.get("recomputed_tokens", 0))),
        ("prompt tokens computed (prefill / prompt)", lambda s: _pct((s.get("prefix_reuse") or {}).get("computed_share"))),
        ("prefix-cache hit rate", lambda s: _pct((s.get("prefix_reuse") or {}).get("hit_rate"))),
        ("swapped blocks", lambda s: str(s["swapped_blocks"])),
        ("steps", lambda s: str(s["steps"])),
    ]
    if any(result.summaries[label].get("stopped", "drained") != "drained" for label in result.labels):
        rows.insert(1, ("ended", _ended))
        rows.insert(2, ("backlog: queued / running / not arrived",
                        lambda s: "{queued} / {running} / {not_arrived}".format(**s["backlog"])))
    if any(result.summaries[label].get("speculative") for label in result.labels):
        rows.insert(rows.index(next(r for r in rows if r[0] == "E2E p50 / p99 (s)")) + 1,
                    ("speculative: acceptance / mean length", _acceptance))
        rows.insert(rows.index(next(r for r in rows if r[0] == "E2E p50 / p99 (s)")) + 2,
                    ("speculative: tokens per verify step", lambda s: _spec(s, "tokens_per_step")))
    if any(result.summaries[label].get("sessions") for label in result.labels):
        rows.insert(rows.index(next(r for r in rows if r[0] == "TTFT p50 / p99 (ms)")) + 1,
                    ("sessions: TTFT p50 first / returning (ms)", _session_ttft))
    if any(result.summaries[label].get("kv_tiers") for label in result.labels):
        at = rows.index(next(r for r in rows if r[0] == "swapped blocks")) + 1
        rows[at:at] = [("KV tiers: hit tokens by tier", _tier_hits),
                       ("KV tiers: GiB written / read", _tier_bytes),
                       ("KV tiers: load per request p50 (ms)", lambda s: _kv(s, lambda k: _fmt(k["load_s_p50"], 1e3)))]
    if slo is not None and any(getattr(slo, k) is not None for k in ("ttft_s", "tpot_s", "e2e_s")):
        said = {True: "yes", False: "NO", None: "-"}
        rows.append((f"meets SLO (p{slo.percentile:g}), whole run", lambda s: said[s["slo_met"]]))
        rows.append((f"meets SLO (p{slo.percentile:g}), steady window", _steady_verdict))
    for name, fn in rows:
        t.add_row(name, *[fn(result.summaries[label]) for label in result.labels])
    return t


def _ends(s: dict) -> str:
    """Refused: turned away for the load (429), late in every verdict; invalid: rejected for the
    request itself (too long), out of the verdicts."""
    refused = s.get("requests_refused", 0)
    invalid = s.get("requests_invalid", s["requests_rejected"] - refused)
    return f"{s['requests_finished']} / {refused} / {invalid} / {s['requests_unfinished']}"


def _steady_verdict(s: dict) -> str:
    """What capacity, plan and sweep judge: the steady window (warm-up and drain left out)."""
    st = s.get("steady") or {}
    if st.get("slo_met") is None:
        return "- (run too short)"
    return "yes" if st["slo_met"] else "NO"


def _acceptance(s: dict) -> str:
    spec = s.get("speculative")
    if not spec:
        return "-"
    return f"{_pct(spec['acceptance_rate'])} / {_fmt(spec['mean_acceptance_length'])}"


def _spec(s: dict, key: str) -> str:
    spec = s.get("speculative")
    return _fmt(spec[key]) if spec else "-"


def _batch_vs_memory(s: dict) -> str:
    v, mem = s["utilization"].get("batch_vs_memory"), s.get("memory_sequences")
    return "-" if v is None else f"{_pct(v)} of {mem:,.0f}"


def _steady_rates(s: dict) -> str:
    st = s.get("steady") or {}
    if st.get("offered_rps") is None:
        return "- (run too short)"
    return f"{_fmt(st['offered_rps'])} / {_fmt(st['achieved_rps'])}"


def _ended(s: dict) -> str:
    stopped = s.get("stopped", "drained")
    if stopped in ("horizon", "time cap"):
        return f"{stopped} at {_fmt(float(s['end_s']))} s"
    return stopped


def backlog_notes(result) -> list[str]:
    """One line per policy that refused requests for the load (how many, and the first one's
    reason: they count as infinitely late in the SLO verdicts), one per policy that rejected
    requests invalid on their own (left out of the verdicts), one per policy that cut outputs
    short (how many, and why), and one per policy that left requests unfinished (how many,
    where they were, and why). Every reason is in requests.parquet."""
    notes = []
    for label in result.labels:
        s = result.summaries[label]
        reqs = result.requests
        mine = reqs[(reqs["policy"] == label) & (reqs["state"] == "rejected")]
        refused = mine["refused"].astype(bool) if "refused" in mine else None
        for kind, rows, tail in (
                ("refused for the load (late in every SLO verdict)",
                 mine[refused] if refused is not None else mine.iloc[:0], ""),
                ("rejected on their own (left out of the SLO verdicts)",
                 mine[~refused] if refused is not None else mine, "")):
            if len(rows):
                first = rows.iloc[0]
                more = f" (and {len(rows) - 1} more; see requests.parquet)" if len(rows) > 1 else tail
                notes.append(f"{label}: {len(rows)} requests {kind}: {first['id']}: {first['reason']}{more}")
        notes += cut_notes(label, s, result.scenario)
        if s["requests_unfinished"]:
            counts = s.get("unfinished_reasons", {})
            end = s.get("end_s")
            words = {"horizon": f"when horizon_s ({_fmt(end)} s) was reached" if end is not None else "at the horizon",
                     "time_cap": f"when the default time cap ({_fmt(end)} s) was reached" if end is not None
                     else "at the default time cap",
                     "stuck": "stuck: the policy could not schedule them"}
            why = "; ".join(f"{n} still held {words[k]}" if k in ("horizon", "time_cap") else f"{n} {words.get(k, k)}"
                            for k, n in counts.items() if n)
            b = s.get("backlog", {})
            left = (f" (queued {b['queued']}, running {b['running']}, not arrived {b['not_arrived']})"
                    if b else "")
            notes.append(f"{label}: {s['requests_unfinished']} requests unfinished{left}: {why}")
    if any(result.summaries[label].get("stopped") == "time cap" for label in result.labels):
        from sim.runner import CAP_HINT

        notes.append(f"({CAP_HINT})")
    return notes


def cut_notes(label: str, s: dict, scn) -> list[str]:
    """Every request cbsim shortened, counted with why: synthetic prompts clipped to the context
    (``workload_cuts``) and outputs the engine stopped before their own end (``requests_cut``)."""
    notes = []
    mml = scn.engine.max_model_len
    own = "" if "max_model_len" in scn.engine.model_fields_set else ", the model's context length"
    for why, n in (s.get("workload_cuts") or {}).items():
        notes.append(f"{label}: {n} synthetic prompts {why} ({mml:,}{own}); their tails were never sent")
    cut = s.get("requests_cut") or {}
    if cut.get("max_model_len"):
        notes.append(f"{label}: {cut['max_model_len']} outputs cut where prompt + output reached engine.max_model_len "
                     f"({mml:,}{own}), as vLLM stops them (finish reason length); raise engine.max_model_len "
                     f"or shorten the prompts to serve them whole")
    if cut.get("max_tokens"):
        notes.append(f"{label}: {cut['max_tokens']} outputs stopped at the client's max_tokens "
                     f"(workload.max_tokens or the trace's) before their own end")
    return notes


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


@app.command("run")
def run_cmd(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    policy: list[str] = typer.Option(None, "--policy", "-p", help="run only this policy label (repeatable)"),
    set_: list[str] = typer.Option(None, "--set", help="override a field: a.b.c=value, policies.0.batch_size=16"),
    out: Path = typer.Option(None, "--out", "-o", help="results folder (default: results/<scenario name>)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the resolved scenario and workload statistics; simulate nothing"),
    no_plots: bool = typer.Option(False, "--no-plots", help="skip writing PNG plots"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    json_: bool = typer.Option(False, "--json", help="print each policy's summary (summary.json's content) as JSON "
                               "on stdout; the table and notes go to stderr"),
):
    """Simulate a scenario's policies on one workload; print a comparison table; write results."""
    from sim.cli.output import console_for, natural_width, print_json, show_table
    from sim.runner import run
    from sim.scenario.schema import load_scenario

    console = console_for(json_)
    scn = load_scenario(scenario, list(set_ or []))
    if dry_run:
        from sim.scenario.resolved import resolve
        from sim.workload.synthetic import build_workload, workload_stats

        # soft_wrap: never re-wrap the YAML at the terminal width (it must stay copy-pasteable)
        console.print(scn.to_yaml(), highlight=False, markup=False, soft_wrap=True)
        stats = workload_stats(build_workload(scn))
        limits = resolve(scn).limits
        gpu_blocks, cpu_blocks = limits.num_gpu_blocks, limits.num_cpu_blocks
        console.print("[bold]workload[/]")
        for k, v in stats.items():
            console.print(f"  {k}: {v}", highlight=False, soft_wrap=True)
        console.print(f"[bold]KV cache[/]: {gpu_blocks} GPU blocks of {scn.engine.block_size} tokens, "
                      f"{cpu_blocks} CPU swap blocks", highlight=False)
        return
    from sim.results import RunResult

    target = RunResult.check_target(out or Path("results") / scn.name)  # refuse before a long run
    result = run(scn, policies=policy or None, progress=not quiet and not json_)  # stdout holds the JSON alone
    import os

    # piped or logged: room for every policy's column, not 80 columns (an explicit COLUMNS is obeyed:
    # a table wider than it is stacked, sim.cli.output)
    table = comparison_table(result)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = max(console.width, natural_width(console, table))
    show_table(console, table)
    for note in backlog_notes(result):
        console.print(f"[yellow]{note}[/]", highlight=False)
    from sim.planning import story

    if story.applies(result.scenario) and policy is None:  # static vs continuous: the capacity ratio
        with console.status("measuring each policy's saturated throughput ..."):
            saturated = story.measure(result.scenario)
        story.attach(result, saturated)  # summary.json's `saturated` blocks: the capacity plot reads them
        for line in story.story(result, saturated):
            console.print(line, highlight=False, soft_wrap=True)  # piped: never cut a number in two
    result.save(target, plots=not no_plots)
    if json_:
        print_json({"scenario": result.scenario.name, "results": str(target),
                    "policies": {label: result.summaries[label] for label in result.labels}})
    shown = out or Path("results") / scn.name
    console.print(f"results: {shown}/ (requests.parquet, steps.parquet, summary.json, scenario.yaml"
                  f"{', plots' if not no_plots else ''})", highlight=False)
