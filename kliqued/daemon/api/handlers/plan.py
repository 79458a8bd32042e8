"""``GET /v1/plan/state``: the live counts ``kliqued plan --against`` needs to say what a
change does to running work (how many tasks it preempts, cancels or leaves over a limit).

Read-only and counts only (no task, user or command), so CI can hold a ``role:planner``
token that reads this and nothing else.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from klique_util.units import milli_to_gpus, unit_hours_micro

from kliqued.daemon.fleet import capacity
from kliqued.daemon.api.request import ctx, reply
from kliqued.daemon.api.routes import Route
from kliqued.daemon.units import iso

PERIODS = ("day", "week", "month")

USAGE_SQL = """
SELECT gpu_type, strftime(month, '%Y-%m') AS month, sum(gpu_hours) AS gpu_hours
FROM usage_monthly GROUP BY ALL ORDER BY gpu_type, month"""
"""GPU-hours per GPU type and UTC month: what a price change reprices."""


def _hours(units: int) -> float:
    return unit_hours_micro(units)


def live_state(d: Any, now: int) -> dict[str, Any]:
    """The running revision and its live counts: per compute resource, per policy, per
    pool. Budget hours used are given for every period, so a plan that changes a
    budget's period can compare too."""
    idx, st = d.idx(), d.st()
    crs: dict[str, dict[str, Any]] = {}
    for name in sorted(idx.resources):
        q = st.queues.get(name)
        crs[name] = {
            "queued": q.live if q is not None else 0,
            "placed": 0,
            "placed_gpus": 0,
            "weighted_placed": 0,
        }
    pools: dict[str, dict[str, Any]] = {
        p.name: {"placed": 0, "used_gpus": milli_to_gpus(st.pool_used.get(p.name, 0))}
        for p in idx.estate.pools
    }
    for t in st.placed_tasks():
        c = crs.setdefault(
            t.resource, {"queued": 0, "placed": 0, "placed_gpus": 0, "weighted_placed": 0}
        )
        c["placed"] += 1
        c["placed_gpus"] += t.size
        c["weighted_placed"] += t.weight > 0
        if t.pool in pools:
            pools[t.pool]["placed"] += 1
    for c in crs.values():
        c["placed_gpus"] = milli_to_gpus(c["placed_gpus"])
    policies: dict[str, dict[str, Any]] = {}
    for name, g in sorted(idx.group_of_policy.items()):
        m = st.meters.get(g)
        placed = st.placed_of(g)
        policies[name] = {
            "group": g,
            "used_gpus": milli_to_gpus(st.used.get(g, 0)),
            "placed": len(placed),
            "weighted_placed": sum(t.weight > 0 for t in placed),
            "budget_used_hours": {
                p: _hours(m.used(p, now, st.enabled)) if m else 0.0 for p in PERIODS
            },
        }
    return {
        "revision": d.estate.revision,
        "commit": d.estate.commit,
        "at": iso(now),
        "compute_resources": crs,
        "policies": policies,
        "pools": pools,
    }


async def plan_state(request: web.Request) -> web.Response:
    c = ctx(request)
    d = c.daemon
    out = live_state(d, d.clock.now())
    # issue 15: the plan notes pools whose workers disagree with what they declare
    out["capacity_mismatches"] = {
        p.name: t for p in d.idx().estate.pools if (t := capacity.pool_truth(d, p)["mismatches"])
    }
    rows = await c.store.read(lambda cur: cur.execute(USAGE_SQL).fetchall())
    out["usage"] = [
        {"gpu_type": g, "month": m, "gpu_hours": round(float(h or 0), 6)} for g, m, h in rows
    ]
    return reply(out)


ROUTES = [
    Route(
        "GET",
        "/v1/plan/state",
        plan_state,
        "getPlanState",
        ("admin", "planner"),
        hint="CI's `kliqued plan --against` holds a role:planner token",
    ),
]
