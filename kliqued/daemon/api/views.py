"""The API's JSON shapes (api-contract.md), computed from the daemon's live state.

Views read, never change, the state; they run on the event loop between sequencer cycles, so
they see one consistent State.
"""

from __future__ import annotations

from typing import Any, Callable

from klique_util.units import from_milli, unit_hours_micro
from kliqued.engine import budget_status
from kliqued.engine.dryrun import Forecast, forecast
from kliqued.engine.protection import protected_until
from kliqued.engine.victims import lost_work

from kliqued.daemon.api import treeviews
from kliqued.daemon.fleet import capacity
from kliqued.daemon.fleet import cloud
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.records import TaskRecord, end_text, state  # the API shows them
from kliqued.daemon.units import gpus, iso


def reason_json(r: Any) -> dict[str, str] | None:
    return None if r is None else {"kind": r.kind, "text": r.text}


def forecast_json(f: Forecast | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"start_at": iso(f.start_at), "basis": f.basis, "text": f.text}


def task_forecast(d: Daemon, rec: TaskRecord, many: bool = False) -> dict[str, Any] | None:
    """A queued task's forecast (issue 31), from the state the last pass left, as its
    reason is; none in a long listing (``many``: a protection's end is a walk over the
    placed tasks) nor before a pass has seen the task."""
    if many or rec.state != "queued" or rec.submitted_pass >= d.passes:
        return None
    st = d.st()
    return forecast_json(forecast(d.idx(), st, rec.id, st.clock))


def gpu_hours(rec: TaskRecord, now: int) -> float:
    """GPU-hours of its placements, the current one up to ``now`` included (as the ledger's
    ``usage`` view counts it), to 6 decimals (a few milliseconds of one GPU, so a short task
    does not read 0). Once it ends the figure is fixed: it reads the same after a restart."""
    ms = rec.gpu_ms
    if rec.state == "placed" and rec.placed_at is not None and rec.size:
        ms += rec.size * max(0, now - rec.placed_at)
    return unit_hours_micro(ms)


def end(rec: TaskRecord) -> dict[str, Any] | None:
    if rec.state != "ended":
        return None
    return {"text": end_text(rec), "by": rec.ended_by, "message": rec.end_message}


def task(d: Daemon, rec: TaskRecord, many: bool = False) -> dict[str, Any]:
    t = d.state.tasks.get(rec.id) if d.state is not None else None
    size = t.size if t is not None else rec.size
    lp = rec.last_preemption
    return {
        "id": rec.id,
        "resource": rec.resource,
        "policy": rec.policy,
        "profile": rec.profile,
        "group": rec.group,
        "user": rec.user,
        "actor": rec.actor,
        "channel": rec.channel,
        "project": rec.project,
        "labels": rec.labels,
        "command": rec.command,
        "payload": rec.payload,
        "gpus": gpus(size if size is not None else rec.gpus_milli),
        "state": state(rec),
        "end_reason": rec.end_reason,
        "pool": rec.pool,
        "submitted_at": iso(rec.submitted_at),
        "placed_at": iso(rec.placed_at),
        "ended_at": iso(rec.ended_at),
        "position": d.position(rec),
        "waiting_reason": reason_json(d.reason(rec, many)),
        "preemptions": rec.preemptions,
        "last_preemption": None if lp is None else {"kind": lp[0], "text": lp[1], "at": iso(lp[2])},
        "revision": rec.revision,
        "worker": rec.worker,
        "epoch": rec.epoch,
        "started_at": iso(rec.started_at),
        "exit_code": rec.exit_code,
        "signal": rec.signal,
        "gpu_hours": gpu_hours(rec, d.clock.now()),
        "end": end(rec),
        "outputs": rec.outputs,
        **lending(d, rec, t),
        "forecast": task_forecast(d, rec, many),
    }


def lending(d: Daemon, rec: TaskRecord, t: Any) -> dict[str, Any]:
    """lending.md "What the product shows": when a placed task's protection ends (None:
    not protected by its policy or settings), the work a preemption now would lose, and
    the GPU-hours its preemptions have lost so far (its ledger's ``preemptions`` rows)."""
    placed = rec.state == "placed" and t is not None and t.placed_at is not None
    until = protected_until(d.idx(), t) if placed else None
    lost_now = lost_work(t, d.clock.now()) if placed else 0
    return {
        "protected_until": iso(until),
        "lost_work_s": round(lost_now / 1000, 3) if placed else None,
        "lost_gpu_hours_so_far": unit_hours_micro(rec.lost_units),
    }


