"""The ledger's writes as data: what a batch changes in the ledger, not how.

The daemon's transactions carry these records (beside the events and the token writes), and
each backend writes them in its own dialect: :func:`apply_duck` on the DuckDB file (the
functions of :mod:`.writer`), ``pgwriter.apply`` in the batch's PostgreSQL transaction. So
neither the daemon nor the sequencer knows where the ledger is kept, and the two ledgers of
one deployment get the same changes in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Union

from compiler.compiled import CompiledEstate

from . import capacity, lost, writer
from .db import Conn


@dataclass(frozen=True)
class OpenIntervals:
    """Placements: ledger rows with no end yet (opened before any close of the same batch)."""

    rows: tuple[writer.IntervalRow, ...]


@dataclass(frozen=True)
class CloseIntervals:
    """Ends of open intervals, ``(interval_id, end_ms, reason)``; closing twice is a no-op."""

    items: tuple[tuple[str, int, str], ...]


@dataclass(frozen=True)
class ReplacePrices:
    """The prices of a newly applied estate (a ``CompiledEstate``)."""

    estate: CompiledEstate


@dataclass(frozen=True)
class RecordEstate:
    """The capacity and reservations of an applied estate from ``at_ms`` on."""

    estate: CompiledEstate
    at_ms: int


@dataclass(frozen=True)
class FillGroupPaths:
    """The paths of the estate in force for rows recorded before the ledger kept them."""

    paths: dict[str, str]


@dataclass(frozen=True)
class OpenCloudNode:
    """A cloud node's start (``cloud_nodes``)."""

    data: dict[str, Any]
    start_ms: int
    revision: str | None


@dataclass(frozen=True)
class CloseCloudNode:
    """A cloud node's end (never before its start)."""

    node: str
    end_ms: int
    reason: str


@dataclass(frozen=True)
class RecordPreemptions:
    """The engine's preemptions of a pass with their lost work (``preemptions``,
    :mod:`.lost`); written after the closes of the intervals they ended."""

    rows: tuple[lost.PreemptionRow, ...]


LedgerWrite = Union[
    OpenIntervals,
    CloseIntervals,
    ReplacePrices,
    RecordEstate,
    FillGroupPaths,
    OpenCloudNode,
    CloseCloudNode,
    RecordPreemptions,
]
LEDGER_WRITES = (
    OpenIntervals,
    CloseIntervals,
    ReplacePrices,
    RecordEstate,
    FillGroupPaths,
    OpenCloudNode,
    CloseCloudNode,
    RecordPreemptions,
)


def opens(rows: Iterable[writer.IntervalRow]) -> OpenIntervals:
    return OpenIntervals(tuple(rows))


def closes(items: Iterable[tuple[str, int, str]]) -> CloseIntervals:
    return CloseIntervals(tuple((i, int(e), r) for i, e, r in items))


def apply_duck(conn: Conn, op: LedgerWrite) -> object:
    """Writes ``op`` on a DuckDB connection, inside the caller's transaction."""
    if isinstance(op, OpenIntervals):
        return writer.open_intervals(conn, op.rows)
    if isinstance(op, CloseIntervals):
        return writer.close_intervals(conn, op.items)
    if isinstance(op, ReplacePrices):
        return writer.replace_prices(conn, op.estate)
    if isinstance(op, RecordEstate):
        return capacity.record_estate(conn, op.estate, op.at_ms)
    if isinstance(op, FillGroupPaths):
        return writer.fill_group_paths(conn, op.paths)
    if isinstance(op, OpenCloudNode):
        return writer.open_cloud_node(op.data, op.start_ms, op.revision)(conn)
    if isinstance(op, CloseCloudNode):
        return writer.close_cloud_node(op.node, op.end_ms, op.reason)(conn)
    if isinstance(op, RecordPreemptions):
        return lost.write_duck(conn, op.rows)
    raise TypeError(f"not a ledger write: {op!r}")
