"""How pytest-xdist hands the suite to its workers: a file at a time, the test Slurm's folder
at a time.

Why our own scheduler: ``--dist loadgroup`` reads ``xdist_group`` marks by rewriting each
item's ``_nodeid``, which pytest 9.2 no longer reads (a node's id is ``_id`` now), so every
test was a group of its own and ran wherever a worker was free. That broke the modules whose
tests share a module-scoped daemon in order (``tests/daemon/test_billing.py``: the feed test
makes the intervals the FOCUS test reads) and let two tests of the one test Slurm run at
once. Grouping by file keeps what a plain ``pytest`` gives (a module's tests in one process,
in order), and a folder of a machine-wide service is one scope. It uses xdist's public hook
(``pytest_xdist_make_scheduler``) and its scope scheduler, whose only rule to give is the
scope of a node id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

SHARED_FOLDERS = {"tests/slurm/": "slurm"}
"""Folders whose every test uses one machine-wide service: their files are one scope (the test
Slurm: slurmctld and slurmd on Slurm's fixed ports). Podman's tests are all in
tests/workers/test_container.py, one file and so one scope already; ``check_shared`` fails the
collection if a new file breaks either."""


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


class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduler with :func:`scope_of` as the scope, and every item of a node
    id sent, not only the first."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

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
