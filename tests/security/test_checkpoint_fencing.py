"""A relayed checkpoint is fenced like a report (issue 28, lending.md's lost work): only
the worker holding a lease, at its current epoch, can move its task's checkpoint; a time
before the placement is refused and one in the future is clamped to the daemon's now, so no
worker makes a task's lost work look smaller than the work since a real checkpoint (and so
shield it from a least_lost_work reclaim, or shrink what the ledger records). Real
``kliqued serve``, the protocol over real HTTP."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kliqued.daemon.units import iso, parse_iso
from tests.daemon.fleet import HttpWorker, running_fleet
from tests.harness.wait import wait_for


@pytest.fixture
def fs(tmp_path):
    yield from running_fleet(tmp_path, ttl="10s")


def _beat(w: HttpWorker, tid: str, epoch: int, at: str) -> dict[str, Any]:
    st, body = w.call(
        "POST",
        f"/v1/workers/{w.id}/heartbeat",
        {"running": [{"task": tid, "epoch": epoch, "state": "running", "checkpoint_at": at}]},
    )
    assert st == 200, body
    return body


def test_only_the_lease_holder_moves_a_checkpoint_and_never_before_the_placement(fs) -> None:
    holder = HttpWorker(fs, fs.wt, "w-holder")
    holder.register()
    other = HttpWorker(fs, fs.wt, "w-other")  # a worker of the same pool, its own key
    other.register()
    tid = fs.submit(fs.erin, "team-b/one", ["sleep", "60"])
    wait_for(lambda: fs.task(tid)["state"] == "placed", 10, "placed")
    (lease,) = holder.lease(wait=2)
    epoch = lease["epoch"]
    assert holder.report(tid, epoch, "started")[0] == 200
    placed_at = parse_iso([e for e in fs.events(tid) if e["kind"] == "placed"][0]["at"])

    ahead = iso(int(time.time() * 1000) + 365 * 86_400_000)  # a year ahead of any clock here
    assert ahead is not None
    _beat(holder, tid, epoch, iso(placed_at - 1) or "")  # before the placement: refused
    _beat(holder, tid, epoch + 1, ahead)  # not its epoch
    answer = _beat(other, tid, epoch, ahead)  # not its lease
    assert [s["reason"] for s in answer["stop"]] == ["stale-epoch"], answer
    _beat(holder, tid, epoch, "not a time")
    assert fs.events(tid, "task_checkpointed") == []

    _beat(holder, tid, epoch, ahead)  # ahead of the daemon's clock
    (ev,) = wait_for(lambda: fs.events(tid, "task_checkpointed"), 10, "the checkpoint")
    at = ev["data"]["at"]
    assert ev["data"]["clamped"] is True and ev["data"]["worker"] == "w-holder", ev
    assert placed_at <= at <= parse_iso(ev["at"]), (placed_at, ev)
    _beat(holder, tid, epoch, iso(at - 1) or "")  # older than the recorded one
    assert len(fs.events(tid, "task_checkpointed")) == 1
