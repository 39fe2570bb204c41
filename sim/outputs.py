"""Output paths, checked before any work starts: every command that writes a folder or a file.

Why a module of its own: ``cbsim run`` used to be the only command that refused a bad ``--out``
before simulating; ``capacity`` lost its whole search to a ``--json`` in an unwritable folder.
A path is checked the same way whoever writes it (``cbsim run``, ``plot``, ``calibrate``,
``validate``, ``capacity``, ``plan``, ``sweep``): it is not the wrong kind (a file where a folder
is written, or the reverse), its nearest existing ancestor is a folder this process can create
files in (tried, not guessed from permission bits: root, read-only mounts and ACLs all answer
truthfully), and its name leaves room for the hidden temporary siblings written beside it.
Nothing is created by the check itself (the probe file is removed at once).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sim.errors import CbsimError

# A results folder is written as ".<name>.tmp-XXXXXXXX" (and the old one kept as
# ".<name>.old-<pid>") beside it: the name must leave this many bytes of room below NAME_MAX.
TEMP_NAME_ROOM = 24


def check_folder(path: str | Path, what: str = "results", flag: str = "--out") -> Path:
    """The resolved folder ``path`` if ``what`` can be written into it, else a :class:`CbsimError`
    that names the path, the reason and the fix (the messages ``cbsim run`` gives)."""
    out = Path(path).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise CbsimError(f"cannot write {what} to {out}: it is a file; give a folder name ({flag} DIR)")
    _check_creatable(out, what, flag, "DIR")
    return out


def check_file(path: str | Path, what: str, flag: str) -> Path:
    """The resolved file ``path`` if it can be (re)written, else a :class:`CbsimError`."""
    out = Path(path).expanduser().resolve()
    if out.is_dir():
        raise CbsimError(f"cannot write {what} to {out}: it is a folder; give a file name ({flag} FILE)")
    _check_creatable(out, what, flag, "FILE")
    return out


def _check_creatable(out: Path, what: str, flag: str, metavar: str) -> None:
    limit = _name_max(out)
    if len(os.fsencode(out.name)) + TEMP_NAME_ROOM > limit:
        raise CbsimError(f"cannot write {what} to {out}: its name is {len(os.fsencode(out.name))} bytes; the file "
                         f"system allows {limit} per name and cbsim needs {TEMP_NAME_ROOM} of them for temporary "
                         f"files beside it; give a shorter name ({flag} {metavar})")
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise CbsimError(f"cannot write {what} into {out}: {ancestor} is a file, not a folder")
    if out.exists() and not os.access(out, os.W_OK):
        raise CbsimError(f"cannot write {what} to {out}: it is not writable; give another path ({flag} {metavar})")
    try:
        fd, probe = tempfile.mkstemp(prefix=".cbsim-write-check-", dir=ancestor)
    except OSError as exc:
        raise CbsimError(f"cannot write {what} to {out}: {exc.strerror or exc} in {ancestor}; give a path in a "
                         f"folder you may write ({flag} {metavar})") from None
    os.close(fd)
    os.unlink(probe)


def _name_max(path: Path) -> int:
    probe = path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return os.pathconf(probe if probe.is_dir() else probe.parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or an odd file system
        return 255
