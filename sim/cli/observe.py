"""``cbsim observe SCENARIO --url URL --out RUN``: replay a scenario's workload against a live
OpenAI-compatible server and record what it did (:mod:`sim.observe.session`).

Exit codes: 0 when every request was measured; 1 when the run is incomplete (a request failed, the
server died, stopped answering or refused requests), with one line saying why and the run file
holding what was measured; 2 for bad input; 130 after Ctrl-C (the run file is written first).
"""

from __future__ import annotations

from pathlib import Path

import typer

from sim.cli.app import app

INCOMPLETE = 1


@app.command("observe")
def observe_cmd(
    scenario: Path = typer.Argument(..., help="scenario YAML whose workload is sent (the same arrivals and "
                                              "lengths as `cbsim run`)"),
    url: str = typer.Option(..., "--url", help="the server, e.g. http://127.0.0.1:8000"),
    out: Path = typer.Option(..., "--out", "-o", help="run file to write (JSON, format: "
                                                       "sim/recorded/request_run.py)"),
    model: str = typer.Option(None, "--model", "-m", help="served model name (default: the first on /v1/models)"),
    api: str = typer.Option("completions", "--api", help="completions (/v1/completions) or chat "
                                                          "(/v1/chat/completions)"),
    prompts: str = typer.Option("auto", "--prompts", help="auto (token ids where the server takes them, else "
                                                           "text), token-ids, or text"),
    read_timeout: float = typer.Option(120.0, "--read-timeout", help="seconds a request may wait for the server's "
                                                                     "next bytes before it counts as failed"),
    content_seed: int = typer.Option(None, "--content-seed", help="seed of the prompts' token content (default: "
                                                                  "fresh each run, recorded in RUN, so a repeat "
                                                                  "never hits the prefix cache an earlier run "
                                                                  "left on the server)"),
    set_: list[str] = typer.Option(None, "--set", help="override a scenario field, a.b.c=value"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
):
    """Send a scenario's requests to a live server on the wall clock; record every token's arrival."""
    from rich.console import Console

    from sim.errors import CbsimError
    from sim.observe.session import observe
    from sim.scenario.schema import load_scenario

    if read_timeout <= 0:
        raise CbsimError(f"--read-timeout: must be > 0 seconds, got {read_timeout:g}")
    console = Console(soft_wrap=True)
    scn = load_scenario(scenario, list(set_ or []))
    with _Progress(not quiet) as bar:
        try:
            obs = observe(scn, url, out, model_name=model, api=api, prompts=prompts, read_timeout_s=read_timeout,
                          content_seed=content_seed, on_change=bar.update)
        except KeyboardInterrupt:
            bar.stop()
            err = Console(stderr=True, soft_wrap=True)
            err.print(f"interrupted: what was measured is in {out} (marked incomplete)", highlight=False,
                      markup=False)
            raise
    report(console, obs)
    if not obs.complete:
        err = Console(stderr=True, soft_wrap=True)
        err.print(f"error: the run is incomplete: {obs.document['incomplete_reason']}; what was measured is in "
                  f"{out}", highlight=False, markup=False)
        raise typer.Exit(INCOMPLETE)


def report(console, obs) -> None:
    doc = obs.document
    reqs = doc["requests"]
    lag = doc["observe"]["send_lag_s"]
    n = len(reqs) + len(doc["unmeasured_requests"])
    console.print(f"{len(reqs)} of {n} requests measured ({doc['observe']['prompt_mode']} prompts); send lag "
                  f"mean {_ms(lag['mean'])}, p99 {_ms(lag['p99'])}, max {_ms(lag['max'])}", highlight=False,
                  markup=False)
    cfg, src = doc["config"], doc["config_sources"]
    console.print(f"server: block size {cfg['block_size']}, {cfg['num_gpu_blocks']} usable KV blocks "
                  f"({src['num_gpu_blocks']}), max_model_len {cfg['max_model_len']}, preemptions "
                  f"{doc['server']['preemptions']}", highlight=False, markup=False)
    if reqs:
        import numpy as np

        ttft = np.array([r["first_token_s"] - r["arrival_s"] for r in reqs])
        e2e = np.array([r["last_token_s"] - r["arrival_s"] for r in reqs])
        tpot = [(r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in reqs
                if r["output_tokens"] > 1]
        console.print(f"TTFT mean {ttft.mean():.3f} s, TPOT mean {_ms(float(np.mean(tpot)) if tpot else None)}, "
                      f"E2E mean {e2e.mean():.3f} s", highlight=False, markup=False)
    console.print(f"run: {obs.path}", highlight=False, markup=False)


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.2f} ms"


class _Progress:
    """A rich progress bar of finished requests, with in-flight and failed counts."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.task = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task("observing", total=None)
        return self

    def update(self, records) -> None:
        if self.bar is None:
            return
        done = sum(r.state in ("finished", "failed") for r in records)
        flying = sum(r.state == "sent" for r in records)
        failed = sum(r.state == "failed" for r in records)
        self.bar.update(self.task, completed=done, total=len(records),
                        description=f"observing: {flying} in flight, {failed} failed")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def __exit__(self, *exc):
        self.stop()
        return False
