"""How pytest-xdist hands the suite to its workers: a file at a time, the test Slurm's folder
at a time, the longest first.

Why our own scheduler: ``--dist loadgroup`` reads ``xdist_group`` marks by rewriting each
item's ``_nodeid``, which pytest 9.2 no longer reads (a node's id is ``_id`` now), so every
test was a group of its own and ran wherever a worker was free. That broke the modules whose
tests share a module-scoped daemon in order (``tests/daemon/test_billing.py``: the feed test
makes the intervals the FOCUS test reads) and let two tests of the one test Slurm run at
once. Grouping by file keeps what a plain ``pytest`` gives (a module's tests in one process,
in order), and a folder of a machine-wide service is one scope. It uses xdist's public hook
(``pytest_xdist_make_scheduler``) and its scope scheduler, whose rules to give are the scope
of a node id and the order in which the scopes are handed out.

Why the longest first: xdist orders the scopes by their number of tests, so the files of few
but long tests (the Ansible rollout's 8 tests, 3-5 minutes; the test Slurm's 14) were handed
out last and ran alone at the end of the run while the other workers had nothing left. The
scopes go out by their time in a recorded run (``durations.json`` beside this file, written
by ``KLIQUE_TEST_DURATIONS=FILE make test``), the longest first (the "longest processing
time" rule, which bounds the tail by the shortest scopes); a scope not recorded counts
:data:`UNKNOWN_TEST_S` a test.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

SHARED_FOLDERS = {"tests/slurm/": "slurm"}
"""Folders whose every test uses one machine-wide service: their files are one scope (the test
Slurm: slurmctld and slurmd on Slurm's fixed ports). Podman's tests are all in
tests/workers/test_container.py, one file and so one scope already; ``check_shared`` fails the
collection if a new file breaks either."""

DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds per scope in a recorded run: ``{"scope": seconds}`` (see :func:`record`)."""

UNKNOWN_TEST_S = 1.0
"""What a test of a scope absent from :data:`DURATIONS` is counted: about the suite's mean
(3,056 tests in about 50 worker-minutes), so a new file of many tests still goes out early."""


def scope_of(nodeid: str) -> str:
    """The scope a test runs in: its shared folder's name, else its file."""
    file = nodeid.split("::", 1)[0]
    for folder, scope in SHARED_FOLDERS.items():
        if file.startswith(folder):
            return scope
    return file


def check_shared(marked: Mapping[str, Iterable[str]]) -> list[str]:
    """For each machine-wide service (a marker) the node ids of its tests: a problem for each
    service whose tests would land in more than one scope (and so could run at once)."""
    problems = []
    for marker, nodeids in sorted(marked.items()):
        scopes = sorted({scope_of(n) for n in nodeids})
        if len(scopes) > 1:
            problems.append(
                f"the tests marked {marker!r} are in {len(scopes)} scopes ({', '.join(scopes)}): "
                f"they share one machine-wide service, so they must run one at a time; put "
                f"them in one file or a folder of tests/harness/scheduling.py's SHARED_FOLDERS"
            )
    return problems


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """The recorded seconds per scope; nothing when the file is absent or unreadable (the
    order then falls back to the number of tests, which is only slower, never wrong)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float))}


def longest_first(units: Mapping[str, int], known: Mapping[str, float]) -> list[str]:
    """The scopes (with their number of tests) in the order to hand them out: by recorded
    seconds, else :data:`UNKNOWN_TEST_S` a test, longest first; ties keep collection order."""
    at = {scope: i for i, scope in enumerate(units)}
    return sorted(units, key=lambda s: (-known.get(s, units[s] * UNKNOWN_TEST_S), at[s]))


def record(durations: Mapping[str, float], path: Path) -> None:
    """Writes seconds per scope (summed over each test's set-up, call and teardown) as
    :data:`DURATIONS` reads them, over what the file holds (a run of one folder updates that
    folder's scopes): sorted, longest first, rounded to a tenth."""
    rows = sorted({**load_durations(path), **durations}.items(), key=lambda kv: (-kv[1], kv[0]))
    path.write_text(
        json.dumps({k: round(v, 1) for k, v in rows}, indent=1) + "\n", encoding="utf-8"
    )


class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduler with :func:`scope_of` as the scope, the scopes handed out
    longest first (:func:`longest_first`), and every item of a node id sent, not only the
    first."""

    collection: list[str] | None
    workqueue: OrderedDict[str, dict[str, bool]]

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.durations = load_durations()

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def schedule(self) -> None:
        """As xdist's ``LoadScopeScheduling.schedule`` (3.8), but the work queue in
        :func:`longest_first` order instead of by number of tests."""
        assert self.collection_is_completed
        if self.collection is not None:  # a later call: as xdist, reschedule every node
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        counts = {scope: len(unit) for scope, unit in units.items()}
        self.workqueue = OrderedDict(
            (scope, units[scope]) for scope in longest_first(counts, self.durations)
        )
        for _ in range(max(0, len(self.nodes) - len(self.workqueue))):
            unused, _assigned = self.assigned_work.popitem()
            self.log(f"Shutting down unused node {unused}")
            unused.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:  # at least two units each where there are (xdist #277)
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()

    def _assign_work_unit(self, node: Any) -> None:
        """As xdist's, but a unit's tests are sent by every index of their node ids: the scope
        scheduler keys a unit by node id and sends ``collection.index(nodeid)``, so items that
        share a node id (schemathesis's 61 operations of ``test_openapi.py::test_fuzz`` under
        pytest 9.2) ran once and the other 60 were never run, silently."""
        scope, work_unit = self.workqueue.popitem(last=False)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        wanted = {nodeid for nodeid, done in work_unit.items() if not done}
        node.send_runtest_some(indexes_of(self.registered_collections[node], wanted))


def indexes_of(collection: list[str], wanted: set[str]) -> list[int]:
    """Every position of the wanted node ids in a worker's collection, in its order."""
    return [i for i, nodeid in enumerate(collection) if nodeid in wanted]