def room(d: Daemon, group: str, now: int) -> dict[str, Any]:
    """A group's room: GPUs used against its reservation and limit, and its budget left in
    the current period (what ``kliqued resources`` shows next to each compute resource)."""
    idx, st = d.idx(), d.st()
    gi = idx.groups[group]
    used = st.used.get(group, 0)
    # Free under every level's limit (organisation.md): a department at its limit leaves its
    # teams no room, whatever their own limits say.
    free = min(idx.groups[x].limit - st.used.get(x, 0) for x in gi.levels)
    out: dict[str, Any] = {
        "group": group,
        "used": gpus(used),
        "reservation": gpus(gi.reservation),
        "limit": gpus(gi.limit),
        "free": gpus(max(0, free)),
        "budget": None,
    }
    b = budget_status(idx, st, gi.policy, now) if gi.policy is not None else None
    if b is not None and gi.budget is not None:
        out["budget"] = {
            "hours": from_milli(gi.budget.hours_milli),
            "period": b.period,
            "used_hours": b.used_hours,
            "left_hours": b.left_hours,
            "resets_at": iso(b.resets_at),
        }
    return out


def resource(
    d: Daemon, name: str, p: Principal | None = None, rooms: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A compute resource; ``may_submit`` is whether ``p`` (a user) may send work to it,
    ``room`` its group's room (``rooms`` caches it per group within one answer)."""
    idx = d.idx()
    cr = idx.resources[name]
    q = d.st().queues.get(name)
    rooms = {} if rooms is None else rooms
    if cr.group not in rooms:
        rooms[cr.group] = room(d, cr.group, d.clock.now())
    may = p is not None and p.is_user and p.name in idx.users.get(cr.group, ())
    return {
        "name": name,
        "policy": cr.policy,
        "profile": cr.profile,
        "group": cr.group,
        "gpus": gpus(cr.fixed_size),
        "from_task": None
        if cr.fixed_size is not None
        else {"default": gpus(cr.default_size), "max": gpus(cr.max_size)},
        "time_weight": gpus(cr.weight),
        "pools": list(cr.pools),
        "queued": q.live if q is not None else 0,
        "placed": d.placed_count.get(name, 0),
        "may_submit": may,
        "room": rooms[cr.group],
    }


def waiting(d: Daemon) -> treeviews.Waiting:
    """Who is waiting, counted once per team for one answer (``policy``'s ``waiting``)."""
    return treeviews.Waiting(d, lambda rec: reason_json(d.reason(rec)))


def policy(
    d: Daemon,
    name: str,
    now: int,
    waits: treeviews.Waiting | None = None,
    alerts_for: Principal | None = None,
) -> dict[str, Any]:
    """A policy: its use, its budget in the current period, its place in the organisation
    tree and who is waiting in its subtree. An envelope's ``used`` and budget count its
    whole subtree (the engine's counters), so burn rate and run-out hold at every level.
    The budget's ``alerts`` are there only when ``alerts_for`` may act on them
    (``Access.fixes_budget``; None: everyone)."""
    idx, st = d.idx(), d.st()
    g = idx.group_of_policy[name]
    gi = idx.groups[g]
    used = st.used.get(g, 0)
    out: dict[str, Any] = {
        "name": name,
        "group": g,
        "reservation": gpus(gi.reservation),
        "limit": gpus(gi.limit),
        "used": gpus(used),
        "borrowed": gpus(max(0, used - gi.reservation)),
        "budget": None,
        **treeviews.place(d, name),
        "waiting": (waits or waiting(d)).of(name),
        **treeviews.fair_share(d, g),
    }
    b = budget_status(idx, st, name, now)
    if b is not None and gi.budget is not None:
        alerts = [
            {"threshold": from_milli(a["threshold_milli"]), "at": iso(a["at"]), "text": a["text"]}
            for a in d.alerts.get(name, [])
            if a["period_start"] == b.period_start
        ]
        out["budget"] = {
            "hours": from_milli(gi.budget.hours_milli),
            "period": b.period,
            "period_start": iso(b.period_start),
            "resets_at": iso(b.resets_at),
            "used_hours": b.used_hours,
            "left_hours": b.left_hours,
            "burn_rate": b.burn_rate,
            "runout_at": iso(b.runout_at),
        }
        if alerts_for is None or d.acc().fixes_budget(alerts_for, g):
            out["budget"]["alerts"] = alerts
    return out


def pools(
    d: Daemon,
    only: str | None = None,
    sees: Callable[[str], bool] = lambda g: False,
    truth: bool = True,
) -> list[dict[str, Any]]:
    """Every pool (``only``: one), with ``by_level``: the GPUs each group of the tree that
    ``sees`` admits uses there, rolled up the tree; with ``capacity_truth`` when ``truth``
    (its warnings are for those who can fix a pool or a machine: ``Access.fixes_pools``)."""
    st = d.st()
    borrowed = st.borrowed_by_pool()
    now = d.clock.now()
    out = []
    for p in d.idx().estate.pools:
        if only is not None and p.name != only:
            continue
        used = st.pool_used.get(p.name, 0)
        live = d.live_workers(p.name)
        row: dict[str, Any] = {
            "name": p.name,
            "kind": p.kind,
            "gpu_type": p.gpu_type,
            "capacity": gpus(p.capacity_milli),
            "used": gpus(used),
            "borrowed": gpus(borrowed.get(p.name, 0)),
            "free": gpus(max(0, p.capacity_milli - used)),
            "labels": p.labels,
            # liveness (issue 10): who can start the work placed here
            "workers": {"live": len(live), "gpus": sum(len(w.gpus) for w in live)},
            "takes_work": p.name not in st.unavailable,
            "autoscaled": p.autoscale is not None,
            "start_timeout_s": p.start_timeout_s,
            "by_level": treeviews.by_level(d, p.name, sees),
        }
        out.append(row)
        if truth:  # issue 15: declared against what the live workers report
            row["capacity_truth"] = capacity.pool_truth(d, p)
        if p.autoscale is not None:  # its nodes, spend and scaling (cloud.py)
            out[-1]["cloud"] = cloud.view(d, p, now)
            # issue 25: with no live worker it takes work only while its autoscaler runs
            out[-1]["autoscaler"] = {"live": p.name not in st.no_autoscaler}
    return out


def engine(d: Daemon, pass_interval_s: float) -> dict[str, Any]:
    return {
        "enabled": d.st().enabled,
        "last_pass_at": iso(d.last_pass_at),
        "pass_interval_s": pass_interval_s,
        "revision": d.estate.revision,
    }


def refused(r: dict[str, Any] | None) -> dict[str, Any] | None:
    """The last refused revision (GitOps reload, issue 5): ``at`` is kept in ms."""
    if r is None:
        return None
    return {
        "revision": r.get("revision"),
        "commit": r.get("commit"),
        "at": iso(r["at"]),
        "source": r.get("source"),
        "errors": [str(e) for e in r.get("errors", [])],
    }


def estate(d: Daemon) -> dict[str, Any]:
    e = d.idx().estate
    return {
        "revision": d.estate.revision,
        "applied_at": iso(d.estate.applied_at),
        "source": d.estate.source,
        "commit": d.estate.commit,
        "pools": len(e.pools),
        "profiles": len(e.profiles),
        "policies": len(e.policies),
        "compute_resources": len(e.compute_resources),
        "refused": refused(d.estate.refused),
    }


def whoami(d: Daemon, p: Principal) -> dict[str, Any]:
    acc = d.acc()
    groups = sorted(acc.groups_of(p.name)) if p.is_user else []
    admin_of = sorted(acc.admin_of(p.name)) if p.is_user else []
    return {
        "principal": p.text,
        "kind": p.kind,
        "name": p.name,
        "groups": groups,
        "admin_of": admin_of,
        "roles": [p.name] if p.kind == "role" else [],
        "token_id": p.token_id,
    }


def token(rec: Any) -> dict[str, Any]:
    return {
        "id": rec.id,
        "principal": rec.principal,
        "name": rec.name,
        "created_at": iso(rec.created_at),
        "created_by": rec.created_by,
        "revoked_at": iso(rec.revoked_at),
        "expires_at": iso(rec.expires_at),
    }


def event(row: dict[str, Any]) -> dict[str, Any]:
    data = row["data"]
    if row["kind"] == "estate_applied" and isinstance(data, dict):
        data = {"source": data.get("source")}  # the compiled estate itself is large
    elif row["kind"] == "worker_registered" and isinstance(data, dict) and "key_hash" in data:
        data = {k: v for k, v in data.items() if k != "key_hash"}  # a secret's hash
    return {
        "seq": row["seq"],
        "at": iso(row["at_ms"]),
        "kind": row["kind"],
        "task": row["task"],
        "actor": row["actor"],
        "revision": row["revision"],
        "data": data,
    }


def worker_state(d: Daemon, w: Any) -> str:
    """``lost`` (declared lost), ``alive`` (heard from within the TTL) or ``silent``."""
    if w.lost:
        return "lost"
    return "alive" if d.mono() - w.last_seen <= d.worker_settings.ttl_s else "silent"


def worker(d: Daemon, w: Any) -> dict[str, Any]:
    return {
        "id": w.id,
        "pool": w.pool,
        "hostname": w.hostname,
        "executor": w.executor,
        "gpus": len(w.gpus),
        "version": w.version,
        "registered_at": iso(w.registered_at),
        "state": worker_state(d, w),
        "lost_at": iso(w.lost_at),
        "cannot_work": w.cannot_work,
        "apps": w.apps,
        "leases": [
            {"task": lease.task, "epoch": lease.epoch, "status": lease.status}
            for lease in sorted(w.leases.values(), key=lambda x: x.key)
        ],
    }
