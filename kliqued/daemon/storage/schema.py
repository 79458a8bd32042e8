"""The DuckDB file's own tables (the ledger's are ``kliqued.ledger.schema``'s): the log and the
tokens, the ended tasks' history, the snapshots and the compactions' marks.

Here, not beside the code that fills them (``state/history.py``, ``state/snapshot.py``,
``compaction.py``), so that the store creates them without importing the state room: state
imports storage, never the reverse (issue 27; docs/architecture.md).
"""

from __future__ import annotations

import duckdb

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS events (
        seq BIGINT PRIMARY KEY, at_ms BIGINT NOT NULL, kind VARCHAR NOT NULL, task VARCHAR,
        actor VARCHAR, revision VARCHAR, grp VARCHAR, usr VARCHAR, data JSON)""",
    """CREATE TABLE IF NOT EXISTS tokens (
        id VARCHAR PRIMARY KEY, hash VARCHAR NOT NULL UNIQUE, principal VARCHAR NOT NULL,
        name VARCHAR, created_at_ms BIGINT NOT NULL, created_by VARCHAR,
        revoked_at_ms BIGINT)""",
    "ALTER TABLE tokens ADD COLUMN IF NOT EXISTS expires_at_ms BIGINT",
]

HISTORY = """CREATE TABLE IF NOT EXISTS task_history (
    id VARCHAR NOT NULL, usr VARCHAR, grp VARCHAR, resource VARCHAR, pool VARCHAR,
    actor VARCHAR, idem_key VARCHAR, submitted_at_ms BIGINT, ended_at_ms BIGINT,
    doc VARCHAR NOT NULL)"""

SNAPSHOTS = """CREATE TABLE IF NOT EXISTS snapshots (
    seq BIGINT NOT NULL, format INTEGER NOT NULL, build VARCHAR NOT NULL,
    sha256 VARCHAR NOT NULL, size BIGINT NOT NULL, taken_at_ms BIGINT NOT NULL,
    body BLOB NOT NULL)"""

COMPACTIONS = """CREATE TABLE IF NOT EXISTS log_compactions (
    at_ms BIGINT NOT NULL, upto_seq BIGINT NOT NULL, ended_from_ms BIGINT NOT NULL,
    ended_before_ms BIGINT NOT NULL, removed BIGINT NOT NULL)"""


def ensure_tables(conn: duckdb.DuckDBPyConnection) -> None:
    """The history's, the snapshots' and the compactions' tables (the log's: ``SCHEMA``)."""
    for stmt in (HISTORY, SNAPSHOTS, COMPACTIONS):
        conn.execute(stmt)
