"""What a search says while it runs: the point being probed, and how far its current run is.

Why: ``plan``, ``capacity`` and ``sweep`` run many simulations back to back, some for minutes; with
no output a user takes a long search for a hung one. The searches name each point they probe
(:func:`point`: "2P3D, TP 1/1", "3 replicas", "rate 4.2 req/s") and :func:`sim.planning.probe.judge`
adds the probe size; whoever shows it (the CLI's rich line, ``sim.cli.search_progress``) installs
a :class:`Reporter` with :func:`reporting`. Nothing is shown, and nothing costs, when none is
installed (the Python API, tests, worker processes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class Reporter:
    """What a display implements. ``probe(text)``: a run starts; ``run_bar(total)``: the progress
    object :func:`sim.runner.run` ticks (requests ended) during that run, or None."""

    def probe(self, text: str) -> None:  # pragma: no cover - an interface
        pass

    def run_bar(self, total: int):  # pragma: no cover - an interface
        return None


_reporter: Reporter | None = None
_points: list[str] = []


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Install ``reporter`` for the searches run inside the block."""
    global _reporter
    previous, _reporter = _reporter, reporter
    try:
        yield
    finally:
        _reporter = previous


def silence() -> None:
    """Forget any reporter (a worker process forked from a process that shows one)."""
    global _reporter
    _reporter = None
    _points.clear()


@contextlib.contextmanager
def point(text: str) -> Iterator[None]:
    """The probes inside the block are of this point."""
    _points.append(text)
    try:
        yield
    finally:
        _points.pop()


def probe(what: str) -> object:
    """Say that a run of ``what`` ("600 requests") starts at the current point; returns what to
    pass as :func:`sim.runner.run`'s ``progress`` (False when nothing is shown)."""
    if _reporter is None:
        return False
    where = _points[-1] if _points else ""
    _reporter.probe(f"{where}: {what}" if where else what)
    return _reporter
