"""Driving cloud nodes: what the autoscaler reports (a node started, a node released, why
placed work waits) prepared for the sequencer, and a pool's ``cloud`` in ``GET /v1/pools``.

The book these change, its prices and the month's spend are the state room's
(``state/cloud.py``); these functions take the ``Daemon`` and the dispatch table, which the
book must not import (issue 27).
"""

from __future__ import annotations

from typing import Any

from compiler.compiled import CPool
from klique_util.excerpt import excerpt

from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError, bad_request
from kliqued.daemon.events import Event
from kliqued.daemon.state import reducers
from kliqued.daemon.state.cloud import CloudBook, _money, cap_micro, month_label, price_of
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared
from kliqued.daemon.units import iso


def view(d: Daemon, pool: CPool, now: int) -> dict[str, Any] | None:
    """``cloud`` of an autoscaled pool in ``GET /v1/pools``; None for other pools."""
    if pool.autoscale is None:
        return None
    book: CloudBook = d.cloud
    spent, cap = book.spent_micro(pool.name, now), cap_micro(pool)
    s = book.scaling.get(pool.name)
    return {
        "month": month_label(now),
        "currency": d.idx().estate.settings.currency,
        "spent": _money(spent),
        "spend_cap": pool.autoscale.spend_cap,
        "capped": cap is not None and spent >= cap,
        "nodes": [n.view() for n in book.open_nodes(pool.name)],
        "scaling": (
            None
            if s is None
            else {"cause": s.cause, "reason": s.reason, "waiting": s.waiting, "since": iso(s.at_ms)}
        ),
    }


def _cloud_pool(d: Daemon, name: str) -> CPool:
    pool = d.idx().estate.pool(name)
    if pool is None:
        raise ApiError(404, "not-found", f"no pool {excerpt(name)} in the running estate")
    if pool.kind != "cloud" or pool.autoscale is None:
        raise ApiError(
            422,
            "not-autoscaled",
            f"pool {name} is not an autoscaled cloud pool "
            "(kind: cloud with autoscale): it has no nodes "
            "to record",
        )
    return pool


# changes -----------------------------------------------------------------------------------
def prepare_started(
    d: Daemon, p: Principal, pool_name: str, body: dict[str, Any], now: int, ov: Overlay
) -> Prepared:
    """A node the autoscaler started: an interval opened at its price. The same node again
    (a retry) answers the node as it is."""
    from kliqued.ledger import ops as ledger_ops

    pool = _cloud_pool(d, pool_name)
    node = body["node"]
    known = d.cloud.nodes.get(node)
    if known is not None:
        if known.pool != pool.name or known.end_ms is not None:
            where = (
                f"ended at {iso(known.end_ms)}"
                if known.end_ms is not None
                else f"running in pool {known.pool}"
            )
            raise ApiError(
                409,
                "conflict",
                f"node {node} was recorded already ({where}): a node id is used once",
            )
        return Prepared(apply=lambda: (known.view(), False))
    estate = d.idx().estate
    data = {
        "node": node,
        "pool": pool.name,
        "provider": body["provider"],
        "instance_type": body["instance_type"],
        "lifecycle": body["lifecycle"],
        "gpus": body["gpus"],
        "currency": estate.settings.currency,
        "per_hour": price_of(
            estate, pool, body["instance_type"], body["lifecycle"], body["gpus"], now
        ),
    }
    ev = Event("cloud_node_started", None, p.text, estate.revision, None, None, data)
    op = ledger_ops.OpenCloudNode(data, now, estate.revision)

    def apply() -> tuple[dict[str, Any], bool]:
        return reducers.apply(d, ev, now).view(), True

    return Prepared([ev], [op], apply)


def prepare_ended(
    d: Daemon, p: Principal, pool_name: str, node: str, reason: str, now: int, ov: Overlay
) -> Prepared:
    from kliqued.ledger import ops as ledger_ops

    n = d.cloud.nodes.get(node)
    if n is None or n.pool != pool_name:
        raise ApiError(
            404, "not-found", f"no node {excerpt(node, quoted=False)} recorded in pool {pool_name}"
        )
    if n.end_ms is not None:
        return Prepared(apply=lambda: n.view())
    ev = Event(
        "cloud_node_ended",
        None,
        p.text,
        d.estate.revision,
        None,
        None,
        {"node": node, "pool": pool_name, "reason": reason},
    )
    op = ledger_ops.CloseCloudNode(node, now, reason)

    def apply() -> dict[str, Any]:
        return reducers.apply(d, ev, now).view()

    return Prepared([ev], [op], apply)


def prepare_scaling(
    d: Daemon, p: Principal, pool_name: str, body: dict[str, Any], now: int, ov: Overlay
) -> Prepared:
    """The autoscaler's word on waiting work: logged (``scaling_waits``) when the cause or
    the reason changes; the month's first spend-cap wait raises ``spend_cap_reached``."""
    pool = _cloud_pool(d, pool_name)
    cause = body.get("cause")
    reason = body.get("reason") if cause is not None else None
    if cause is not None and not reason:
        raise bad_request(
            "/reason: a scaling report with a cause says why: give 'reason'", {"field": "reason"}
        )
    waiting = int(body.get("waiting") or 0)
    data = {"pool": pool.name, "cause": cause, "reason": reason, "waiting": waiting}
    before = d.cloud.scaling.get(pool.name)
    events = []
    if ((before.cause, before.reason) if before else (None, None)) != (cause, reason):
        events.append(Event("scaling_waits", None, p.text, d.estate.revision, None, None, data))
    month = month_label(now)
    spent, cap = d.cloud.spent_micro(pool.name, now), cap_micro(pool)
    if (
        cause == "spend_cap"
        and cap is not None
        and spent >= cap
        and (pool.name, month) not in d.cloud.capped_alerts
    ):
        events.append(
            Event(
                "spend_cap_reached",
                None,
                p.text,
                d.estate.revision,
                None,
                None,
                {
                    "pool": pool.name,
                    "month": month,
                    "spent": _money(spent),
                    "spend_cap": _money(cap),
                    "currency": d.idx().estate.settings.currency,
                    "waiting": waiting,
                    "reason": reason,
                },
            )
        )

    def apply() -> dict[str, Any] | None:
        for ev in events:
            reducers.apply(d, ev, now)
        s = d.cloud.scaling.get(pool.name)
        if s is not None:  # the same wait: only its count changes, unlogged
            s.waiting = waiting
        return view(d, pool, now)

    return Prepared(events, [], apply)
