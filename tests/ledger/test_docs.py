"""Every ```sql block of docs/ledger.md runs, read-only, on a small ledger."""

from __future__ import annotations

import re
import time

import pytest

from kliqued.ledger import close_intervals, open_intervals, run_readonly
from kliqued.ledger.schema import flush_monthly
from tests.conftest import REPO

from .conftest import H, row, set_prices

DOC = REPO / "docs" / "ledger.md"
QUERIES = re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_doc_has_queries():
    assert len(QUERIES) >= 8


@pytest.fixture
def filled(db):
    set_prices(
        db,
        ("h100", "1.85", "2020-01-01"),
        ("l4", "0.35", "2020-01-01"),
        ("h100", "1.65", "2026-07-01"),
    )
    now = int(time.time() * 1000)
    rows = [
        row(
            i,
            now - (i + 1) * 20 * H,
            user=["alice", "bob", "carol"][i % 3],
            group=["llm-research", "vision"][i % 2],
            gpu_type=["h100", "l4", "b200"][i % 3],
            project=[None, "rlhf"][i % 2],
            gpus_milli=[1000, 8000, 500][i % 3],
            group_path=["research/ml/llm-research", "product/apps/vision"][i % 2],
        )
        for i in range(60)
    ]
    open_intervals(db, rows)
    close_intervals(
        db,
        [
            (
                r.interval_id,
                r.start_ms + 10 * H,
                ["finished", "reclaimed by vision", "budget used up"][i % 3],
            )
            for i, r in enumerate(rows[5:])
        ],
    )
    flush_monthly(db)
    close_intervals(db, [(rows[4].interval_id, rows[4].start_ms + H, "failed")] * 3)
    return db


@pytest.mark.parametrize("sql", QUERIES, ids=[f"query{i}" for i in range(len(QUERIES))])
def test_doc_query_runs(filled, sql):
    res = run_readonly(filled.cursor(), sql)
    assert res.columns


@pytest.mark.parametrize("sql", QUERIES, ids=[f"query{i}" for i in range(len(QUERIES))])
def test_doc_query_runs_for_a_department_head(filled, sql):
    """The same SQL with a department head's scope: the same columns, their rows only."""
    res = run_readonly(filled.cursor(), sql, groups=["ml"])
    assert res.columns == run_readonly(filled.cursor(), sql).columns
    assert not out_of_scope(res.columns, res.rows)


def out_of_scope(columns: list[str], rows: list[tuple]) -> list[tuple[str, object]]:
    """The cells of a department head's result that name the other department's group.

    An end reason names the group that took the GPUs ("reclaimed by vision"): that text is
    part of the head's own interval, not a row of the other group, so it is not looked at.
    Matching the whole result's text instead made this test depend on the day of the month:
    the fixture's rows are relative to now, and a doc query that keeps the current month's
    reclaims only met such a reason once the month was about six days old.
    """
    return [
        (name, cell)
        for r in rows
        for name, cell in zip(columns, r)
        if name != "end_reason"
        and isinstance(cell, str)
        and ("vision" in cell or "product" in cell)
    ]


def test_the_scope_check_sees_another_groups_row():
    """out_of_scope catches a leaked row, and ignores a reason naming the taker."""
    assert out_of_scope(["group", "end_reason"], [("vision", "finished")]) == [("group", "vision")]
    assert out_of_scope(["group", "end_reason"], [("llm-research", "reclaimed by vision")]) == []
