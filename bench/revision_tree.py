"""A git revision checked out into a temporary worktree, for benches that compare two trees.

Why a worktree and not ``git stash`` / ``checkout``: the tree being measured stays as it is
(uncommitted changes included), and the other revision is a separate folder whose modules a
fresh process imports through ``PYTHONPATH``. The worktree lives under the system's temporary
folder and is removed (``git worktree remove --force``) when the block ends.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def resolve(rev: str) -> str:
    """The full commit id of ``rev``, or SystemExit with one line naming it."""
    out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=REPO,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"--compare/--against: {rev!r} is not a git revision of {REPO} "
                         f"(try a commit id, a branch or HEAD~1)")
    return out.stdout.strip()


@contextlib.contextmanager
def revision_tree(rev: str) -> Iterator[Path]:
    """Yield a folder holding ``rev``'s files (a detached worktree), removed afterwards."""
    commit = resolve(rev)
    # a `kill` (SIGTERM) unwinds through the cleanup below instead of leaving the worktree behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parent = Path(tempfile.mkdtemp(prefix="cbsim-rev-"))
    tree = parent / commit[:10]
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), commit], cwd=REPO, check=True,
                   capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, capture_output=True)
