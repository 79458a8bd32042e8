"""Task logs uploaded by workers, in files next to the database: ``<db>.logs/<task>/e<N>.log``,
one file per attempt (lease epoch N), because a worker's offsets count from 0 in each
attempt and a fenced copy must never write into the next attempt's log.

Uploads are idempotent by offset: bytes the file already has are not written again, bytes
past its end are appended, and an upload that starts past the end writes nothing and answers
the current size (the worker then sends from there). Each task's logs (all attempts) are
capped (``--log-cap``, 64 MiB by default): past it, uploads are acknowledged and dropped, and
the log ends with a line saying so. Logs are not part of the event log: a ``kill -9`` of the
daemon may lose the last chunks written, and the worker's next upload fills them in.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from klique_util.excerpt import excerpt
from klique_util.filemodes import open_private, private_dir

DEFAULT_CAP = 64 * 1024 * 1024
MAX_READ = 4 * 1024 * 1024

_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class LogStore:
    def __init__(self, root: str | Path, cap: int = DEFAULT_CAP) -> None:
        self.root = Path(root)
        self.cap = cap
        self._locks: dict[str, asyncio.Lock] = {}
        self._virtual: dict[tuple[str, int], int] = {}

    @classmethod
    def beside(cls, db: str, cap: int = DEFAULT_CAP) -> "LogStore":
        return cls(f"{db}.logs", cap)

    def dir(self, task: str) -> Path:
        if not _SAFE.match(task):
            raise ValueError(f"not a task id: {excerpt(task)}")
        return self.root / task

    def path(self, task: str, epoch: int) -> Path:
        return self.dir(task) / f"e{int(epoch)}.log"

    def epochs(self, task: str) -> list[int]:
        d = self.dir(task)
        try:
            names = os.listdir(d)
        except OSError:
            return []
        out = []
        for n in names:
            m = re.fullmatch(r"e(\d+)\.log", n)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def _task_size(self, task: str) -> int:
        total = 0
        for e in self.epochs(task):
            try:
                total += self.path(task, e).stat().st_size
            except OSError:
                pass
        return total

    def _write(self, task: str, epoch: int, offset: int, data: bytes) -> int:
        p = self.path(task, epoch)
        private_dir(p.parent)  # what a task prints is its owner's business: 0700 / 0600
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            size = 0
        virtual = max(size, self._virtual.get((task, epoch), 0))
        end = offset + len(data)
        if offset > virtual:
            return virtual  # a gap: the worker sends again from here
        if end <= virtual:
            return virtual  # already have it (a retry)
        if offset < size:
            data = data[size - offset :]  # only what the file lacks
            offset = size
        if size < offset:  # virtual bytes past the cap: dropped
            self._virtual[(task, epoch)] = end
            return end
        total = self._task_size(task)
        room = self.cap - total
        if room <= 0:  # truncated already: acknowledged, dropped
            self._virtual[(task, epoch)] = end
            return end
        with open(open_private(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as fh:
            if room >= len(data):
                fh.write(data)
            else:
                if room > 0:
                    fh.write(data[:room])
                fh.write(
                    f"\n[kliqued: log truncated: this task's logs reached "
                    f"{self.cap // (1024 * 1024)} MiB; the rest was dropped]\n".encode()
                )
                self._virtual[(task, epoch)] = end
        return max(end, size)

    async def write(self, task: str, epoch: int, offset: int, data: bytes) -> int:
        lock = self._locks.setdefault(f"{task}/{epoch}", asyncio.Lock())
        async with lock:
            return await asyncio.get_running_loop().run_in_executor(
                None, self._write, task, epoch, offset, data
            )

    def _read(self, task: str, epoch: int, offset: int, limit: int) -> tuple[bytes, int]:
        p = self.path(task, epoch)
        try:
            with open(p, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(offset)
                return fh.read(limit), size
        except FileNotFoundError:
            return b"", 0

    async def read(
        self, task: str, epoch: int, offset: int, limit: int = MAX_READ
    ) -> tuple[bytes, int]:
        """(bytes from ``offset``, at most ``limit``; the attempt's stored size)."""
        return await asyncio.get_running_loop().run_in_executor(
            None, self._read, task, epoch, offset, min(limit, MAX_READ)
        )
