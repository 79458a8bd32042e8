"""Lost work in the ledger, and people see it (issue 28, lending.md): a real ``kliqued serve``
where team-b reclaims GPUs team-a borrowed. Each preemption is a row of the ledger's
``preemptions`` (task, group, user, project, reason, the taker, its lost GPU-hours), on
DuckDB and on PostgreSQL; the task's status shows its protection's end and the work it lost.

Lost work is wall-clock time here (the daemon's clock), so the figures are checked against
the ledger's own interval: a task without checkpoints loses its whole placement, so its lost
milliseconds are exactly its interval's length, and its GPU-hours that times its size."""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from tests.harness.daemon import SMALL_ESTATE, Server
from tests.harness.wait import wait_for

CMD = {"command": ["true"], "project": "evals"}
MICRO = Decimal("0.000001")


def lending_estate(tmp: Path) -> Path:
    """The small test estate with ``order: fair``, team-a's ``lend_weight: 2`` and team-b's
    borrowed work protected for an hour (team-a's is not, so it can be reclaimed)."""
    estate = tmp / "estate"
    shutil.copytree(SMALL_ESTATE, estate)
    settings = estate / "settings.yaml"
    settings.write_text(settings.read_text() + "  lending:\n    order: fair\n")
    pol = estate / "policies.yaml"
    text = pol.read_text()
    text = text.replace(
        "    limit: 10\n    budget:", "    limit: 10\n    lend_weight: 2\n    budget:", 1
    )
    text = text.replace(
        "  - name: team-b\n    group: team-b\n    reservation: 2\n    limit: 10\n",
        "  - name: team-b\n    group: team-b\n"
        "    reservation: 2\n    limit: 10\n    protect_for: 1h\n",
    )
    assert "lend_weight: 2" in text and "protect_for: 1h" in text
    pol.write_text(text)
    return estate


def ms(text: str) -> int:
    return int(
        datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()
        * 1000
    )


def reclaim(s: Server) -> tuple[list[str], list[str]]:
    """team-a fills pool-1 (4 GPUs, 2 above its reservation), then team-b takes its
    reservation back: two of team-a's tasks are preempted. Returns both teams' task ids."""
    bob, erin = s.token("bob"), s.token("erin")
    a = [s.ok("POST", "/v1/tasks", {"resource": "team-a/one", **CMD}, bob)["id"] for _ in range(4)]
    wait_for(lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in a))
    b = [s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)["id"] for _ in range(2)]
    wait_for(
        lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in b),
        10,
        "team-b's reclaim",
    )
    return a, b


def sql(s: Server, text: str, token: str) -> list[list]:
    return s.ok("POST", "/v1/ledger/sql", {"sql": text}, token)["rows"]


def test_each_preemption_is_in_the_ledger_with_its_lost_work(tmp_path: Path, db) -> None:
    s = Server(tmp_path, estate=lending_estate(tmp_path), db=db).start()
    try:
        a, b = reclaim(s)
        finance = s.token("role:finance")
        preempted = [t for t in a if s.ok("GET", f"/v1/tasks/{t}")["preemptions"] == 1]
        assert len(preempted) == 2
        rows = wait_for(
            lambda: (
                sql(
                    s,
                    'SELECT p.task, p."group", p."user", p.project, p.kind, p.reason, '
                    "p.taker, p.taker_path, p.group_path, p.gpus, p.lost_ms, p.lost_gpu_hours, "
                    "epoch_ms(l.start_at), epoch_ms(l.end_at), p.interval_id "
                    "FROM preemptions p JOIN ledger l USING (interval_id) ORDER BY p.task"
                    if not s.on_postgres
                    else 'SELECT p.task, p."group", p."user", p.project, p.kind, p.reason, '
                    "p.taker, p.taker_path, p.group_path, p.gpus, p.lost_ms, p.lost_gpu_hours, "
                    "(extract(epoch FROM l.start_at) * 1000)::bigint, "
                    "(extract(epoch FROM l.end_at) * 1000)::bigint, p.interval_id "
                    "FROM preemptions p JOIN ledger l USING (interval_id) ORDER BY p.task",
                    finance,
                )
                if len(sql(s, "SELECT * FROM preemptions", finance)) == 2
                else None
            ),
            10,
            "two preemption rows",
        )
        assert [r[0] for r in rows] == sorted(preempted)
        for r in rows:
            (
                task,
                group,
                user,
                project,
                kind,
                reason,
                taker,
                taker_path,
                path,
                gpus,
                lost_ms,
                lost_gh,
                start,
                end,
                interval,
            ) = r
            assert (group, user, project, kind, reason, taker, taker_path, path) == (
                "team-a",
                "bob",
                "evals",
                "reclaimed",
                "reclaimed by team-b",
                "team-b",
                "lab/team-b",
                "lab/team-a",
            )
            assert interval == f"{task}#1" and Decimal(gpus) == 1
            # no checkpoint: the whole placement is lost, to the millisecond
            assert lost_ms == end - start and lost_ms > 0
            assert Decimal(lost_gh) == (Decimal(lost_ms) / 3_600_000).quantize(MICRO, ROUND_HALF_UP)
        # the same, priced, in the view finance reads (h100-80gb at 2.5 an hour)
        priced = sql(
            s,
            "SELECT task, lost_gpu_hours, per_gpu_hour, lost_cost, currency "
            "FROM lost_work ORDER BY task",
            finance,
        )
        for (task, gh, price, cost, cur), r in zip(priced, rows):
            assert (task, Decimal(price), cur) == (r[0], Decimal("2.5"), "EUR")
            # the ledger's rule: GPU-hours as shown, times the price, half up to the millionth
            assert Decimal(gh) == Decimal(r[11])
            assert Decimal(cost) == (Decimal(r[11]) * Decimal("2.5")).quantize(MICRO, ROUND_HALF_UP)
        # a team-b admin (dave) sees none of team-a's rows; team-a's admin sees both
        assert sql(s, "SELECT count(*) FROM preemptions", s.token("dave"))[0][0] == 0
        assert sql(s, "SELECT count(*) FROM lost_work", s.token("alice"))[0][0] == 2
        # the event carries it too, for the log's readers
        ev = [
            e
            for e in s.ok("GET", "/v1/events?limit=1000")["events"]
            if e["kind"] == "preempted" and e["task"] == rows[0][0]
        ]
        assert ev and ev[0]["data"]["lost_ms"] == rows[0][10]
        assert ev[0]["data"]["by"] == "team-b" and ev[0]["data"]["size_milli"] == 1000

        # status: the preempted task's lost GPU-hours so far, team-b's protection's end
        t = s.ok("GET", f"/v1/tasks/{rows[0][0]}")
        assert t["lost_gpu_hours_so_far"] == pytest.approx(rows[0][10] / 3_600_000, abs=1e-6)
        assert t["protected_until"] is None and t["lost_work_s"] is None  # queued
        for tb in b:
            v = s.ok("GET", f"/v1/tasks/{tb}")
            assert ms(v["protected_until"]) == ms(v["placed_at"]) + 3_600_000
            assert v["lost_work_s"] >= 0 and v["lost_gpu_hours_so_far"] == 0
        kept = [t for t in a if t not in preempted][0]
        v = s.ok("GET", f"/v1/tasks/{kept}")
        assert v["protected_until"] is None and v["lost_work_s"] > 0  # team-a: no protection
    finally:
        assert s.stop() == 0, s.log()
