"""Issue 25, item 10: a pool's ``settings`` reach its workers. A real ``kliqued serve`` sends
them in the registration's answer and in every lease, and a lease made after an edit of the
watched estate carries the edited ones (a running worker needs no restart)."""

from __future__ import annotations

from typing import Iterator

import pytest

from .fleet import ESTATE, FleetServer, HttpWorker, write_estate
from tests.harness.wait import wait_for

POOLS = ESTATE["pools.yaml"].replace(
    "  - name: bare\n    kind: baremetal\n    capacity: 2\n    gpu_type: l40s-48gb\n",
    "  - name: bare\n    kind: baremetal\n    capacity: 2\n    gpu_type: l40s-48gb\n"
    '    settings: {mode: docker, master_port: "29600"}\n',
)


@pytest.fixture
def fs(tmp_path) -> Iterator[FleetServer]:
    root = write_estate(tmp_path / "estate", {**ESTATE, "pools.yaml": POOLS})
    s = FleetServer(tmp_path, estate=root).start()
    s.erin = s.token({"user": "erin"})  # type: ignore[attr-defined]
    s.wt = s.token({"worker": True, "pool": "bare"})  # type: ignore[attr-defined]
    yield s
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


def _leased(w: HttpWorker) -> dict:
    return wait_for(lambda: next(iter(w.lease(wait=1) or []), None), 15, "a lease")


def test_registration_and_every_lease_carry_the_pools_settings(fs, tmp_path) -> None:
    assert POOLS != ESTATE["pools.yaml"]
    w = HttpWorker(fs, fs.wt, "w-settings")  # type: ignore[attr-defined]
    assert w.register()["settings"] == {"mode": "docker", "master_port": "29600"}
    first = fs.submit(fs.erin, "team-b/one", ["true"])  # type: ignore[attr-defined]
    lease = _leased(w)
    assert lease["task"] == first
    assert lease["settings"] == {"mode": "docker", "master_port": "29600"}
    assert w.report(first, lease["epoch"], "started")[0] == 200
    assert w.report(first, lease["epoch"], "finished", exit_code=0)[0] == 200

    # IT edits the pool: the next lease carries the new settings, no re-registration
    before = fs.ok("GET", "/v1/estate")["revision"]
    (tmp_path / "estate" / "pools.yaml").write_text(
        POOLS.replace('master_port: "29600"', 'master_port: "29700"')
    )
    wait_for(lambda: fs.ok("GET", "/v1/estate")["revision"] != before, 15, "the edit applied")
    second = fs.submit(fs.erin, "team-b/one", ["true"])  # type: ignore[attr-defined]
    lease = _leased(w)
    assert lease["task"] == second
    assert lease["settings"] == {"mode": "docker", "master_port": "29700"}
