"""Finance over HTTP against a real daemon (issue 17): the FOCUS export, statements, and the
billing feed's cursor across a restart. The estate (estate_org/): north/ml/team-a (alice,
its admin), north/ml/team-b (bob), south/ops/team-c (carl, its admin)."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import duckdb
import pytest

from tests.harness.daemon import Server
from tests.harness.wait import wait_for

ESTATE = Path(__file__).resolve().parent / "estate_org"
ROOT = Path(__file__).resolve().parents[2]
CMD = {"command": ["true"]}
TEAMS = (("alice", "team-a"), ("bob", "team-b"), ("carl", "team-c"))


def _month() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m")


def _run_and_end(s: Server, tokens: dict, n: int = 1) -> list[str]:
    """Submits ``n`` tasks per team and cancels them once placed: closed intervals."""
    ids = []
    for _ in range(n):
        for user, team in TEAMS:
            t = s.ok(
                "POST",
                "/v1/tasks",
                {"resource": f"{team}/one", **CMD},
                token=tokens[user],
                expect=201,
            )
            ids.append(t["id"])
    for tid in ids:
        wait_for(
            lambda: s.ok("GET", f"/v1/tasks/{tid}")["state"] == "placed",
            20,
            f"{tid} to be placed",
            every=0.05,
        )
        time.sleep(0.01)
        s.ok("POST", f"/v1/tasks/{tid}/cancel")
    return ids


@pytest.fixture(scope="module")
def org(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("billing"), estate=ESTATE).start()
    tokens = {name: s.token({"user": name}) for name in ("alice", "bob", "carl")}
    tokens["finance"] = s.token({"role": "finance"})
    yield s, tokens
    if s.proc is not None and s.proc.poll() is None:
        assert s.stop() == 0, s.log()


def _pull_all(s: Server, token: str, cursor: str | None, limit: int = 2) -> tuple[list, str]:
    rows = []
    while True:
        q = f"/v1/ledger/feed?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        res = s.ok("GET", q, token=token)
        rows += res["rows"]
        cursor = res["cursor"]
        if not res["more"]:
            return rows, cursor


def test_the_feed_gives_each_closed_interval_once_across_a_restart(org):
    s, t = org
    first_ids = _run_and_end(s, t)
    wait_for(lambda: len(_pull_all(s, t["finance"], None)[0]) >= 3, 20, "3 closed intervals")
    rows1, cursor = _pull_all(s, t["finance"], None)
    assert [r["end_reason"] for r in rows1] == ["cancelled"] * 3
    assert {r["task"] for r in rows1} == set(first_ids)
    assert [r["seq"] for r in rows1] == sorted(r["seq"] for r in rows1)
    again, same = _pull_all(s, t["finance"], cursor)
    assert again == [] and same == cursor  # nothing new: nothing twice
    _run_and_end(s, t)
    assert s.stop() == 0, s.log()
    s.start()
    _run_and_end(s, t)
    wait_for(
        lambda: (
            s.ok(
                "POST",
                "/v1/ledger/sql",
                {"sql": "SELECT count(*) FROM ledger WHERE end_at IS NOT NULL"},
                token=t["finance"],
            )["rows"]
            == [[9]]
        ),
        20,
        "9 closed intervals",
    )
    rows2, _ = _pull_all(s, t["finance"], cursor)
    ids = [r["interval_id"] for r in rows1 + rows2]
    assert len(ids) == len(set(ids)) == 9  # none twice, none missed
    closed = s.ok(
        "POST",
        "/v1/ledger/sql",
        {"sql": "SELECT interval_id FROM ledger WHERE end_at IS NOT NULL"},
        token=t["finance"],
    )["rows"]
    assert set(ids) == {r[0] for r in closed}
    # the channel: sent to the API directly (schedules and pipelines label theirs)
    assert {
        r["channel"]
        for r in s.ok(
            "POST",
            "/v1/ledger/sql",
            {"sql": "SELECT DISTINCT channel FROM ledger"},
            token=t["finance"],
        )["rows"]
        for r in [dict(channel=r[0])]
    } == {"api"}
    # a group admin's feed: their subtree only
    mine, _ = _pull_all(s, t["alice"], None)
    assert {r["group"] for r in mine} == {"team-a"} and len(mine) == 3


@pytest.mark.parametrize(
    "query, fragment",
    [
        ("cursor=abc", "cursor"),
        ("cursor=-1", "cursor"),
        ("limit=0", "limit"),
        ("limit=x", "limit"),
        ("limit=100000", "limit"),
    ],
)
def test_a_bad_cursor_or_limit_is_a_400(org, query, fragment):
    s, t = org
    status, body = s.call("GET", f"/v1/ledger/feed?{query}", token=t["finance"])
    assert status == 400 and fragment in body["error"]["message"], body


def test_focus_over_http(org):
    s, t = org
    status, text = s.call("GET", f"/v1/ledger/focus?period={_month()}", token=t["finance"])
    assert status == 200, text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows and {r["ChargeCategory"] for r in rows} == {"Usage"}
    assert {r["SubAccountId"] for r in rows} >= {"north/ml/team-a", "south/ops/team-c"}
    status, text = s.call("GET", f"/v1/ledger/focus?period={_month()}", token=t["carl"])
    assert status == 200 and {r["SubAccountName"] for r in csv.DictReader(io.StringIO(text))} <= {
        "team-c"
    }
    for bad in ("2026-13", "nov", ""):
        status, body = s.call("GET", f"/v1/ledger/focus?period={bad}", token=t["finance"])
        assert status == 400 and "period" in str(body), (bad, body)
    status, body = s.call("GET", f"/v1/ledger/focus?period={_month()}", token=t["bob"])
    assert status == 403, body


def test_statement_over_http_matches_the_ledger_to_the_cent(org):
    s, t = org
    month = _month()
    st = s.ok("GET", f"/v1/ledger/statement?group=ml&period={month}", token=t["finance"])
    exact = s.ok(
        "POST",
        "/v1/ledger/sql",
        {
            "sql": (
                "SELECT sum(cost) FROM usage_monthly WHERE month = date_trunc('month', current_date) "
                "AND list_contains(string_split(group_path, '/'), 'ml')"
            )
        },
        token=t["finance"],
    )
    want = Decimal(exact["rows"][0][0]).quantize(Decimal("0.01"), ROUND_HALF_UP)
    # tasks ended (none open), so the ledger does not move between the two reads
    assert Decimal(st["total"]) == want
    assert {x["group"] for x in st["lines"]} == {"team-a", "team-b"}
    status, html = s.call(
        "GET", f"/v1/ledger/statement?group=ml&period={month}&format=html", token=t["finance"]
    )
    assert status == 200 and "<!DOCTYPE html>" in html and st["total"] in html
    status, body = s.call(
        "GET", f"/v1/ledger/statement?group=nowhere&period={month}", token=t["finance"]
    )
    assert status == 404 and "unknown group 'nowhere'" in body["error"]["message"], body
    status, body = s.call("GET", f"/v1/ledger/statement?group=ops&period={month}", token=t["alice"])
    assert status == 403 and "outside the groups you administer" in body["error"]["message"], body
    assert (
        s.call("GET", f"/v1/ledger/statement?group=team-a&period={month}", token=t["alice"])[0]
        == 200
    )
    status, body = s.call("GET", "/v1/ledger/statement?group=ml", token=t["finance"])
    assert status == 400 and "period" in body["error"]["message"]


def _cli(s: Server, token: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KLIQUE_URL": s.url, "KLIQUE_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "kliqued.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_writes_focus_parquet_statements_and_partitions(org, tmp_path):
    s, t = org
    month = _month()
    out = tmp_path / "focus.parquet"
    p = _cli(
        s, t["finance"], "ledger", "export", "--format", "focus", "--period", month, "-o", str(out)
    )
    assert p.returncode == 0, p.stderr
    assert "FOCUS 1.2" in p.stderr
    n = duckdb.connect().execute(f"SELECT count(*) FROM '{out}'").fetchone()[0]
    assert n > 0
    p = _cli(s, t["finance"], "ledger", "export", "--format", "focus", "-o", str(out))
    assert p.returncode == 1 and "--period" in p.stderr
    html = tmp_path / "ml.html"
    p = _cli(
        s, t["finance"], "ledger", "statement", "--group", "ml", "--period", month, "-o", str(html)
    )
    assert p.returncode == 0 and html.read_text().startswith("<!DOCTYPE html>"), p.stderr
    p = _cli(s, t["finance"], "ledger", "statement", "--group", "ml", "--period", month)
    assert p.returncode == 0 and "statement north/ml" in p.stdout and "total" in p.stdout
    p = _cli(s, t["finance"], "ledger", "statement", "--group", "nope", "--period", month)
    assert p.returncode == 1 and "unknown group 'nope'" in p.stderr
    parts = tmp_path / "billing" / "gpu"  # created with its parents, as -o's file is
    p = _cli(
        s, t["finance"], "ledger", "partitions", "--from", month, "--to", month, "-o", str(parts)
    )
    assert p.returncode == 0, p.stderr
    got = (
        duckdb.connect()
        .execute(
            f"SELECT month, count(*) FROM read_parquet('{parts}/*/*.parquet', "
            "hive_partitioning = true) GROUP BY 1"
        )
        .fetchall()
    )
    assert got == [(month, n)]


def test_capacity_is_recorded_and_the_cio_views_answer(org):
    s, t = org
    sql = lambda q, who="finance": s.ok(
        "POST",
        "/v1/ledger/sql",
        {"sql": q},  # noqa: E731
        token=t[who],
    )["rows"]
    assert sql("SELECT pool, kind, capacity FROM in_use_now") == [["pool-1", "kubernetes", "8.000"]]
    assert sql("SELECT DISTINCT pool, gpus FROM capacity") == [["pool-1", "8.000"]]
    month = sql(
        "SELECT month, capacity_hours IS NOT NULL, gpu_hours > 0 FROM estate_use "
        "WHERE month = date_trunc('month', current_date)"
    )
    assert month and month[0][1:] == [True, True]
    assert {r[0] for r in sql("SELECT policy FROM reserved_idle")} == {"team-a", "team-b", "team-c"}
    # a team's admin sees their own reservation only
    assert {r[0] for r in sql("SELECT policy FROM reserved_idle", "carl")} == {"team-c"}
    assert sql("SELECT count(*) FROM idle_cost", "carl")[0][0] >= 1


def test_the_cio_figures_over_http(org):
    s, t = org
    month = _month()
    res = s.ok("GET", f"/v1/ledger/cio?period={month}", token=t["finance"])
    assert [p["pool"] for p in res["estate_use"]] == ["pool-1"]
    assert {b["business_unit"] for b in res["business_units"]} == {"north", "south"}
    idle = res["idle"]
    total = sum(
        Decimal(idle[k]) for k in ("used_cost", "reserved_idle_cost", "unreserved_idle_cost")
    )
    assert total == Decimal(idle["capacity_cost"])
    assert res["in_use_now"][0]["capacity"] == "8.000"
    mine = s.ok("GET", f"/v1/ledger/cio?period={month}", token=t["carl"])
    assert {b["business_unit"] for b in mine["business_units"]} == {"south"}
    assert s.call("GET", "/v1/ledger/cio?period=x", token=t["finance"])[0] == 400
    assert s.call("GET", f"/v1/ledger/cio?period={month}", token=t["bob"])[0] == 403
