"""People see shares, protection and lost work (issue 28, lending.md "What the product
shows"): a real ``kliqued serve`` on the small estate with ``order: fair`` (team-a's
``lend_weight: 2``, team-b's borrowed work protected for an hour).

team-a fills pool-1 (4 GPUs, 2 of them borrowed: share 2 / 2 = 1); team-b takes its
reservation back, preempting two of team-a's tasks (their lost work is counted); team-a's
work is cancelled, team-b borrows pool-1's other two GPUs (share 2 / 1 = 2, protected), and
team-a's next task waits for team-b's protection to end, which its reason names. Each figure
is read where people read it: ``GET /v1/policies`` and ``/v1/pools``, ``kliqued budget``,
``pools``, ``status``, ``/metrics`` and the dashboard's pages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import pytest

from klique_util.fmt import hours
from kliqued.cli import main
from kliqued.engine.periods import format_minute
from tests.daemon.test_lost_work import CMD, lending_estate, ms
from tests.harness import promtool
from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer
from tests.harness.typed import present
from tests.harness.wait import wait_for
from tests.web.browser import Browser

Cli = Callable[..., str]


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> Callable[[Server], Cli]:
    """``kliqued ARGV...`` in-process against a server, as a principal; its stdout."""
    monkeypatch.setenv("KLIQUE_CONFIG", str(tmp_path / "absent.yaml"))

    def bind(s: Server) -> Cli:
        monkeypatch.setenv("KLIQUE_URL", s.url)

        def run(who: str, *argv: str) -> str:
            monkeypatch.setenv("KLIQUE_TOKEN", present(s.admin if who == "admin" else s.token(who)))
            capsys.readouterr()
            rc = main(list(argv))
            out, err = capsys.readouterr()
            assert rc == 0, (argv, out, err)
            return out

        return run

    return bind


def metrics(s: Server) -> dict[str, float]:
    """``/metrics`` as {``name{labels}``: value}."""
    status, text = s.call("GET", "/metrics", token=s.token("role:planner"))
    assert status == 200, text
    assert promtool.problems(text) == ""  # the shares, weights and lost work too
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def row(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first`` (indentation ignored)."""
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


