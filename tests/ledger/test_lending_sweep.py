"""The sweep (kliqued.ledger.sweep) gets the month's lending pieces the SQL defines, row for
row, on ledgers made at random: crowded policies, shared start times, fractional GPUs,
reservations that change with a new estate snapshot in the month, a price change, intervals
across the month's ends and some still open. The SQL is the definition (finance's views run
it); the sweep is what statements, the CIO's figures and the split export read."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timedelta, timezone
from types import SimpleNamespace

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kliqued.ledger import close_intervals, ensure_schema, open_intervals
from kliqued.ledger.capacity import record_estate
from kliqued.ledger.lending import lending_pieces_sql, month_pieces
from kliqued.ledger.sql import LedgerSqlError, run_readonly
from kliqued.ledger.sweep import Break, Interval, borrowed_pieces

from .conftest import row, set_prices
from tests.harness.examples import examples

NOV = date(2025, 11, 1)
T0 = datetime(2025, 10, 30, tzinfo=timezone.utc)
STEP = timedelta(hours=6)
POLICIES = ("team-a", "team-b", "team-c")
COLUMNS = (
    "side, interval_id, policy, gpu_type, piece_start, reserved, borrowed_mms, "
    "idle_mms, reserved_mms, lent_mms, per_gpu_hour, price_from"
)


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _estate(revision: str, reservations: dict[str, int]):
    pools = [
        SimpleNamespace(name="p1", kind="kubernetes", gpu_type="h100", capacity_milli=8000),
        SimpleNamespace(name="p2", kind="kubernetes", gpu_type="a100", capacity_milli=4000),
    ]
    return SimpleNamespace(
        revision=revision,
        pools=pools,
        profiles=[SimpleNamespace(name="one", pools=["p1", "p2"])],
        groups=[SimpleNamespace(name="ml", ancestors=[])]
        + [SimpleNamespace(name=g, ancestors=["ml"]) for g in POLICIES],
        policies=[
            SimpleNamespace(name=g, group=g, envelope=False, reservation_milli=r, profiles=["one"])
            for g, r in reservations.items()
        ],
    )


reservation = st.sampled_from([0, 500, 1000, 1500, 2000, 3000])
interval = st.tuples(
    st.sampled_from(POLICIES),
    st.integers(0, 4 * 36),  # start, in steps
    st.one_of(st.none(), st.integers(1, 4 * 12)),  # length (None: open)
    st.sampled_from([500, 1000, 1000, 2000]),
    st.sampled_from(["h100", "a100"]),
)
ledger = st.fixed_dictionaries(
    {
        "first": st.fixed_dictionaries({p: reservation for p in POLICIES}),
        "second": st.one_of(
            st.none(),
            st.tuples(
                st.integers(1, 4 * 28), st.fixed_dictionaries({p: reservation for p in POLICIES})
            ),
        ),
        "price_change": st.one_of(st.none(), st.integers(1, 4 * 28)),
        "intervals": st.lists(interval, max_size=40),
    }
)


def _build(spec) -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect(config={"enable_external_access": False})
    ensure_schema(conn)
    prices = [("h100", "2.35", "2025-01-01"), ("a100", "1.10", "2025-01-01")]
    if spec["price_change"] is not None:
        prices.append(
            ("h100", "2.50", (T0 + spec["price_change"] * STEP).replace(tzinfo=None).isoformat())
        )
    set_prices(conn, *prices)
    record_estate(conn, _estate("sha256:a", spec["first"]), _ms(T0 - timedelta(days=5)))
    if spec["second"] is not None:
        at, res = spec["second"]
        record_estate(conn, _estate("sha256:b", res), _ms(T0 + at * STEP))
    rows, ends = [], []
    for n, (policy, start, length, milli, gpu_type) in enumerate(spec["intervals"]):
        rows.append(
            replace(
                row(
                    n,
                    _ms(T0 + start * STEP),
                    group=policy,
                    group_path=f"ml/{policy}",
                    gpus_milli=milli,
                    gpu_type=gpu_type,
                ),
                pool="p1" if gpu_type == "h100" else "p2",
            )
        )
        if length is not None:
            ends.append((f"t-{n}#1", _ms(T0 + (start + length) * STEP), "finished"))
    if rows:
        open_intervals(conn, rows)
        close_intervals(conn, ends)
    return conn


def _pieces(conn, relation: str) -> list[tuple]:
    return conn.execute(
        f"SELECT {COLUMNS} FROM {relation} WHERE month = DATE '2025-11-01' ORDER BY ALL"
    ).fetchall()


@pytest.mark.slow  # long on its own: make test, not make check
@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledger)
def test_the_sweep_gets_the_pieces_the_sql_defines(spec):
    conn = _build(spec)
    lo = "TIMESTAMP '2025-11-01'"
    defined = _pieces(conn, f"({lending_pieces_sql(lo, f'({lo} + INTERVAL 1 MONTH)', 'main.')})")
    with month_pieces(conn, NOV) as pieces:
        assert _pieces(conn, pieces) == defined
    assert _pieces(conn, "lending_pieces") == defined  # the view, over the whole ledger
    conn.close()


def test_a_crowded_policy_lends_from_its_newest_placements_down():
    """Reservation 2 GPUs; four 1-GPU intervals start one after another; as older ones end,
    the newer ones fall within the reservation."""
    breaks = [Break("p", 1, 2000), Break("p", 7, None)]
    intervals = [
        Interval("p", 1, 11, 1000, 1, 4),
        Interval("p", 2, 12, 1000, 2, 6),
        Interval("p", 3, 13, 1000, 3, 7),
        Interval("p", 4, 14, 1000, 4, 7),
    ]
    # 1 a | 2 a b | 3 a b c: c borrowed | 4-5 b c d: a ended, d borrowed, c not | 6 c d
    assert sorted(borrowed_pieces(breaks, intervals)) == [(13, 3, 4, 1000), (14, 4, 6, 1000)]


def test_a_partly_borrowed_interval_gets_a_piece_per_share():
    """Reservation 1.5 GPUs: a 1-GPU interval, then a 2-GPU one borrowing 1.5 of its 2 until
    the first ends, then 0.5 (its share above the reservation)."""
    breaks = [Break("p", 1, 1500), Break("p", 4, None)]
    intervals = [Interval("p", 1, 11, 1000, 1, 3), Interval("p", 2, 12, 2000, 2, 4)]
    assert sorted(borrowed_pieces(breaks, intervals)) == [(12, 2, 3, 1500), (12, 3, 4, 500)]


def test_a_hard_break_cuts_every_open_piece():
    breaks = [Break("p", 1, 0), Break("p", 2, 0), Break("p", 3, None)]
    assert sorted(borrowed_pieces(breaks, [Interval("p", 1, 11, 1000, 1, 3)])) == [
        (11, 1, 2, 1000),
        (11, 2, 3, 1000),
    ]


def test_the_swept_table_is_the_servers_alone_and_dropped_after_use():
    """The sandbox lets the month's query scan the temporary table the server made for it,
    and nothing else: finance's own SQL cannot name it; it is gone once the block ends."""
    conn = _build(
        {
            "first": {"team-a": 1000, "team-b": 0, "team-c": 0},
            "second": None,
            "price_change": None,
            "intervals": [("team-a", 8, 8, 2000, "h100"), ("team-b", 9, 4, 1000, "h100")],
        }
    )
    with month_pieces(conn, NOV) as pieces:
        res = run_readonly(
            conn, "SELECT sum(borrowed_hours) AS b FROM borrowed_usage", pieces=pieces
        )
        # 1 of team-a's 2 GPUs for 48 h, team-b's 1 (it reserves none) for 24 h
        assert str(res.rows[0][0]) == "72.000000"
        name = conn.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchone()[0]
        with pytest.raises(LedgerSqlError, match="not a ledger table"):
            run_readonly(conn, f"SELECT * FROM {name}")
        with pytest.raises(LedgerSqlError):
            run_readonly(conn, f"SELECT * FROM temp.main.{name}")
    assert conn.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchone() == (0,)
