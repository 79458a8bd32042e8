"""Autoscalers' heartbeats and their loss, prepared for the sequencer (issue 25, item 8;
docs/decisions.md N7); their liveness record and timeout are the state room's
(``state/autoscalers.py``), where the live state reads them without importing these.
"""

from __future__ import annotations

from typing import Any

from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import bad_request
from kliqued.daemon.fleet.cloud import _cloud_pool
from kliqued.daemon.state.autoscalers import MAX_INTERVAL_S, AutoscalerInfo, timeout_s
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay, Prepared


def overdue(d: Daemon, mono: float) -> list[str]:
    """The pools whose autoscaler has been silent past its timeout and is not yet lost."""
    ttl = d.worker_settings.ttl_s
    return [
        a.pool
        for a in d.autoscalers.values()
        if not a.lost and mono - a.last_seen > timeout_s(ttl, a.interval_s)
    ]


def _interval(body: dict[str, Any]) -> float:
    v = body.get("interval_s", 0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_INTERVAL_S:
        raise bad_request(
            f"/interval_s: the autoscaler's round interval in seconds, from 0 "
            f"to {MAX_INTERVAL_S:.0f}; found {v!r}",
            {"field": "interval_s"},
        )
    return float(v)


def prepare_heartbeat(
    d: Daemon, p: Principal, pool_name: str, body: dict[str, Any], now: int, ov: Overlay
) -> Prepared:
    """The autoscaler of ``pool_name`` runs: renews its timeout; one that was not live makes
    the pool take work again (a pass follows)."""
    pool = _cloud_pool(d, pool_name)
    interval = _interval(body)
    was_live = d.autoscaler_live(pool.name)

    def apply() -> dict[str, Any]:
        a = d.autoscalers.get(pool.name)
        if a is None:
            a = d.autoscalers[pool.name] = AutoscalerInfo(pool.name, d.mono())
        a.last_seen, a.interval_s, a.lost = d.mono(), interval, False
        d._sync_pool(pool.name, now)
        return {
            "pool": pool.name,
            "live": True,
            "timeout_s": timeout_s(d.worker_settings.ttl_s, interval),
        }

    return Prepared(apply=apply, wants_pass=not was_live)


def prepare_lost(d: Daemon, pool: str, now: int, ov: Overlay) -> Prepared:
    """The autoscaler of ``pool`` is lost: the engine decides the rest at the next pass."""

    def apply() -> None:
        a = d.autoscalers.get(pool)
        if a is None or a.lost:
            return
        a.lost = True
        d._sync_pool(pool, now)

    return Prepared(apply=apply, wants_pass=True)


def restart_grace(d: Daemon, at: int) -> list[str]:
    """After a restart: every autoscaled pool holding placed work gets one timeout for its
    autoscaler to heartbeat before that work goes back to its queues; the others wait for
    their autoscaler's first heartbeat. Returns the pools given the grace."""
    st = d.st()
    given = []
    for p in d.idx().estate.pools:
        if p.autoscale is None or p.name in d.autoscalers:
            continue
        if any(st.placed_by_pool_group.get(p.name, {}).values()):
            d.autoscalers[p.name] = AutoscalerInfo(p.name, d.mono())
            d._sync_pool(p.name, at)
            given.append(p.name)
    return given
