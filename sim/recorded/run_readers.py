"""Which reader a recorded request-level run needs, by what the path holds.

Every reader returns a :class:`sim.recorded.request_run.RequestRun`; adding a foreign format is one
entry in :data:`READERS` (a test that recognises it and a reader), nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim.errors import CbsimError
from sim.recorded.llmservingsim_bench import is_bench_folder, read_bench
from sim.recorded.request_run import FORMAT, RequestRun, looks_like_request_run, read_request_run_file

# format name -> (does this path hold it?, reader)
READERS: dict[str, tuple[Callable[[Path], bool], Callable[[Path], RequestRun]]] = {
    FORMAT: (looks_like_request_run, read_request_run_file),
    "llmservingsim-bench": (is_bench_folder, read_bench),
}


def is_request_level(path: str | Path) -> bool:
    """Whether some reader of :data:`READERS` recognises the path (else it may be a step log)."""
    p = Path(path)
    return p.exists() and any(recognises(p) for recognises, _ in READERS.values())


def read_run(path: str | Path) -> RequestRun:
    """A request-level run from a file or folder in any known format (:data:`READERS`)."""
    p = Path(path)
    if not p.exists():
        raise CbsimError(f"run {str(path)!r} does not exist; give a request-level run (cbsim-request-run JSON) or "
                         f"an LLMServingSim bench folder (holding vllm/requests.jsonl)")
    for recognises, reader in READERS.values():
        if recognises(p):
            return reader(p)
    raise CbsimError(f"{p}: not a run cbsim can read; known: {', '.join(READERS)} (format: "
                     f"sim/recorded/request_run.py)")
