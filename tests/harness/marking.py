"""The suite's markers, given by folder and by what a test uses, not by hand on each test.

Why read the sources: most tests start their ``kliqued serve`` in the test body or in a
helper (``Server(tmp_path).start()``, ``running_fleet(...)``), not through one fixture, so a
test is marked ``daemon`` when its function, a fixture it uses, or a function of the tests
they call (followed a few levels) starts one. The same reading gives ``browser``; the
fixtures give ``postgres``, ``slurm`` and ``podman``; folders give ``slurm`` and ``slow``.

Two markers also name machine-wide services, the one test Slurm (slurmctld and slurmd on
Slurm's fixed ports) and Podman (one image store, one image name imported once), whose tests
must run one at a time: tests/harness/scheduling.py hands the suite to xdist's workers by
file, and checks that each service's tests fall in one scope.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import FunctionType
from typing import Any, Callable, Iterable

import pytest

TESTS = Path(__file__).resolve().parents[1]

MARKERS = {
    "slow": "takes long on its own (rollouts, whole-program runs, long waits): not in make check",
    "daemon": "runs a real `kliqued serve` (a subprocess, or in process: tests/harness/inproc.py)",
    "slurm": "uses the test Slurm cluster (one at a time: all under tests/slurm/, one xdist scope)",
    "podman": "runs real containers with Podman (one at a time: all in one file, one xdist scope)",
    "postgres": "uses the session's real PostgreSQL",
    "browser": "drives a real Chromium through Playwright",
    "oidc": "uses a real OpenID Provider (npm oidc-provider on Node.js: tests/harness/oidc.py)",
}
"""Registered in pyproject.toml (``--strict-markers``); kept here to test they are."""

QUICK_EXCLUDED = tuple(MARKERS)
"""``make check`` runs what none of these mark."""

SHARED = ("slurm", "podman")
"""The markers of machine-wide services, whose tests run one at a time
(tests/harness/scheduling.py)."""

SLOW_PATHS = ("ansible/", "e2e/")
"""Folders (relative to tests/) or files whose every test is slow."""

_DAEMON = re.compile(
    r"(?<![\w.])(Server|FleetServer|_TlsServer|InProcServer|running_fleet)\(|\"serve\""
)
_BROWSER = re.compile(r"chromium\.launch|sync_playwright\(")
_SLURM = re.compile(r"(?<![\w.])(LocalSlurm|TwoNodeSlurm)\(")
_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\(")
_FIXTURE_MARKS = {
    "postgres": "postgres",
    "postgres_prepared": "postgres",
    "pg_url": "postgres",
    "prepared_pg_url": "postgres",
    "slurm": "slurm",
    "podman": "podman",
    "browser": "browser",
    "oidc_people": "oidc",
    "oidc_actions": "oidc",
}


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


class _Reader:
    """What a test's code does, read from its sources: each function's source read once,
    whatever the pattern (``inspect.getsource`` parses a class's whole module: it was 8 of
    the collection's 19 s, every worker, before each source was kept)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, str], bool] = {}
        self._sources: dict[Any, str] = {}
        self._calls: dict[Any, list[Callable[..., Any]]] = {}
        self._files: dict[str, bool] = {}

    def source(self, fn: Any) -> str:
        if fn not in self._sources:
            self._sources[fn] = _source(fn)
        return self._sources[fn]

    def in_tests(self, obj: Any) -> bool:
        """Whether ``obj`` is the tests' own code (kept by file)."""
        code = getattr(obj, "__code__", None)
        try:
            file = code.co_filename if code is not None else inspect.getfile(obj)
        except (TypeError, OSError):
            return False
        if file not in self._files:
            self._files[file] = Path(file).resolve().is_relative_to(TESTS)
        return self._files[file]

    def does(self, fn: Callable[..., Any], pattern: re.Pattern[str], depth: int = 3) -> bool:
        key = (fn, pattern.pattern)
        if key in self._seen:
            return self._seen[key]
        self._seen[key] = False  # recursion guard
        src = self.source(fn)
        found = bool(pattern.search(src))
        if not found and depth > 0:
            found = any(self.does(g, pattern, depth - 1) for g in self.called(fn, src))
        self._seen[key] = found
        return found

    def called(self, fn: Callable[..., Any], src: str) -> list[Callable[..., Any]]:
        """The functions and classes of the tests' own code that ``fn`` calls by name."""
        if fn not in self._calls:
            names = getattr(fn, "__globals__", {})
            found: list[Callable[..., Any]] = []
            for name in sorted(set(_CALL.findall(src))):
                g = names.get(name)
                if isinstance(g, (FunctionType, type)) and self.in_tests(g):
                    found.append(g)
            self._calls[fn] = found
        return self._calls[fn]


def _fixture_funcs(item: pytest.Item) -> Iterable[tuple[str, Callable[..., Any]]]:
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (getattr(info, "name2fixturedefs", None) or {}).items():
        for d in defs:
            yield name, d.func


def marks_for(item: pytest.Item, reader: _Reader) -> set[str]:
    """The markers ``item`` gets (see the module's docstring)."""
    marks: set[str] = set()
    rel = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    if rel.startswith("slurm/"):
        marks.add("slurm")
    if rel.startswith(SLOW_PATHS):
        marks.add("slow")
    fixtures = list(_fixture_funcs(item))
    marks |= {_FIXTURE_MARKS[n] for n, _ in fixtures if n in _FIXTURE_MARKS}
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "postgresql" in map(str, callspec.params.values()):
        marks.add("postgres")  # tests/daemon's `db` fixture, run on both backends
    code = [f for _, f in fixtures if reader.in_tests(f)]
    fn = getattr(item, "function", None)
    if fn is not None:
        code.append(fn)
    for marker, pattern in (("daemon", _DAEMON), ("browser", _BROWSER), ("slurm", _SLURM)):
        if marker not in marks and any(reader.does(f, pattern) for f in code):
            marks.add(marker)
    return marks


def apply(items: list[pytest.Item]) -> None:
    reader = _Reader()
    for item in items:
        have = {m.name for m in item.iter_markers()}
        for name in sorted(marks_for(item, reader) - have):
            item.add_marker(getattr(pytest.mark, name))


def shared_services(items: list[pytest.Item]) -> dict[str, list[str]]:
    """The node ids of the tests of each machine-wide service (:data:`SHARED`)."""
    return {m: [i.nodeid for i in items if i.get_closest_marker(m) is not None] for m in SHARED}
