"""Building compiled estates directly, so engine tests do not depend on the compiler."""

from __future__ import annotations

from typing import Any

from compiler.compiled import (
    CAutoscale,
    CBudget,
    CComputeResource,
    CFromTask,
    CGroup,
    CLending,
    CompiledEstate,
    CPolicy,
    CPool,
    CProfile,
    CSettings,
)

from kliqued.engine import EstateIndex, PassResult, State, run_pass

HOUR = 3_600_000
MIN = 60_000
START = 1_767_571_200_000  # 2026-01-05T00:00:00Z, a Monday


def g(x: float) -> int:
    """GPUs as milli-GPUs."""
    return round(x * 1000)


def build_estate(
    pools: list[dict[str, Any]],
    profiles: list[dict[str, Any]],
    policies: list[dict[str, Any]],
    low_watermark_s: int = 900,
    lending: CLending | None = None,
) -> CompiledEstate:
    """pools: {name, capacity, execution_order?, start_timeout_s?, autoscale?}; profiles:
    {name, gpus | from_task:(default, max), weight=1, pools, policies, queueing='strict'};
    policies: {name, reservation, limit, budget?: {hours, period, low_watermark_s?,
    alert_at?}, users?, lend_weight?, protect_for_s?}; lending: settings.lending (lending.md).
    GPU amounts in GPUs, as in an estate file."""
    users_of: dict[str, list[str]] = {}
    for pr in profiles:
        for pl in pr["pools"]:
            users_of.setdefault(pl, []).append(pr["name"])
    cpools = []
    for p in pools:
        order = list(p.get("execution_order", []))
        order += [x for x in users_of.get(p["name"], []) if x not in order]
        cpools.append(
            CPool(
                name=p["name"],
                kind="baremetal",
                capacity_milli=g(p["capacity"]),
                gpu_type="h100",
                gpu_memory_gb=None,
                generation=None,
                labels={},
                execution_order=order,
                autoscale=(
                    CAutoscale(max_milli=g(p["capacity"]), idle_timeout_s=600, spot_first=True)
                    if p.get("autoscale")
                    else None
                ),
                settings={},
                start_timeout_s=p.get("start_timeout_s", 600),
            )
        )
    cprofiles = []
    for pr in profiles:
        ft = pr.get("from_task")
        cprofiles.append(
            CProfile(
                name=pr["name"],
                gpus_milli=None if ft else g(pr.get("gpus", 1)),
                from_task=CFromTask(param="gpus", default_milli=g(ft[0]), max_milli=g(ft[1]))
                if ft
                else None,
                time_weight_milli=g(pr.get("weight", 1)),
                pools=list(pr["pools"]),
                policies=list(pr["policies"]),
                queueing=pr.get("queueing", "strict"),
            )
        )
    cpolicies, cgroups = [], []
    for po in policies:
        b = po.get("budget")
        cpolicies.append(
            CPolicy(
                name=po["name"],
                group=po["name"],
                reservation_milli=g(po.get("reservation", 0)),
                limit_milli=g(po.get("limit", 1000)),
                budget=CBudget(
                    hours_milli=g(b["hours"]),
                    period=b.get("period", "day"),
                    low_watermark_s=b.get("low_watermark_s", low_watermark_s),
                    alert_at_milli=sorted(g(a) for a in b.get("alert_at", [])),
                )
                if b
                else None,
                pools_allowed=None,
                profiles=[pr["name"] for pr in profiles if po["name"] in pr["policies"]],
                lend_weight_milli=g(po.get("lend_weight", 1)),
                protect_for_s=po.get("protect_for_s"),
            )
        )
        cgroups.append(
            CGroup(
                name=po["name"],
                parent=None,
                ancestors=[],
                users=po.get("users", ["u"]),
                admins=[],
                projects=[],
                policy=po["name"],
            )
        )
    crs = [
        CComputeResource(name=f"{pol}/{pr['name']}", policy=pol, profile=pr["name"], group=pol)
        for pr in profiles
        for pol in pr["policies"]
    ]
    return CompiledEstate(
        settings=CSettings(
            pass_interval_s=1,
            low_watermark_s=low_watermark_s,
            currency="EUR",
            lending=lending or CLending(),
        ),
        pools=sorted(cpools, key=lambda x: x.name),
        profiles=sorted(cprofiles, key=lambda x: x.name),
        policies=sorted(cpolicies, key=lambda x: x.name),
        groups=sorted(cgroups, key=lambda x: x.name),
        pricing=[],
        compute_resources=sorted(crs, key=lambda x: x.name),
    ).with_revision()


class Engine:
    """A tiny driver for tests: an estate, a state and a clock in minutes from START."""

    def __init__(self, estate: CompiledEstate, at: int = START) -> None:
        self.index = EstateIndex.build(estate)
        self.state = State(self.index, at)
        self.now = at
        self.last: PassResult | None = None

    def submit(self, tid: str, resource: str, gpus: float | None = None, user: str = "u") -> None:
        self.state.submit(tid, resource, user, None, None if gpus is None else g(gpus), at=self.now)

    def end(self, tid: str) -> None:
        self.state.end(tid, self.now)

    def set_estate(self, estate: CompiledEstate) -> None:
        self.index = EstateIndex.build(estate)

    def run(self, at: int | None = None):
        if at is not None:
            self.now = at
        self.last = run_pass(self.index, self.state, self.now)
        return self.last

    def advance(self, until: int):
        """Runs the passes the engine asks for up to ``until``, then one at ``until``."""
        res = self.last or self.run()
        out = []
        while res.next_pass_at is not None and res.next_pass_at < until:
            res = self.run(res.next_pass_at)
            out.append(res)
        out.append(self.run(until))
        return out

    def where(self, tid: str) -> str | None:
        t = self.state.tasks[tid]
        return t.pool if t.pool else t.state
