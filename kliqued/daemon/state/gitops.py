"""GitOps reload: the daemon follows the estate as IT changes it.

- ``--estate DIR``: the directory is watched (watchfiles, debounced: an editor's save or a
  ``git pull`` that touches many files is one change);
- ``--git REPO --branch main``: the branch is polled (GitPython): fetched when the repository
  has a remote, else its local head is read; the estate is read straight from the commit's
  tree (``compiler.plan.gitsource``), never from a checkout.

Each new revision is compiled off the event loop and, when valid, applied through the same
``Daemon.prepare_estate`` as at start, as a barrier request of the sequencer: between two
passes, atomically. An invalid one is refused: an ``estate_refused`` event, its rendered
diagnostics in ``GET /v1/estate`` (``refused``) and in the log, while the running revision
keeps running. Decisions record the revision they ran under (every event carries it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from compiler.api import CompileResult, EstateReadError, SourceFile, compile_files, read_dir
from compiler.diagnostics import Position, error, plural
from compiler.plan.prices import price_impacts

from kliqued.daemon.errors import StoreAway

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    key: str
    """What was read: the commit, or a digest of the directory's files."""
    result: CompileResult
    commit: str | None = None
    label: str = ""
    """As logs and GET /v1/estate show the source, e.g. ``git repo@main 3f2a1c9``."""
    errors: list[str] = field(default_factory=list)


def _digest(files: list[SourceFile]) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f.path.encode() + b"\0" + hashlib.sha256(f.data).digest())
    return "files:" + h.hexdigest()


def _refusal(where: str, message: str, code: str = "estate-path") -> CompileResult:
    return CompileResult(None, [error(code, message, Position(where))])


def _compile(files: list[SourceFile], where: str) -> CompileResult:
    """The compiler returns diagnostics for any input; should it still raise (a bug), the
    revision is refused like any invalid one, visibly, rather than lost in the follower."""
    try:
        return compile_files(files)
    except Exception as exc:  # noqa: BLE001 - reported as a refusal, with the traceback
        log.exception("the compiler failed on %s", where)
        return _refusal(
            where,
            f"the compiler failed on this revision ({type(exc).__name__}: {exc}); please report it",
            "internal-error",
        )


class DirSource:
    """An estate directory on disk, watched."""

    def __init__(self, path: str, debounce_ms: int = 500, rescan_ms: int = 5000) -> None:
        self.path = path
        self.debounce_ms = debounce_ms
        self.rescan_ms = rescan_ms
        """Also look this often with no event: a change made between the daemon's first read
        and the watch taking hold (or one inotify does not report, on a network file system)
        is applied within this time instead of waiting for the next edit."""
        self.label = path
        self._last: Snapshot | None = None

    def read(self) -> Snapshot:
        try:
            files = read_dir(self.path)
        except EstateReadError as exc:
            return Snapshot(f"error:{exc}", _refusal(self.path, str(exc)), label=self.label)
        key = _digest(files)
        if self._last is not None and self._last.key == key:
            return self._last  # unchanged: a rescan does not compile again
        self._last = Snapshot(key, _compile(files, self.path), label=self.label)
        return self._last

    async def changes(self, stop: asyncio.Event) -> AsyncIterator[None]:
        import watchfiles

        async for _ in watchfiles.awatch(
            self.path,
            debounce=self.debounce_ms,
            step=50,
            stop_event=stop,
            recursive=True,
            ignore_permission_denied=True,
            rust_timeout=self.rescan_ms,
            yield_on_timeout=True,
        ):
            yield None


class GitSource:
    """A branch of a git repository, polled; the estate read from the commit's tree."""

    def __init__(
        self, repo: str, branch: str = "main", estate_path: str = "estate", poll_s: float = 30.0
    ) -> None:
        from compiler.plan.gitsource import normalise_estate_path

        self.repo_path = repo
        self.branch = branch
        self.estate_path = normalise_estate_path(estate_path)
        self.poll_s = poll_s
        self.label = f"git {repo}@{branch}:{self.estate_path or '.'}"
        self._repo: Any = None
        self._warned = False

    def repo(self) -> Any:
        if self._repo is None:
            from compiler.plan.gitsource import open_repo

            self._repo = open_repo(self.repo_path)
        return self._repo

    def head(self) -> Any:
        """The branch's commit: the remote's after a fetch when there is a remote, else the
        local branch."""
        from compiler.plan.gitsource import resolve

        repo = self.repo()
        if repo.remotes:
            remote = next((r for r in repo.remotes if r.name == "origin"), repo.remotes[0])
            try:
                remote.fetch(self.branch)
                self._warned = False
                return resolve(repo, f"{remote.name}/{self.branch}")
            except Exception as exc:  # the network, credentials: keep the last good one
                if not self._warned:
                    log.warning(
                        "git fetch %s %s failed (%s); trying again every %.0f s",
                        remote.name,
                        self.branch,
                        str(exc).strip().splitlines()[-1]
                        if str(exc).strip()
                        else type(exc).__name__,
                        self.poll_s,
                    )
                    self._warned = True
                raise
        return resolve(repo, self.branch)

    def read(self) -> Snapshot:
        from compiler.plan.gitsource import GitSourceError, files_at

        try:
            commit = self.head()
        except GitSourceError as exc:
            return Snapshot(f"error:{exc}", _refusal(self.repo_path, str(exc)), label=self.label)
        sha = commit.hexsha
        label = f"{self.label} {sha[:12]}"
        files = files_at(commit, self.estate_path)
        if files is None:
            return Snapshot(
                sha,
                _refusal(
                    self.estate_path or ".",
                    f"no estate at '{self.estate_path}' in commit {sha[:12]}",
                ),
                sha,
                label,
            )
        return Snapshot(sha, _compile(files, label), sha, label)

    async def changes(self, stop: asyncio.Event) -> AsyncIterator[None]:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.poll_s)
            except asyncio.TimeoutError:
                yield None