def test_shares_protection_and_lost_work_are_shown(tmp_path: Path, cli: Any) -> None:
    s = InProcServer(tmp_path, estate=lending_estate(tmp_path)).start()
    try:
        run = cli(s)
        bob, erin = s.token("bob"), s.token("erin")
        # 1. team-a alone on pool-1: 4 placed, 2 above its reservation of 2, weight 2
        a = [
            s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"]
            for _ in range(4)
        ]
        wait_for(lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in a))
        pa = s.ok("GET", "/v1/policies/team-a")
        assert (pa["borrowed"], pa["share"], pa["lend_weight"]) == (2, 1, 2)
        pb = s.ok("GET", "/v1/policies/team-b")
        assert (pb["share"], pb["lend_weight"]) == (0, 1)
        out = run("walter", "budget")
        head = out.splitlines()[0].split()
        assert head[:4] == ["POLICY", "GPUS", "USED/RES/LIMIT", "SHARE"] and "WEIGHT" in head
        assert row(out, "team-a")[2:4] == ["1", "2"]
        assert row(out, "team-b")[2:4] == ["0", "1"]
        assert "fair share   1 (borrowed 2 / lend_weight 2)" in run("alice", "budget", "team-a")
        pool = next(p for p in s.ok("GET", "/v1/pools")["pools"] if p["name"] == "pool-1")
        lv = {x["group"]: x for x in pool["by_level"]}
        assert (lv["team-a"]["share"], lv["team-a"]["lend_weight"]) == (1, 2)
        assert "share" not in lv["lab"]  # a group without a policy is no level
        assert row(run("admin", "pools", "--by-level"), "team-a")[1:] == ["4", "100%", "1", "2"]
        assert (
            "fair shares (borrowed GPUs / lend_weight; idle GPUs go to the lowest "
            "first): team-a 1 (weight 2)" in run("admin", "pools")
        )
        m = metrics(s)
        assert m['klique_lending_share{group="team-a",policy="team-a"}'] == 1
        assert m['klique_lend_weight{group="team-a",policy="team-a"}'] == 2
        assert m['klique_lending_share{group="team-b",policy="team-b"}'] == 0
        assert m['klique_lost_gpu_seconds_total{group="team-a",policy="team-a"}'] == 0

        # 2. team-b takes its reservation back: two of team-a's tasks lose their work
        b = [
            s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)["id"]
            for _ in range(2)
        ]
        wait_for(
            lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in b),
            10,
            "team-b's reclaim",
        )

        def preempted() -> list[int] | None:
            got = [
                e["data"]["lost_ms"]
                for e in s.ok("GET", "/v1/events?limit=1000")["events"]
                if e["kind"] == "preempted"
            ]
            return got if len(got) == 2 else None

        lost_ms = wait_for(preempted, 10, "the two preempted events")
        assert len(lost_ms) == 2 and all(x > 0 for x in lost_ms)
        m = metrics(s)
        assert m['klique_lost_gpu_seconds_total{group="team-a",policy="team-a"}'] == pytest.approx(
            sum(lost_ms) / 1000, abs=1e-9
        )  # 1 GPU each
        assert m['klique_lost_gpu_seconds_total{group="team-b",policy="team-b"}'] == 0
        preempted_ids = [t for t in a if s.ok("GET", f"/v1/tasks/{t}")["preemptions"]]
        v = s.ok("GET", f"/v1/tasks/{preempted_ids[0]}")
        out = run("bob", "status", preempted_ids[0])
        assert v["lost_gpu_hours_so_far"] > 0 and v["lost_work_s"] is None  # queued again
        assert (
            f"\nlost work {hours(v['lost_gpu_hours_so_far'])} GPU-hours lost by its "
            "preemptions so far\n" in out
        ), out
        vb = s.ok("GET", f"/v1/tasks/{b[0]}")
        out = run("erin", "status", b[0])
        until = vb["protected_until"].replace("T", " ")[:19]
        assert re.search(
            rf"^protected {re.escape(until)}Z \(in (59m|1h)\): not taken back for "
            r"another group before then$",
            out,
            re.M,
        ), out
        assert re.search(
            r"^lost work \S+ if preempted now \(since its last checkpoint, else "
            r"its placement\); 0 GPU-hours lost by its preemptions so far$",
            out,
            re.M,
        ), out

        # 3. team-a leaves; team-b borrows the other two GPUs (protected for an hour)
        for t in a:
            s.ok("POST", f"/v1/tasks/{t}/cancel", {"reason": "done"}, bob)
        b += [
            s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)["id"]
            for _ in range(2)
        ]
        wait_for(
            lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in b),
            10,
            "team-b borrows",
        )
        assert s.ok("GET", "/v1/policies/team-b")["share"] == 2
        # 4. team-a's task may reclaim, but team-b's borrowed work is protected
        t = s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"]
        # the first protection to end lets the reclaim take room (team-b's newest tasks
        # that are not protected then)
        first_end = min(ms(s.ok("GET", f"/v1/tasks/{x}")["protected_until"]) for x in b)
        stamp = format_minute(first_end)
        want = f"no room in pools pool-1; borrowed work protected until {stamp}"
        r = wait_for(
            lambda: (
                (s.ok("GET", f"/v1/tasks/{t}")["waiting_reason"] or {}).get("text") == want or None
            ),
            10,
            "the protection's reason",
        )
        assert r and s.ok("GET", f"/v1/tasks/{t}")["waiting_reason"]["kind"] == "capacity"
        assert f"waiting   {want}" in run("bob", "status", t)
        web = Browser(s.url)
        web.sign_in(bob)
        assert f"waits: {want}" in web.page("/my-work")
        web = Browser(s.url)
        web.sign_in(s.token("alice"))  # team-a's admin: its queues on the Policy page
        assert want in web.page("/policy")
    finally:
        assert s.stop() == 0, s.log()


def test_nothing_new_without_fair(tmp_path: Path, cli: Any) -> None:
    """With the default ``order: ordered``, the views are as they were: no share, no weight
    (the lost work metric is there whatever the order)."""
    s = InProcServer(tmp_path).start()
    try:
        run = cli(s)
        s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, s.token("bob"))
        assert "share" not in s.ok("GET", "/v1/policies/team-a")
        assert all(
            "share" not in x for p in s.ok("GET", "/v1/pools")["pools"] for x in p["by_level"]
        )
        head = run("admin", "budget").splitlines()[0]
        assert "SHARE" not in head and "WEIGHT" not in head
        assert "fair share" not in run("admin", "pools")
        m = metrics(s)
        assert not any(k.startswith(("klique_lending_share{", "klique_lend_weight{")) for k in m)
        assert m['klique_lost_gpu_seconds_total{group="team-a",policy="team-a"}'] == 0
    finally:
        assert s.stop() == 0, s.log()
