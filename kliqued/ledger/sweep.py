"""Borrowed pieces by a sweep over each policy's segments in time order: the fast way to the
rows that :mod:`kliqued.ledger.lending` derives in SQL by expanding every interval over its
policy's segments (intervals times concurrency, docs/ledger.md "What the derivation costs").

Pure: segments and intervals in, pieces out; no clock, no I/O. The SQL stays the definition
(finance's views read it, and tests/ledger/test_lending_sweep.py holds this sweep to it,
piece for piece, on ledgers made at random).

Why a sweep is enough. Within a policy, an interval's borrowed GPUs at a moment are its part
of the policy's excess ``E = in_use - reserved`` counted from the newest placement down
(engine.md: a reclaim takes the newest first), so the borrowed intervals are a suffix of the
active ones in placement order: all of it for those above one *boundary* interval, a part
for the boundary, none below. From one segment to the next the boundary moves only by what
started or ended, so a step re-reads the intervals between the old and the new boundary and
those that started: the work grows with the intervals, not with their concurrency, except at
a hard break (a month, a snapshot's bound, a price change) where every open piece is cut.

Rows are plain tuples in the order of the SQL that reads them
(:func:`kliqued.ledger.lending.sweep_inputs_sql`); the named tuples below document them.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Iterable, NamedTuple, Sequence


class Break(NamedTuple):
    """A segment of a policy that starts at a hard break (the SQL's ``seg`` row with
    ``hard``: a month, a snapshot's bound, a price change; a piece never spans one), with
    the reservation in thousandths of a GPU from there to the next break (None outside
    every recorded estate snapshot: nothing is borrowed there). The reservation changes
    only at a snapshot's bound, so only at a break."""

    policy: str
    idx: int
    reserved: int | None


class Interval(NamedTuple):
    """A ledger interval as the sweep sees it: its placement rank in its policy (by start,
    then id: the order reclaims undo), a key of the caller's (the SQL's number for it),
    thousandths of GPUs, and the segments it covers, ``first`` up to but not including
    ``last``."""

    policy: str
    rank: int
    key: int
    milli: int
    first: int
    last: int


Piece = tuple[int, int, int, int]
"""A borrowed piece: the interval's key, first segment, the segment after its last, borrowed
milli."""


def borrowed_pieces(breaks: Sequence[Break], intervals: Iterable[Interval]) -> list[Piece]:
    """The borrowed pieces of one policy: for each interval, each maximal run of segments
    over which its borrowed GPUs stay the same and above zero, cut at hard breaks.
    ``breaks``: the policy's hard breaks, its first segment among them. Only segments where
    something starts, ends or breaks are visited: nothing changes in the others."""
    starts: dict[int, list[Interval]] = {}
    ends: dict[int, list[Interval]] = {}
    top = 0
    for iv in intervals:
        if iv[5] > iv[4]:
            starts.setdefault(iv[4], []).append(iv)
            ends.setdefault(iv[5], []).append(iv)
        top = max(top, iv[1])
    reserved_at = {b[1]: b[2] for b in breaks}
    out: list[Piece] = []
    emit = out.append
    # by rank (lists, not dicts: this loop is the statements' hot path)
    none = top + 1  # a rank above every interval's: the boundary when
    milli = [0] * (none + 1)  # nothing is borrowed
    keys = [0] * (none + 1)
    held = [0] * (none + 1)  # the borrowed milli of the rank's open piece, 0: none
    since = [0] * (none + 1)  # the open piece's first segment
    active: list[int] = []  # the active intervals' ranks, in order
    in_use = 0
    bound = none  # the boundary's rank
    suffix = 0  # milli of the active ranks at or above the boundary
    cut = True  # no piece is open: the next segment opens all it holds
    reserved: int | None = None
    for idx in sorted({*starts, *ends, *reserved_at}):
        gone = ends.get(idx)
        if gone is not None:
            for iv in gone:
                rank = iv[1]
                if held[rank]:
                    emit((iv[2], since[rank], idx, held[rank]))
                    held[rank] = 0
                active.pop(bisect_left(active, rank))
                in_use -= iv[3]
                if rank >= bound:
                    suffix -= iv[3]
        new = starts.get(idx)
        if new is not None:
            for iv in new:
                rank = iv[1]
                milli[rank] = iv[3]
                keys[rank] = iv[2]
                if not active or rank > active[-1]:
                    active.append(rank)  # the usual case: the newest placement
                else:
                    insort(active, rank)
                in_use += iv[3]
                if rank >= bound:
                    suffix += iv[3]
        if idx in reserved_at:  # a hard break: every open piece ends here
            reserved = reserved_at[idx]
            for rank in active:
                if held[rank]:
                    emit((keys[rank], since[rank], idx, held[rank]))
                    held[rank] = 0
            cut = True
        if reserved is None:
            continue
        excess = in_use - reserved
        # move the boundary to the lowest rank still needed to hold the excess
        old = bound
        n = len(active)
        pos = bisect_left(active, bound)
        while pos < n and suffix - milli[active[pos]] >= excess:
            suffix -= milli[active[pos]]
            pos += 1
        while pos > 0 and suffix < excess:
            pos -= 1
            suffix += milli[active[pos]]
        bound = active[pos] if pos < n else none
        # what may have changed: between the two boundaries (everything borrowed after a
        # cut), and what started
        if cut:
            lo, hi, cut = pos, n, False
        elif old <= bound:
            lo, hi = bisect_left(active, old), pos + 1
        else:
            lo, hi = pos, n if old == none else bisect_left(active, old) + 1
        touched = active[lo:hi]
        if new is not None:
            last = touched[-1] if touched else -1
            touched += [iv[1] for iv in new if iv[1] > last]
        for rank in touched:
            m = milli[rank]
            value = m if rank > bound else excess - suffix + m if rank == bound else 0
            h = held[rank]
            if h == value:
                continue
            if h:
                emit((keys[rank], since[rank], idx, h))
            held[rank] = value
            if value:
                since[rank] = idx
    return out
