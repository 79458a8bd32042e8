"""One way to replace a file atomically: write a temporary file in the same directory, then
rename it over the target. A reader (another process, a restarted worker, a task's wrapper)
never sees half a file, and a failed write leaves the previous file as it was and no
temporary file behind.

The temporary file is made by ``tempfile.mkstemp`` (a unique name, mode 0600), so two
writers never share one and the result is private whatever the umask; the name starts with a
dot and ``.<target name>.`` so a listing of ``*.json`` or ``*.csv`` never picks one up.

Not used by ``workers/executors/wrapper.py``, which runs as ``python -I wrapper.py`` and
imports the standard library only (see there).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scratch_path(
    near: str | os.PathLike[str], *, suffix: str = "", mkdir: bool = False
) -> Iterator[str]:
    """Yields the path of a fresh temporary file in the directory of ``near`` (same file
    system, so it can be renamed there), removed when the block ends whatever happens.
    ``mkdir`` creates missing parent directories (otherwise a missing one raises
    ``FileNotFoundError``); creating the file raises ``OSError`` before the block runs."""
    target = Path(near)
    if mkdir:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        yield tmp
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextmanager
def atomic_path(
    path: str | os.PathLike[str], *, suffix: str = "", mkdir: bool = False
) -> Iterator[str]:
    """:func:`scratch_path` next to ``path`` that replaces ``path`` when the block ends
    without an exception. For writers that need a file name rather than a stream (DuckDB's
    ``COPY ... TO``, a download); ``suffix`` keeps an extension a writer looks at
    (``.parquet``)."""
    with scratch_path(path, suffix=suffix, mkdir=mkdir) as tmp:
        yield tmp
        # private whatever the writer did: DuckDB's COPY replaces the file with the umask's
        # mode (0644 beside the CSV export's 0600 before this)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)


def write_atomic(
    path: str | os.PathLike[str], data: str | bytes, *, fsync: bool = True, mkdir: bool = True
) -> None:
    """Writes ``data`` (text as UTF-8) to ``path`` through a temporary file and a rename.

    ``fsync`` (the default) makes the content durable before the rename, so after a crash
    the file is the old one or the new one, never empty. Callers that write often and make
    durability their own business pass ``fsync=False``: the worker's task records (fsynced
    in one batch before anything is reported) and its liveness file (rewritten on every
    contact; only running processes read it)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, mkdir=mkdir) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(raw)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
