"""`kliqued ledger sql`'s table shows numbers as the query returns them (issue 10, bug 1)."""

from __future__ import annotations

from kliqued.commands.ledger import render_table


def test_doubles_and_decimals_are_shown_as_returned():
    res = {
        "columns": ["a", "b", "c", "d", "e", "n", "s"],
        "types": [
            "DOUBLE",
            "DOUBLE",
            "DOUBLE",
            "DECIMAL(18,6)",
            "DECIMAL(38,2)",
            "INTEGER",
            "VARCHAR",
        ],
        "rows": [[3.49, 0.0004, 2.346, "1.850000", "0.39", 12, None]],
    }
    head, line = render_table(res).splitlines()
    assert head.split() == ["a", "b", "c", "d", "e", "n", "s"]
    assert line.split() == ["3.49", "0.0004", "2.346", "1.850000", "0.39", "12", "NULL"]
