"""A group admin's ledger SQL sees only their subtree's rows, whatever the query (issue 12,
item 4), on the daemon's real database layout. tests/daemon/test_ledger_scope.py runs the
same over HTTP against a real daemon; this file covers the forms exhaustively and fast."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kliqued.daemon.storage.store import Store
from kliqued.ledger import LedgerSqlError, open_intervals, run_readonly
from kliqued.ledger.export import export_csv
from kliqued.ledger.sandbox import RELATIONS
from kliqued.ledger.scope import COVERED
from tests.ledger.conftest import ms, row

from .test_sql_sandbox import LEAKS, SECRET

OTHERS = ("carl", "team-c", "south", "ops", "zed", "gone", SECRET)
"""Text that only the other department's rows (and rows of no path, and the tokens) hold."""


@pytest.fixture(scope="module")
def _built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The database every test starts from, built once (its schema alone takes 0.15 s): each
    test gets a copy of the file, so what one test does reaches no other."""
    path = tmp_path_factory.mktemp("scope") / "kliqued.duckdb"
    s = Store(str(path))
    s.ensure_schema()
    s.conn.execute(
        "INSERT INTO tokens (id, hash, principal, name, created_at_ms, created_by)"
        " VALUES ('tok-1', ?, 'user:alice', 'laptop', 1, 'role:admin')",
        [SECRET],
    )
    s.conn.execute(
        "INSERT INTO prices (gpu_type, per_gpu_hour, currency, effective_from) "
        "VALUES ('h100', 2.5, 'EUR', TIMESTAMP '2026-01-01')"
    )
    t0 = ms("2026-03-01T00:00")
    open_intervals(
        s.conn,
        [
            row(1, t0, user="alice", group="team-a", group_path="north/ml/team-a"),
            row(2, t0, user="bob", group="team-b", group_path="north/ml/team-b"),
            row(3, t0, user="carl", group="team-c", group_path="south/ops/team-c"),
            row(4, t0, user="zed", group="gone", group_path=None),
        ],
    )
    s.conn.execute(
        "UPDATE ledger SET end_at = start_at + INTERVAL 2 HOUR "
        "WHERE interval_id IN ('t-2#1', 't-3#1')"
    )
    s.conn.execute(
        "INSERT INTO ledger_monthly_pending SELECT * FROM ledger "
        "WHERE interval_id IN ('t-2#1', 't-3#1')"
    )
    s.close()
    return path


@pytest.fixture
def store(_built: Path, tmp_path: Path):
    copy = tmp_path / "kliqued.duckdb"
    shutil.copy(_built, copy)
    s = Store(str(copy))
    yield s
    s.close()


def test_every_relation_ledger_sql_may_name_is_scoped():
    assert set(RELATIONS) <= COVERED


ATTACKS = [
    "SELECT * FROM ledger",
    "SELECT * FROM ledger WHERE \"group\" = 'team-c' OR \"user\" = 'carl'",
    "SELECT * FROM LEDGER",
    'SELECT * FROM "Ledger"',
    "FROM ledger",
    "SELECT * FROM (SELECT * FROM ledger) s WHERE s.\"user\" = 'carl'",
    "SELECT (SELECT string_agg(\"user\", ',') FROM ledger)",
    "SELECT * FROM usage WHERE task IN (SELECT task FROM usage_priced WHERE \"group\" = 'team-c')",
    "SELECT * FROM ledger l, LATERAL (SELECT * FROM usage u WHERE u.\"user\" = 'carl') x",
    "WITH x AS (SELECT * FROM ledger) SELECT * FROM x",
    "WITH ledger AS (SELECT * FROM ledger) SELECT * FROM ledger",
    "WITH usage AS (SELECT 1 AS one) SELECT * FROM usage_priced",
    "WITH RECURSIVE r AS (SELECT * FROM ledger UNION ALL SELECT * FROM r WHERE false) "
    "SELECT * FROM r",
    'SELECT a."user", b."user" FROM ledger a JOIN usage_by_month b ON true',
    'SELECT * FROM ledger a FULL JOIN usage_monthly b ON a."group" = b."group"',
    'SELECT "user", group_path FROM ledger UNION SELECT "user", group_path FROM usage '
    'UNION ALL SELECT "user", group_path FROM usage_monthly',
    "SELECT * FROM usage_priced EXCEPT SELECT * FROM usage_priced WHERE false",
    "SELECT count(*), sum(gpus), string_agg(\"user\", ','), list(group_path), "
    'max("group"), min("group"), list(DISTINCT task), histogram("user") FROM ledger',
    'SELECT arg_max("user", start_at), any_value("group") FROM usage',
    'SELECT "user", count(*) FROM ledger GROUP BY ROLLUP ("user")',
    'SELECT "user", sum(gpus) OVER () FROM ledger',
    "SELECT * FROM usage_by_month",
    "SELECT * FROM usage_monthly",
    "SELECT * FROM usage_by_level",
    "SELECT * FROM usage_by_business_unit",
    "SELECT * FROM usage_by_department",
    'SELECT * FROM unnest((SELECT list("user") FROM ledger))',
    "SELECT * FROM price_periods, usage_priced",
]

PROBES = [
    # an error raised on another department's row would show it (or that it exists):
    # the scope's filter runs first, so these must succeed
    "SELECT count(*) FROM ledger WHERE CASE WHEN \"user\" = 'carl' THEN error('seen') "
    "ELSE true END",
    'SELECT count(*) FROM ledger WHERE "user" = \'carl\' AND CAST("user" AS INTEGER) = 1',
    'SELECT sum(CASE WHEN "group" = \'team-c\' THEN CAST("user" AS INTEGER) END) AS n FROM usage',
    'SELECT count(*) FROM usage_monthly WHERE "user" = \'carl\' AND error("user") IS NULL',
    "SELECT count(*) FROM usage_by_level WHERE name = 'south' AND error(name) IS NULL",
]


def _text(result) -> str:
    return json.dumps(result.to_json())


@pytest.mark.parametrize("sql", ATTACKS + PROBES)
def test_a_department_admin_reads_only_their_subtree(store, sql):
    res = run_readonly(store.conn.cursor(), sql, groups=["ml"])
    text = _text(res)
    assert not [o for o in OTHERS if o in text], text


@pytest.mark.parametrize("sql", ATTACKS)
def test_a_team_admin_reads_only_their_team(store, sql):
    res = run_readonly(store.conn.cursor(), sql, groups=["team-c"])
    text = _text(res)
    assert not [o for o in ("alice", "bob", "team-a", "team-b", "north", "zed") if o in text]


def test_the_subtrees_figures(store):
    """Aggregates see exactly the subtree's rows: no more, and no fewer."""
    cur = store.conn.cursor()
    q = (
        "SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM usage), "
        '(SELECT string_agg(DISTINCT "user", \',\' ORDER BY "user") FROM usage_priced), '
        "(SELECT sum(ms) FROM usage_by_department WHERE month = DATE '2026-03-01')"
    )
    finance = run_readonly(cur, q).rows[0]
    dept = run_readonly(cur, q, groups=["ml"]).rows[0]
    team = run_readonly(cur, q, groups=["team-c"]).rows[0]
    bu = run_readonly(cur, q, groups=["north", "team-c"]).rows[0]
    assert finance[:3] == [4, 4, "alice,bob,carl,zed"]
    assert dept[:3] == [2, 2, "alice,bob"]
    assert team == [1, 1, "carl", 2 * 3_600_000]
    assert bu[:3] == [3, 3, "alice,bob,carl"]
    assert run_readonly(cur, q, groups=[]).rows[0] == [0, 0, None, None]


