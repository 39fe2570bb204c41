"""What ``cbsim capacity`` and ``cbsim plan`` share (not a command itself).

Both search, one policy per worker (local processes or Ray), over full simulations of a scenario
that has an SLO, and can write their answer as JSON; so they take the same options, defined here
once, and write the JSON the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

ScenarioArg = Annotated[Path, typer.Argument(help="scenario YAML file (with an slo: section)")]
PolicyOpt = Annotated[list[str], typer.Option("--policy", "-p", help="only this policy label (repeatable)")]
SetOpt = Annotated[list[str], typer.Option("--set", help="override a field: a.b.c=value")]
BackendOpt = Annotated[str, typer.Option("--backend", help="local or ray")]
RayAddressOpt = Annotated[str, typer.Option("--ray-address", help="an existing Ray cluster (with --backend ray)")]
SeedsOpt = Annotated[int, typer.Option("--seeds", help="workload seeds judged at every probe (seed, seed+1, ...); "
                                       "a load passes only when every seed passes, and the spread is printed")]


def spread_text(spread: dict | None) -> str:
    """``p99 TTFT 0.76-1.06 s over seeds 0-3`` (the binding percentile's min and max over the seeds)."""
    if not spread or spread.get("min") is None:
        return "-"
    metric = spread["metric"].removesuffix("_s").upper()
    scale, unit = (1e3, "ms") if spread["metric"] == "tpot_s" else (1.0, "s")
    seeds = [row[0] for row in spread["per_seed"]]
    lo, hi = spread["min"] * scale, spread["max"] * scale
    if len(seeds) == 1:  # the first seed failed: the others were not judged (sim.planning.probe.judge_seeds)
        return f"p{spread['percentile']:g} {metric} {lo:.3g} {unit} at seed {seeds[0]} (the first to miss)"
    return f"p{spread['percentile']:g} {metric} {lo:.3g}-{hi:.3g} {unit} over seeds {seeds[0]}-{seeds[-1]}"


def spread_notes(label: str, spread: dict | None, bound: float | None) -> list[str]:
    """One line per seed that failed where another passed: the verdict sits near the SLO edge."""
    if not spread:
        return []
    failed = [row for row in spread["per_seed"] if not row[1]]
    if not failed or len(failed) == len(spread["per_seed"]):
        return []
    seeds = ", ".join(str(row[0]) for row in failed)
    return [f"{label}: seed(s) {seeds} missed the SLO where the others met it ({spread_text(spread)}"
            + (f" against {bound:g} s" if bound is not None else "") + "): the verdict sits near the SLO edge"]


def workers_option(what: str):
    return typer.Option(None, "--workers", "-j", help=f"policies {what} in parallel (default: min(policies, CPUs))")


def search_display(console, scn, policies, workers: int | None, backend: str, title: str,
                   disaggregated: bool = False, seeds: int = 1):
    """What a search shows while it runs: the probe line (``sim.cli.search_progress``) when every
    probe runs in this process (one worker), else a spinner (workers must not inherit a display
    thread: they are forked). A search of one policy in this process with 3 or more ``seeds``
    and ``--workers`` left to its default gets the spare cores for its seeds
    (:mod:`sim.planning.seed_pool`), forked here before the display starts."""
    import contextlib
    import os

    from sim.cli.search_progress import SearchProgress
    from sim.planning.capacity import labels_of
    from sim.planning.progress import reporting
    from sim.planning.seed_pool import seed_workers

    cpus = os.cpu_count() or 1
    n = workers or min(len(labels_of(scn, policies or None, disaggregated)), cpus)
    if backend != "local" or n > 1:
        return console.status(f"{title} ({n} policies in parallel) ...")
    reporter = SearchProgress(console, title)
    stack = contextlib.ExitStack()
    if workers is None and seeds >= 3:
        stack.enter_context(seed_workers(min(cpus - 1, seeds - 2)))
    stack.enter_context(reporter)
    stack.enter_context(reporting(reporter))
    return stack


def load(scenario: Path, set_: list[str] | None):
    """The scenario with the ``--set`` overrides applied."""
    from sim.scenario.schema import load_scenario

    return load_scenario(scenario, list(set_ or []))


def json_to_stdout(path: Path | None) -> bool:
    """``--json -``: the JSON goes to stdout, alone."""
    return path is not None and str(path) == "-"


def check_json(path: Path | None) -> None:
    """Refuse a ``--json`` path that cannot be written before the search starts, not after it."""
    if path is not None and not json_to_stdout(path):
        from sim.outputs import check_file

        check_file(path, "the results", "--json")


def write_json(console, path: Path | None, payload: dict) -> None:
    """``--json PATH``: write ``payload`` there (making its folder) and say where."""
    if path is None:
        return
    if json_to_stdout(path):
        from sim.cli.output import print_json

        print_json(payload)
        return
    from sim.errors import CbsimError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n")
    except OSError as exc:  # the folder changed under the search: still one line
        raise CbsimError(f"cannot write the results to {path}: {exc.strerror or exc}") from None
    console.print(f"results: {path}", highlight=False)
