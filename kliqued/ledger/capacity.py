"""Declared capacity over time, for idle cost and the CIO's views of the estate's use.

The ledger records what was *used*; what was *there* is the pools' declared capacity (and
the policies' reservations) in each estate revision. The daemon copies both into the ledger
whenever it applies a revision, in the same transaction as the ``estate_applied`` event,
with the time it applied it: a snapshot holds from then until the next one. So capacity is
known as the estate said it was at each moment, and so is its cost, priced like usage (the
price in force at the start of each month piece).

- ``capacity``: one row per pool per applied revision (``gpus``: the declared capacity; an
  autoscaled cloud pool's ``autoscale.max``, the most it may cost).
- ``reservations``: one row per policy with a reservation per applied revision, with the
  group's path (who pays for the reserved GPUs nobody used, by default).

A database from before these tables starts its history at the next revision applied (the
daemon's start applies one): capacity before it is unknown, and the views say nothing about
those months rather than guess.

Both tables are defined in :mod:`.tables` (``CAPACITY``, ``RESERVATIONS``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from compiler.compiled import CompiledEstate, CPolicy

from .db import Conn


def _ts(at_ms: int) -> datetime:
    return datetime.fromtimestamp(at_ms / 1000, tz=timezone.utc).replace(tzinfo=None)


def reserved_gpu_type(estate: CompiledEstate, policy: CPolicy) -> str | None:
    """The GPU type a policy's reserved GPUs are priced at: that of the first pool of its
    first profile, where the engine places its work first (docs/decisions.md); None when it
    has no profile or pool."""
    pools = {p.name: p for p in estate.pools}
    profiles = {p.name: p for p in estate.profiles}
    for name in policy.profiles:
        prof = profiles.get(name)
        if prof is not None and prof.pools and prof.pools[0] in pools:
            return pools[prof.pools[0]].gpu_type
    return None


def record_estate(conn: Conn, estate: CompiledEstate, at_ms: int) -> bool:
    """Snapshots ``estate``'s pool capacities and reservations from ``at_ms`` on (in the
    caller's transaction). The same revision as the latest snapshot is not recorded again (a
    restart re-applies the running revision); returns whether a snapshot was written."""
    latest = conn.execute(
        "SELECT revision FROM capacity ORDER BY effective_from DESC LIMIT 1"
    ).fetchone()
    if latest is not None and latest[0] == estate.revision:
        return False
    at = _ts(at_ms)
    pools = [
        (at, estate.revision, p.name, p.kind, p.gpu_type, Decimal(p.capacity_milli) / 1000)
        for p in estate.pools
    ]
    if pools:
        conn.execute(
            "INSERT INTO capacity VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(pools)),
            [v for r in pools for v in r],
        )
    paths = {g.name: "/".join([*reversed(g.ancestors), g.name]) for g in estate.groups}
    res = [
        (
            at,
            estate.revision,
            p.name,
            p.group,
            paths.get(p.group, p.group),
            Decimal(p.reservation_milli) / 1000,
            reserved_gpu_type(estate, p),
        )
        for p in estate.policies
        if p.reservation_milli > 0 and not p.envelope
    ]
    if res:
        conn.execute(
            "INSERT INTO reservations VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(res)),
            [v for r in res for v in r],
        )
    return True
