"""Departments (issue 12) in the ledger: each interval's group path, recorded at its open and
kept as history, the migration of older databases, and the roll-up views by level."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from compiler.api import compile_dir
from kliqued.ledger import (
    close_interval,
    close_intervals,
    ensure_schema,
    fill_group_paths,
    group_paths,
    open_intervals,
)
from kliqued.ledger.dialect import DUCKDB
from kliqued.ledger.tables import LEDGER_MONTHLY

from .conftest import H, ms, row, set_prices
from .test_monthly import mismatches

DAEMON_ESTATE = Path(__file__).resolve().parents[1] / "daemon" / "estate"


def test_group_paths_from_the_estate_top_first():
    est = compile_dir(str(DAEMON_ESTATE)).estate
    assert group_paths(est) == {"lab": "lab", "team-a": "lab/team-a", "team-b": "lab/team-b"}


@pytest.mark.parametrize("n", [2, 40])  # the VALUES path and the list path
def test_an_open_records_the_path_and_the_views_split_it(db, n):
    t0 = ms("2026-03-01T00:00")
    open_intervals(db, [row(i, t0, group_path="north/ml/team-a") for i in range(n)])
    got = db.execute(
        "SELECT DISTINCT group_path, business_unit, department FROM usage "
        "UNION ALL SELECT DISTINCT group_path, business_unit, department "
        "FROM usage_by_month UNION ALL SELECT DISTINCT group_path, "
        "business_unit, department FROM usage_monthly"
    ).fetchall()
    assert got == [("north/ml/team-a", "north", "ml")] * 3


def test_levels_are_counted_up_from_the_team(db):
    """A department is the group above the team and a business unit the one above that,
    with or without a company group at the top (the example estate has northwind)."""
    t0 = ms("2026-03-01T00:00")
    open_intervals(
        db,
        [
            row(1, t0, group="llm", group_path="corp/science/ai-lab/llm"),
            row(2, t0, group="serving", group_path="corp/it/serving"),
            row(3, t0, group="team-a", group_path="ml/team-a"),
            row(4, t0, group="solo", group_path="solo"),
            row(5, t0, group="gone", group_path=None),
        ],
    )
    got = db.execute('SELECT "group", business_unit, department FROM usage ORDER BY 1').fetchall()
    assert got == [
        ("gone", None, None),
        ("llm", "science", "ai-lab"),
        ("serving", "corp", "it"),
        ("solo", None, None),
        ("team-a", None, "ml"),
    ]
    units = db.execute(
        "SELECT DISTINCT business_unit FROM usage_by_business_unit ORDER BY 1"
    ).fetchall()
    assert units == [("corp",), ("science",)]
    depts = db.execute(
        "SELECT DISTINCT business_unit, department FROM usage_by_department ORDER BY 2"
    ).fetchall()
    assert depts == [("science", "ai-lab"), ("corp", "it"), (None, "ml")]
    levels = db.execute(
        "SELECT DISTINCT level, name, path FROM usage_by_level WHERE level = 1 ORDER BY 2"
    ).fetchall()
    assert levels == [(1, "corp", "corp"), (1, "ml", "ml"), (1, "solo", "solo")]


def _org_usage(db):
    """Three teams in two business units, whole hours at 2.5 a GPU-hour: every figure exact.
    team-a moves from north/ml to south/ops on 2026-03-15; its older interval keeps its path.
    """
    set_prices(db, ("h100", "2.5", "2026-01-01T00:00:00"))
    rows = [
        # north/ml/team-a: 2 GPUs x 10 h in March (before the move), then 1 GPU x 4 h after
        row(1, "2026-03-01T00:00", group="team-a", gpus_milli=2000, group_path="north/ml/team-a"),
        row(2, "2026-03-20T00:00", group="team-a", gpus_milli=1000, group_path="south/ops/team-a"),
        # north/ml/team-b: 1 GPU from March 31 22:00 to April 1 02:00 (crosses the month)
        row(3, "2026-03-31T22:00", group="team-b", gpus_milli=1000, group_path="north/ml/team-b"),
        # south/ops/team-c: 4 GPUs x 1 h, still open at the end of the test (closed below)
        row(4, "2026-03-02T00:00", group="team-c", gpus_milli=4000, group_path="south/ops/team-c"),
    ]
    open_intervals(db, rows)
    close_intervals(
        db,
        [
            ("t-1#1", ms("2026-03-01T10:00"), "finished"),
            ("t-2#1", ms("2026-03-20T04:00"), "finished"),
            ("t-3#1", ms("2026-04-01T02:00"), "finished"),
        ],
    )
    close_interval(db, "t-4#1", ms("2026-03-02T01:00"), "finished")


def test_roll_up_by_business_unit_and_department_exact(db):
    _org_usage(db)
    bu = db.execute(
        "SELECT CAST(month AS VARCHAR), business_unit, gpu_hours, cost, currency "
        "FROM usage_by_business_unit ORDER BY 1, 2"
    ).fetchall()
    assert bu == [
        ("2026-03-01", "north", Decimal("22.000000"), Decimal("55.000000"), "EUR"),
        ("2026-03-01", "south", Decimal("8.000000"), Decimal("20.000000"), "EUR"),
        ("2026-04-01", "north", Decimal("2.000000"), Decimal("5.000000"), "EUR"),
    ]
    dept = db.execute(
        "SELECT CAST(month AS VARCHAR), business_unit, department, gpu_hours "
        "FROM usage_by_department ORDER BY 1, 2, 3"
    ).fetchall()
    assert dept == [
        ("2026-03-01", "north", "ml", Decimal("22.000000")),
        ("2026-03-01", "south", "ops", Decimal("8.000000")),
        ("2026-04-01", "north", "ml", Decimal("2.000000")),
    ]
    teams = db.execute(
        "SELECT path, sum(gpu_hours) FROM usage_by_level WHERE level = 3 "
        "GROUP BY path ORDER BY path"
    ).fetchall()
    # team-a is in both business units: the move did not rewrite its history
    assert teams == [
        ("north/ml/team-a", Decimal("20.000000")),
        ("north/ml/team-b", Decimal("4.000000")),
        ("south/ops/team-a", Decimal("4.000000")),
        ("south/ops/team-c", Decimal("4.000000")),
    ]
    assert db.execute(
        "SELECT typeof(gpu_hours), typeof(cost), typeof(level) FROM usage_by_level LIMIT 1"
    ).fetchone() == ("DECIMAL(38,6)", "DECIMAL(38,6)", "INTEGER")
    assert mismatches(db) == []


def test_roll_up_counts_open_and_pending_intervals_like_usage_monthly(db):
    _org_usage(db)
    open_intervals(
        db,
        [
            row(
                9,
                "2026-03-05T00:00",
                group="team-c",
                gpus_milli=1000,
                group_path="south/ops/team-c",
            )
        ],
    )  # open: runs to now
    total = "(SELECT sum(gpu_hours) FROM {} WHERE business_unit = 'south')"
    by_unit, monthly = db.execute(  # one query: one now for the open interval
        f"SELECT {total.format('usage_by_business_unit')}, {total.format('usage_monthly')}"
    ).fetchone()
    assert by_unit == monthly and by_unit > Decimal("8")


def _old_database(db):
    """A ledger as the version before group paths left it: no ``group_path`` column in
    ``ledger`` or ``ledger_monthly_pending``, ``ledger_monthly`` keyed without it."""
    db.execute("DROP VIEW usage_monthly")
    db.execute("DROP VIEW usage_by_level")
    db.execute("DROP VIEW usage_by_business_unit")
    db.execute("DROP VIEW usage_by_department")
    db.execute("DROP TABLE ledger_monthly")
    old = LEDGER_MONTHLY.without("group_path", "channel").render(DUCKDB)
    assert "group_path" not in old and "channel" not in old  # channels came later still
    db.execute(old)
    for table in ("ledger", "ledger_monthly_pending"):
        db.execute(f"ALTER TABLE {table} DROP COLUMN channel")  # newer than group_path
        db.execute(f"ALTER TABLE {table} DROP COLUMN group_path")
    t0 = ms("2026-02-01T00:00")
    db.execute(
        "INSERT INTO ledger VALUES "
        "('t-1#1', 't-1', 'alice', 'llm', 'team-a', 'team-a', 'p', 'team-a/p', 'k8s', "
        " 'h100', 1, 1, make_timestamp(?::BIGINT * 1000), "
        " make_timestamp(?::BIGINT * 1000), 'finished', 'sha256:old'), "
        "('t-2#1', 't-2', 'erin', NULL, 'team-b', 'team-b', 'p', 'team-b/p', 'k8s', "
        " 'h100', 2, 1, make_timestamp(?::BIGINT * 1000), NULL, NULL, 'sha256:old'), "
        "('t-3#1', 't-3', 'zed', NULL, 'gone', 'gone', 'p', 'gone/p', 'k8s', "
        " 'h100', 1, 1, make_timestamp(?::BIGINT * 1000), "
        " make_timestamp(?::BIGINT * 1000), 'finished', 'sha256:old')",
        [t0, t0 + 3 * H, t0, t0, t0 + H],
    )
    db.execute(
        "INSERT INTO ledger_monthly SELECT CAST(date_trunc('month', start_at) AS DATE), "
        '"group", coalesce(project, \'\'), "user", policy, profile, resource, pool, '
        "gpu_type, TIMESTAMP '-infinity', 1, date_diff('millisecond', start_at, end_at),"
        " gpus * date_diff('millisecond', start_at, end_at), "
        " time_weight * date_diff('millisecond', start_at, end_at) "
        "FROM ledger WHERE end_at IS NOT NULL"
    )


def test_an_older_database_gains_the_column_and_the_estates_paths(db):
    _old_database(db)
    ensure_schema(db)
    cols = [
        r[0]
        for r in db.execute(
            "SELECT column_name FROM duckdb_columns() "
            "WHERE table_name = 'ledger' ORDER BY column_index"
        ).fetchall()
    ]
    assert cols[-2:] == ["group_path", "channel"]  # both added, in the schema's order
    assert db.execute("SELECT count(*) FROM ledger WHERE channel IS NULL").fetchone()[0] == 3
    # the monthly aggregate counts them as sent through the API (the only channel then)
    assert {r[0] for r in db.execute("SELECT DISTINCT channel FROM ledger_monthly").fetchall()} == {
        "api"
    }
    assert db.execute("SELECT count(*) FROM ledger WHERE group_path IS NULL").fetchone()[0] == 3
    assert mismatches(db) == []  # ledger_monthly rebuilt with the path as a key
    est = compile_dir(str(DAEMON_ESTATE)).estate
    db.execute("BEGIN")
    assert fill_group_paths(db, group_paths(est)) == 2
    db.execute("COMMIT")
    got = db.execute("SELECT interval_id, group_path FROM ledger ORDER BY 1").fetchall()
    assert got == [("t-1#1", "lab/team-a"), ("t-2#1", "lab/team-b"), ("t-3#1", None)]
    kept = db.execute('SELECT "group", group_path FROM ledger_monthly ORDER BY 1').fetchall()
    assert kept == [("gone", ""), ("team-a", "lab/team-a")]
    assert mismatches(db) == []
    dept = db.execute(
        "SELECT department, gpu_hours FROM usage_by_department WHERE month = DATE '2026-02-01'"
    ).fetchall()
    assert dept[0][0] == "lab" and dept[0][1] > Decimal("3")  # team-a's 3 h and team-b's
    # a second start changes nothing: the paths are history now
    ensure_schema(db)
    assert fill_group_paths(db, {"team-a": "elsewhere/team-a"}) == 0
    assert (
        db.execute("SELECT group_path FROM ledger WHERE interval_id = 't-1#1'").fetchone()[0]
        == "lab/team-a"
    )


def test_the_writer_leaves_recorded_paths_alone(db):
    open_intervals(db, [row(1, "2026-03-01T00:00", group_path="north/ml/team-a")])
    assert fill_group_paths(db, {"team-a": "south/ops/team-a"}) == 0
    assert db.execute("SELECT group_path FROM ledger").fetchone()[0] == "north/ml/team-a"
