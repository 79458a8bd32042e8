"""CPU-only (0-GPU) tasks on a pool whose GPUs are all busy (issue 10, bug 2), against a real
``kliqued serve``: the lease request's ``cpu_free`` (docs/worker-protocol.md, addition 12)
bounds how many the control plane hands out, whatever GPU room the request shows."""

from __future__ import annotations

import pytest

from tests.daemon.fleet import ESTATE, FleetServer, HttpWorker, write_estate
from tests.harness.wait import wait_for

CPU_PROFILE = """\
  - name: cpu
    gpus: 0
    pools: [bare]
    policies: [team-b]
"""


@pytest.fixture
def fs(tmp_path):
    files = dict(ESTATE, **{"profiles.yaml": ESTATE["profiles.yaml"] + CPU_PROFILE})
    s = FleetServer(tmp_path, estate=write_estate(tmp_path / "estate", files)).start()
    s.erin = s.token({"user": "erin"})  # type: ignore[attr-defined]
    s.wt = s.token({"worker": True, "pool": "bare"})  # type: ignore[attr-defined]
    yield s
    log = s.log()
    assert s.stop() == 0, log


def test_the_control_plane_leases_cpu_only_tasks_up_to_cpu_free(fs) -> None:
    w = HttpWorker(fs, fs.wt, "w-cpu")
    w.register()
    tids = [fs.submit(fs.erin, "team-b/cpu", ["true"]) for _ in range(3)]
    wait_for(lambda: all(fs.task(t)["state"] == "placed" for t in tids), 10, "placed")
    # every GPU busy (no free GPU, no room on any), two CPU-only slots
    body = {"free_gpus": [], "gpu_free": [], "cpu_free": 2}
    st, got = w.call("POST", f"/v1/workers/{w.id}/lease?wait=0", body)
    assert st == 200 and len(got["leases"]) == 2, got
    assert all(lease["gpus"] == 0 for lease in got["leases"])
    st, got = w.call("POST", f"/v1/workers/{w.id}/lease?wait=0", {**body, "cpu_free": 0})
    assert st == 200 and got["leases"] == []
    # an older worker (no cpu_free): no limit
    st, got = w.call("POST", f"/v1/workers/{w.id}/lease?wait=0", {"free_gpus": []})
    assert st == 200 and len(got["leases"]) == 1
    st, got = w.call("POST", f"/v1/workers/{w.id}/lease?wait=0", {**body, "cpu_free": -1})
    assert st in (400, 422), got
