"""export_csv: the rows overlapping [from, to), priced; csv_to_parquet round trip."""

from __future__ import annotations

import csv
import io
from datetime import timezone
from decimal import Decimal

import duckdb
import pytest

from kliqued.ledger import close_intervals, open_intervals
from kliqued.ledger.export import (
    EXPORT_COLUMNS,
    SUMMARY_DIMENSIONS,
    csv_to_parquet,
    export_csv,
    summary,
)

from .conftest import ms, row, set_prices


@pytest.fixture
def filled(db):
    set_prices(db, ("h100", "2.35", "2026-01-01"), ("h100", "1.95", "2026-07-01"))
    open_intervals(
        db,
        [
            row(1, "2026-05-31T00:00"),  # ends before the range
            row(2, "2026-05-31T23:00", gpus_milli=2000, project=None),  # overlaps the start
            row(3, "2026-06-15T00:00", user="bob, jr."),  # inside (a name with a comma)
            row(4, "2026-07-01T00:00"),  # starts at `to`: outside
            row(5, "2026-06-20T00:00"),  # open: overlaps
        ],
    )
    close_intervals(
        db,
        [
            ("t-1#1", ms("2026-06-01T00:00"), "finished"),
            ("t-2#1", ms("2026-06-01T01:00"), "reclaimed by team-b"),
            ("t-3#1", ms("2026-06-15T02:30"), "failed"),
            ("t-4#1", ms("2026-07-01T01:00"), "finished"),
        ],
    )
    return db


def test_export_rows_and_header(filled):
    chunks = list(export_csv(filled, ms("2026-06-01T00:00"), ms("2026-07-01T00:00"), chunk_rows=1))
    assert len(chunks) == 4  # the header, then one chunk per row
    rows = list(csv.DictReader(io.StringIO("".join(chunks))))
    assert list(rows[0]) == [n for n, _ in EXPORT_COLUMNS]
    assert [r["interval_id"] for r in rows] == ["t-2#1", "t-3#1", "t-5#1"]
    r2, r3, r5 = rows
    assert r2["project"] == "" and r2["gpus"] == "2.000" and r2["hours"] == "2.000000"
    assert r2["start_at"] == "2026-05-31T23:00:00.000Z"
    assert r2["end_at"] == "2026-06-01T01:00:00.000Z"
    assert r2["end_reason"] == "reclaimed by team-b"
    assert r2["per_gpu_hour"] == "2.350000" and r2["cost"] == "9.400000"
    assert r3["user"] == "bob, jr." and r3["currency"] == "EUR"
    assert r5["end_at"] == "" and float(r5["hours"]) > 0


def test_summary_sums_exactly_the_exported_rows_per_dimension(filled):
    """The dashboard's usage page (summary) and its CSV download (export_csv) read the same
    rows: each breakdown's sums are the CSV's, to the millionth."""
    start, end = ms("2026-06-01T00:00"), ms("2026-06-15T01:00")  # t-5 still closed out
    rows = list(csv.DictReader(io.StringIO("".join(export_csv(filled, start, end)))))
    for dim in SUMMARY_DIMENSIONS:
        want: dict = {}
        for r in rows:
            key = r[dim] or None
            h, c = want.get(key, (Decimal(0), Decimal(0)))
            want[key] = (h + Decimal(r["gpu_hours"]), c + Decimal(r["cost"] or 0))
        got = summary(filled, start, end, dim)
        assert {v: (Decimal(h), Decimal(c)) for v, h, c, _ in got} == want, dim
    assert [v for v, *_ in summary(filled, start, end, "user")] == ["alice", "bob, jr."]
    assert summary(filled, ms("2030-01-01T00:00"), ms("2030-02-01T00:00"), "group") == []
    with pytest.raises(ValueError, match="no breakdown by 'colour'"):
        summary(filled, start, end, "colour")


def test_export_empty_range_has_a_header(filled):
    text = "".join(export_csv(filled, ms("2030-01-01T00:00"), ms("2030-02-01T00:00")))
    assert text.splitlines() == [",".join(n for n, _ in EXPORT_COLUMNS)]
    with pytest.raises(ValueError):
        list(export_csv(filled, 2, 1))


def test_csv_to_parquet_round_trip(filled, tmp_path):
    src = tmp_path / "ledger.csv"
    src.write_text("".join(export_csv(filled, ms("2026-01-01T00:00"), ms("2027-01-01T00:00"))))
    out = tmp_path / "sub" / "ledger.parquet"
    out.parent.mkdir()  # the export creates no directory
    assert csv_to_parquet(src, out) == 5
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp left
    con = duckdb.connect()
    types = dict(
        con.execute(
            f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet('{out}'))"
        ).fetchall()
    )
    # the ledger's times are instants: TIMESTAMPTZ, Parquet's isAdjustedToUTC=true
    stamp = "TIMESTAMP WITH TIME ZONE"
    assert types == {n: stamp if t == "TIMESTAMP" else t for n, t in EXPORT_COLUMNS}
    flags = con.execute(
        f"SELECT name, logical_type FROM parquet_schema('{out}') WHERE name IN ('start_at', 'end_at')"
    ).fetchall()
    assert len(flags) == 2 and all("isAdjustedToUTC=1" in str(t) for _, t in flags), flags
    assert oct(out.stat().st_mode & 0o777) == oct(0o600)  # private, as the CSV export
    back = con.execute(
        f"SELECT interval_id, gpus, start_at, end_at, project, cost "
        f"FROM read_parquet('{out}') ORDER BY interval_id"
    ).fetchall()
    assert back[1][0] == "t-2#1" and back[1][1] == Decimal("2.000")
    start = back[1][2].astimezone(timezone.utc)
    assert start.isoformat() == "2026-05-31T23:00:00+00:00" and back[1][4] is None
    assert back[1][5] == Decimal("9.400000")
    assert back[4][3] is None  # the open interval


def test_export_never_creates_directories(tmp_path, capsys, monkeypatch):
    """Issue 9, finding 15: `ledger export -o` created missing directories (as root, for a
    root user) without asking. A missing directory is an error naming it, before any
    request is made (the URL here answers nothing)."""
    from kliqued.cli import main
    from kliqued.sdk import Client, KliqueError

    missing = tmp_path / "no" / "such"
    client = Client("http://127.0.0.1:9", "kq_test")
    for fmt in ("csv", "parquet"):
        with pytest.raises(KliqueError) as err:
            client.ledger_export(
                "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", missing / f"out.{fmt}", format=fmt
            )
        assert str(missing) in err.value.message and "does not exist" in err.value.message
    monkeypatch.setenv("KLIQUE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("KLIQUE_TOKEN", "kq_test")
    rc = main(
        [
            "ledger",
            "export",
            "--from",
            "2026-01-01",
            "--to",
            "2026-02-01",
            "-o",
            str(missing / "nov.parquet"),
        ]
    )
    err_text = capsys.readouterr().err
    assert rc == 1 and str(missing) in err_text and "Traceback" not in err_text
    with pytest.raises(FileNotFoundError):
        csv_to_parquet(tmp_path / "in.csv", missing / "x.parquet")
    assert not (tmp_path / "no").exists()
    with pytest.raises(KliqueError) as err:  # an existing directory is not a file
        client.ledger_export("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", tmp_path)
    assert "is a directory" in err.value.message
