"""Files that hold commands, tokens or logs are private to the user that runs Klique.

The daemon's DuckDB file and its WAL hold every task's command and environment, the task logs
hold whatever the tasks print, a worker's state dir holds its leases and logs, and ``kliqued
dev`` writes tokens. With the usual umask (022) all of them would be world-readable. The cause
is the process's umask, so ``kliqued serve``, ``kliqued dev`` and ``klique-worker`` set 077 at
start (files 0600, directories 0700, also those made by DuckDB and by libraries), and the
places that create such files also pass explicit modes, which hold whatever the umask.

Processes a worker starts for tasks get the umask the worker was started with: a user's job
writing shared results must not find them private all of a sudden.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
FILE_MODE = 0o600
DIR_MODE = 0o700

_original_umask: int | None = None


def private_umask() -> int:
    """Sets the umask to 077 (idempotent); returns the umask the process started with."""
    global _original_umask
    old = os.umask(PRIVATE_UMASK)
    if _original_umask is None:
        _original_umask = old
    return _original_umask


def original_umask() -> int:
    """The umask before ``private_umask``: what task processes get. Without a call to
    ``private_umask`` it is the current one."""
    if _original_umask is not None:
        return _original_umask
    current = os.umask(0o022)
    os.umask(current)
    return current


def private_dir(path: str | Path) -> Path:
    """Creates ``path`` (and missing parents, 0700) and makes ``path`` itself 0700. For
    directories dedicated to Klique: a worker's state dir and its parts, ``<db>.logs/``,
    ``kliqued dev``'s directory. A shared directory (sticky bit, like /tmp) or one owned by
    another user is never changed."""
    p = Path(path)
    p.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    st = p.stat()
    if (
        st.st_mode & 0o777 != DIR_MODE
        and not st.st_mode & stat.S_ISVTX
        and st.st_uid == os.geteuid()
    ):
        _chmod(p, DIR_MODE)
    return p


def tighten(path: str | Path, mode: int = FILE_MODE) -> None:
    """Makes an existing file (or directory) of ours ``mode`` when it is more open, e.g. a
    database created by an earlier version with 0644. Missing files are no error."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if st.st_mode & 0o777 & ~mode:
        _chmod(Path(path), mode)


def open_private(path: str | Path, flags: int) -> int:
    """``os.open`` with mode 0600 (kept whatever the umask); an existing file more open than
    that is tightened."""
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, FILE_MODE)
    except OSError:
        pass  # not ours (another owner): leave it, the write itself decides
    return fd


def _chmod(p: Path, mode: int) -> None:
    try:
        os.chmod(p, mode)
    except PermissionError:
        pass  # owned by someone else (a shared parent): not ours to change
