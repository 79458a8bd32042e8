"""The plan for machines, shaped like ``terraform show -json`` of a plan: tools that already
read Terraform plans (policy checkers, PR bots) need little to read this one."""

from __future__ import annotations

import json
from typing import Any

from ..diagnostics import Position
from .whatif import whatif_json
from .model import (
    Approval,
    AttrChange,
    EnvelopeFigures,
    EnvelopeRow,
    Impact,
    ObjectChange,
    Plan,
    Revision,
)

FORMAT_VERSION = "1.0"


def _source(pos: Position | None) -> dict[str, Any] | None:
    return None if pos is None else {"file": pos.file, "line": pos.line or None}


def _revision(r: Revision) -> dict[str, Any]:
    return {
        "rev": r.label,
        "commit": r.commit,
        "estate_revision": r.estate_revision,
        "exists": r.exists,
        "valid": r.valid,
        "diagnostics": [d.to_json() for d in r.diagnostics],
    }


def _attr(a: AttrChange) -> dict[str, Any]:
    return {
        "path": a.name,
        "op": a.op,
        "before": a.before_value,
        "after": a.after_value,
        "source": _source(a.pos),
    }


def _change(c: ObjectChange) -> dict[str, Any]:
    out: dict[str, Any] = {
        "address": c.address,
        "kind": c.kind,
        "name": c.name,
        "action": c.action,
    }
    if c.old_name is not None:
        out["previous_name"] = c.old_name
    out.update(
        {
            "before": c.before,
            "after": c.after,
            "source": _source(c.pos),
            "attributes": [_attr(a) for a in c.attrs],
        }
    )
    return out


def _impact(i: Impact) -> dict[str, Any]:
    return {
        "severity": i.severity,
        "kind": i.kind,
        "message": i.message,
        "details": i.details,
        "source": _source(i.pos),
    }


def _approval(a: Approval) -> dict[str, Any]:
    return {
        "address": a.address,
        "approvers": [
            {"user": p.user, "handle": p.handle, "group": p.group, "role": p.role}
            for p in a.approvers
        ],
    }


def _figures(f: EnvelopeFigures | None) -> dict[str, Any] | None:
    if f is None:
        return None
    r = f.oversubscription
    return {
        "group": f.group,
        "reservation_milli": f.reservation_milli,
        "shared_reservation_milli": f.shared_milli,
        "team_limits_milli": f.team_limits_milli,
        "limit_milli": f.limit_milli,
        "budget": None
        if f.budget_hours_milli is None
        else {"hours_milli": f.budget_hours_milli, "period": f.budget_period},
        "oversubscription": None if r is None else round(r, 4),
        "teams": list(f.teams),
    }


def _envelope(e: EnvelopeRow) -> dict[str, Any]:
    return {"policy": e.name, "before": _figures(e.before), "after": _figures(e.after)}


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "estate_path": plan.estate_path,
        "base": _revision(plan.base),
        "head": _revision(plan.head),
        "valid": plan.valid,
        "against": None
        if plan.live is None
        else {"source": plan.live.source, "revision": plan.live.revision, "at": plan.live.at},
        "running": None
        if plan.running is None
        else {
            "source": plan.running.source,
            "revision": plan.running.revision,
            "commit": plan.running.commit,
        },
        "drift": plan.drift,
        "changes": [_change(c) for c in plan.changes],
        "impacts": [_impact(i) for i in plan.impacts],
        "approvals": [_approval(a) for a in plan.approvals],
        "approvers": [p.user for p in plan.approvers],
        "envelopes": [_envelope(e) for e in plan.envelopes],
        "whatif": None if plan.whatif is None else whatif_json(plan.whatif),
        "summary": {
            "add": plan.add,
            "change": plan.change,
            "remove": plan.remove,
            "errors": plan.error_count,
            "warnings": len(plan.impacts_of("warn")),
            "infos": len(plan.impacts_of("info")),
            "text": plan.summary_line,
        },
        "exit_code": plan.exit_code,
    }


def render_json(plan: Plan) -> str:
    return json.dumps(plan_json(plan), indent=2, ensure_ascii=False) + "\n"