def test_columns_and_order_are_the_querys_own(store):
    res = run_readonly(
        store.conn.cursor(),
        'SELECT "user" AS who, interval_id FROM ledger ORDER BY who DESC',
        groups=["north"],
    )
    assert res.columns == ["who", "interval_id"] and res.rows == [
        ["bob", "t-2#1"],
        ["alice", "t-1#1"],
    ]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM main.ledger",
        "SELECT * FROM kliqued.ledger",
        "SELECT * FROM kliqued.main.usage",
        "SELECT * FROM ledger WHERE task IN (SELECT task FROM main.usage)",
        "WITH x AS (SELECT 1) SELECT * FROM main.usage_monthly",
        "SELECT * FROM ledger_monthly",
        "SELECT * FROM scoped",
    ],
)
def test_names_past_the_scope_are_refused(store, sql):
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(store.conn.cursor(), sql, groups=["ml"])
    assert err.value.code in ("not-allowed", "sql-error") and err.value.message
    assert not [o for o in OTHERS if o in err.value.message]


@pytest.mark.parametrize("sql", LEAKS)
def test_a_scoped_query_is_still_sandboxed(store, sql):
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(store.conn.cursor(), sql, groups=["ml"])
    assert err.value.code in ("not-allowed", "sql-error")
    assert SECRET not in err.value.message and "private" not in err.value.message


def test_the_export_is_scoped_too(store):
    cur = store.conn.cursor()
    t0, t1 = ms("2026-01-01T00:00"), ms("2027-01-01T00:00")
    whole = "".join(export_csv(cur, t0, t1))
    mine = "".join(export_csv(cur, t0, t1, groups=["ml"]))
    assert "carl" in whole and len(whole.splitlines()) == 5
    lines = mine.splitlines()
    assert len(lines) == 3 and not [o for o in OTHERS if o in mine]
    assert "group_path,business_unit,department" in lines[0]
    assert ",north/ml/team-a,north,ml," in lines[1]


def test_an_error_points_at_the_querys_own_line(store):
    with pytest.raises(LedgerSqlError) as err:
        run_readonly(store.conn.cursor(), "SELECT 1 AS one,\n  nope FROM usage", groups=["ml"])
    assert err.value.code == "sql-error" and "LINE 2:   nope FROM usage" in err.value.message
