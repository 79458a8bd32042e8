"""What the ledger needs of a database connection: DuckDB's connections and cursors and
psycopg's connections and cursors all have it. The ledger's functions take these rather
than one driver's class, because the same function reads either database (``pg=True``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, Union

import duckdb
import psycopg


class Rows(Protocol):
    """An executed statement's result. Rows are tuples of driver values (Any: their types
    are the query's columns, which the SQL text decides)."""

    @property
    def description(self) -> Sequence[Any] | None: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchmany(self, size: int, /) -> list[Any]: ...


class Conn(Protocol):
    """A connection or cursor that executes one statement with optional parameters."""

    def execute(self, query: str, params: Any = ..., /) -> Rows: ...


AnyLedgerConn = Union[duckdb.DuckDBPyConnection, "psycopg.Connection[Any]"]
"""The DuckDB file's connection (or a cursor of it), or PostgreSQL's (``pg=True``)."""


class Fetching(Protocol):
    """A cursor whose rows are fetched a chunk at a time (DuckDB's, psycopg's server-side)."""

    def fetchmany(self, size: int, /) -> list[Any]: ...


def scalar(conn: Conn, sql: str, params: Any = None) -> Any:
    """The first column of the first row of a query that always returns one (an aggregate,
    ``current_setting``...)."""
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise LookupError(f"no row from {sql!r}")
    return row[0]