def _warn_repricing(running: Any, compiled: Any, now: int) -> None:
    """The ledger prices usage when it is read, so a price backdated into recorded usage
    reprices it: applied (a correction is legitimate), and said in the log. Never stops the
    follower: the warning is a courtesy, the revision is valid."""
    try:
        found = [i for i in price_impacts(running, compiled, now) if i.severity == "warn"]
    except Exception:  # noqa: BLE001 - logged; applying the valid revision goes on
        log.exception("could not compare the prices of %s", compiled.revision)
        return
    for i in found:
        log.warning("estate %s reprices recorded usage: %s", compiled.revision, i.message)


def rendered(result: CompileResult) -> list[str]:
    return [d.render() for d in result.errors]


class Follower:
    """Reads the source on every change, applies what is new and valid, refuses the rest."""

    def __init__(
        self, source: DirSource | GitSource, d: Any, seq: Any, last_key: str | None = None
    ) -> None:
        self.source = source
        self.d = d
        self.seq = seq
        self.last_key = last_key
        self.stop = asyncio.Event()
        self.applied = 0
        self.refused = 0

    async def check(self) -> None:
        try:
            snap = await asyncio.to_thread(self.source.read)
        except Exception as exc:
            if isinstance(self.source, GitSource):  # a fetch failed: said once; try later
                log.debug("estate source %s: %s", self.source.label, exc)
            else:
                log.exception(
                    "estate source %s could not be read; trying on its next change",
                    self.source.label,
                )
            return
        if snap.key == self.last_key:
            return
        try:
            await self._take(snap)
        except StoreAway as exc:  # nothing recorded: the next look tries this one again
            log.warning("estate %s not recorded yet: %s", snap.label, exc.message)
            self.last_key = None

    async def _take(self, snap: Snapshot) -> None:
        self.last_key = snap.key
        d = self.d
        result = snap.result
        if result.estate is None:
            errors = rendered(result)
            refused = {
                "revision": None,
                "commit": snap.commit,
                "source": snap.label,
                "errors": errors,
            }
            log.error(
                "estate refused: %s is not valid (%s); still running %s:\n%s",
                snap.label,
                plural(len(errors), "error"),
                d.estate.revision,
                "\n".join(errors),
            )
            await self.seq.submit(lambda now, ov: d.prepare_refused(refused, now, ov))
            self.refused += 1
            return
        compiled = result.estate
        if compiled.revision == d.estate.revision and d.estate.refused is None:
            log.info("estate: %s unchanged (%s)", compiled.revision, snap.label)
            return
        _warn_repricing(d.idx().estate, compiled, d.clock.now())
        await self.seq.submit(
            lambda now, ov: d.prepare_estate(compiled, snap.label, "kliqued", now, ov, snap.commit),
            barrier=True,
        )
        self.applied += 1
        e = compiled
        log.info(
            "estate applied: %s from %s (%s, %s, %s, %s)",
            e.revision,
            snap.label,
            plural(len(e.pools), "pool"),
            plural(len(e.profiles), "profile"),
            plural(len(e.policies), "policy"),
            plural(len(e.compute_resources), "compute resource"),
        )

    async def run(self) -> None:
        log.info(
            "following the estate: %s",
            self.source.label
            + (
                f" (every {self.source.poll_s:g} s)"
                if isinstance(self.source, GitSource)
                else " (watching)"
            ),
        )
        try:
            async for _ in self.source.changes(self.stop):
                if self.stop.is_set():
                    return
                await self.check()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the estate follower stopped: the running revision stays")


def exists(path: str) -> bool:
    return Path(path).exists()
