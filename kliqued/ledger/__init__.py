"""The usage ledger: one DuckDB row per placement interval, priced per GPU type.

``schema`` creates the tables and views, ``writer`` opens and closes intervals inside the
daemon's transactions, ``sql`` runs finance's read-only queries, ``export`` streams the ledger
as CSV (and turns CSV into Parquet on the client side). docs/ledger.md describes every column.
"""

from .schema import ensure_schema
from .sql import LedgerSqlError, SqlResult, run_readonly
from .writer import (
    IntervalRow,
    close_interval,
    close_intervals,
    fill_group_paths,
    group_paths,
    open_interval,
    open_intervals,
    replace_prices,
)

__all__ = [
    "ensure_schema",
    "IntervalRow",
    "open_interval",
    "open_intervals",
    "close_interval",
    "close_intervals",
    "replace_prices",
    "group_paths",
    "fill_group_paths",
    "run_readonly",
    "SqlResult",
    "LedgerSqlError",
]
