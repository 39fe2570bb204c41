"""Spare worker processes for the seeds of one probe: what lets a one-policy ``plan`` or
``capacity`` use the second core.

Why a module of its own: :func:`sim.planning.probe.judge_seeds` judges the seeds of a load in
order and stops at the first that fails; once the first seed meets, every later seed is needed
unless one of them fails, so they can run at once. A search of one policy runs in the calling
process (nothing else to run beside it), so the spare cores would otherwise idle. The pool is
forked once per search, before any display thread starts (:func:`sim.cli.search_options.search_display`
enters it first), and every seed it judges is the same deterministic simulation the calling
process would run: verdicts, their order and the runs counted do not change (the seeds after a
failing one are discarded, not counted).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_pool = None


@contextlib.contextmanager
def seed_workers(n: int) -> Iterator[object]:
    """``n`` forked workers for the seeds of every probe judged inside (none for ``n`` < 1),
    terminated on the way out (a seed still running after a failure is not waited for)."""
    global _pool
    if n < 1:
        yield None
        return
    from sim.planning.sweep import _pool_context

    pool = _pool_context().Pool(n, initializer=_quiet)
    before, _pool = _pool, pool
    try:
        yield pool
    finally:
        _pool = before
        pool.terminate()
        pool.join()


def current():
    """The pool of the search running in this process, or None."""
    return _pool


def _quiet() -> None:
    global _pool
    from sim.planning.progress import silence

    silence()
    _pool = None  # a worker judges its seed alone
