"""Stage 3 of compiling: validated models to the canonical compiled estate."""

from __future__ import annotations

from . import compiled as c
from .hierarchy import organisation
from .models import Alerts, Group, Identity, Policy, Pool, Price, Profile, Settings
from .resolve import execution_order, pool_capacity, resolve_pools
from .source import SourceMap
from .units import money_str


def build(sources: SourceMap) -> c.CompiledEstate:
    settings: Settings = sources.settings.model if sources.settings else Settings()
    pools: list[Pool] = [o.model for o in sources.of("pool").values()]
    profiles: list[Profile] = [o.model for o in sources.of("profile").values()]
    policies: list[Policy] = [o.model for o in sources.of("policy").values()]
    groups: list[Group] = [o.model for o in sources.of("group").values()]
    prices: list[Price] = [o.model for o in sources.of("price").values()]

    resolved = {p.name: resolve_pools(p, pools) for p in profiles}
    users_of_pool: dict[str, list[str]] = {q.name: [] for q in pools}
    for prof in profiles:  # declaration order
        for q in resolved[prof.name]:
            users_of_pool[q].append(prof.name)

    cpools = [
        c.CPool(
            name=q.name,
            kind=q.kind,
            capacity_milli=pool_capacity(q),
            gpu_type=q.gpu_type,
            gpu_memory_gb=q.gpu_memory_gb,
            generation=q.generation,
            labels=dict(q.labels),
            execution_order=execution_order(q, users_of_pool[q.name]),
            autoscale=(
                c.CAutoscale(
                    max_milli=q.autoscale.max,
                    idle_timeout_s=q.autoscale.idle_timeout,
                    spot_first=q.autoscale.spot_first,
                    spend_cap=(
                        money_str(q.autoscale.spend_cap)
                        if q.autoscale.spend_cap is not None
                        else None
                    ),
                    node_prices=tuple(
                        c.CNodePrice(
                            instance_type=n.instance_type,
                            on_demand=money_str(n.on_demand),
                            spot=money_str(n.spot) if n.spot is not None else None,
                        )
                        for n in q.autoscale.node_prices
                    ),
                )
                if q.autoscale
                else None
            ),
            start_timeout_s=(
                q.start_timeout if q.start_timeout is not None else settings.start_timeout
            ),
            settings=dict(q.settings),
            nodes=[c.CNodes(count=n.count, gpus_milli=n.gpus) for n in q.node_groups()],
        )
        for q in pools
    ]
    cprofiles = []
    for p in profiles:
        fixed = p.gpus if isinstance(p.gpus, int) else None
        ft = (
            None
            if isinstance(p.gpus, int)
            else c.CFromTask(
                param=p.gpus.from_task, default_milli=p.gpus.default, max_milli=p.gpus.max
            )
        )
        cprofiles.append(
            c.CProfile(
                name=p.name,
                gpus_milli=fixed,
                from_task=ft,
                time_weight_milli=p.time_weight,
                pools=resolved[p.name],
                policies=list(dict.fromkeys(p.policies)),
                queueing=p.queueing,
                nodes=p.nodes,
                idle=None
                if p.idle is None
                else c.CIdle(
                    wall_s=p.idle.wall, cpu_s=p.idle.cpu, gpu_s=p.idle.gpu, network_s=p.idle.network
                ),
            )
        )
    connected: dict[str, list[str]] = {pol.name: [] for pol in policies}
    for p in profiles:
        for pol in dict.fromkeys(p.policies):
            connected[pol].append(p.name)
    org = organisation(policies, groups)
    cpolicies = [
        c.CPolicy(
            name=pol.name,
            group=pol.group,
            reservation_milli=pol.reservation,
            limit_milli=pol.limit,
            budget=(
                c.CBudget(
                    hours_milli=pol.budget.hours,
                    period=pol.budget.period,
                    low_watermark_s=(
                        pol.budget.low_watermark
                        if pol.budget.low_watermark is not None
                        else settings.low_watermark
                    ),
                    alert_at_milli=sorted(set(pol.budget.alert_at)),
                )
                if pol.budget
                else None
            ),
            pools_allowed=(
                c.CPoolsAllowed(
                    labels=dict(pol.pools_allowed.labels),
                    pools=(
                        sorted(pol.pools_allowed.pools)
                        if pol.pools_allowed.pools is not None
                        else None
                    ),
                )
                if pol.pools_allowed
                else None
            ),
            profiles=connected[pol.name],
            user_limit_milli=pol.user_limit,
            envelope=org.is_envelope(pol.name),
            levels=org.levels[pol.name],
            below=org.nearest.get(pol.name, []),
            shared_reservation_milli=org.shared.get(pol.name, 0),
            lend_weight_milli=pol.lend_weight if pol.lend_weight is not None else 1000,
            protect_for_s=pol.protect_for,
        )
        for pol in policies
    ]
    by_name = {g.name: g for g in groups}
    policy_of = {pol.group: pol.name for pol in policies}
    cgroups = []
    for g in groups:
        ancestors: list[str] = []
        cur = g.parent
        while cur is not None and cur not in ancestors and cur in by_name:
            ancestors.append(cur)
            cur = by_name[cur].parent
        cgroups.append(
            c.CGroup(
                name=g.name,
                parent=g.parent,
                ancestors=ancestors,
                users=sorted(set(g.users)),
                admins=sorted(set(g.admins)),
                projects=sorted(set(g.projects)),
                policy=policy_of.get(g.name),
                project_priority=g.project_priority,
                project_order=list(dict.fromkeys(g.projects)) if g.project_priority else [],
            )
        )
    cprices = [
        c.CPrice(
            gpu_type=p.gpu_type,
            per_gpu_hour=money_str(p.per_gpu_hour),
            effective_from=p.effective_from,
            list_per_gpu_hour=None
            if p.list_per_gpu_hour is None
            else money_str(p.list_per_gpu_hour),
        )
        for p in prices
    ]
    group_of = {pol.name: pol.group for pol in policies}
    resources = [
        c.CComputeResource(name=f"{pol}/{p.name}", policy=pol, profile=p.name, group=group_of[pol])
        for p in profiles
        for pol in dict.fromkeys(p.policies)
    ]
    estate = c.CompiledEstate(
        settings=c.CSettings(
            pass_interval_s=settings.pass_interval,
            low_watermark_s=settings.low_watermark,
            start_timeout_s=settings.start_timeout,
            currency=settings.currency,
            alerts=_alerts(settings.alerts),
            attribution=None
            if settings.attribution is None
            else c.CAttribution(**settings.attribution.model_dump()),
            lending=_lending(settings),
            identity=_identity(settings.identity),
        ),
        pools=sorted(cpools, key=lambda x: x.name),
        profiles=sorted(cprofiles, key=lambda x: x.name),
        policies=sorted(cpolicies, key=lambda x: x.name),
        groups=sorted(cgroups, key=lambda x: x.name),
        pricing=sorted(cprices, key=lambda x: (x.gpu_type, x.effective_from)),
        compute_resources=sorted(resources, key=lambda x: x.name),
    )
    return estate.with_revision()


def _identity(identity: Identity | None) -> c.CIdentity | None:
    """The sign-in settings, compiled: the users maps turned to claim value -> user (the
    look-up a sign-in makes), lists sorted by name."""
    if identity is None:
        return None
    providers = [
        c.CPeopleProvider(
            name=p.name,
            issuer=p.issuer,
            audience=p.audience,
            client_id=p.client_id or p.audience,
            user_claim=p.user_claim,
            users={value: user for user, value in p.users.items()},
            algorithms=list(p.algorithms),
            leeway_s=p.leeway,
            scopes=list(p.scopes),
        )
        for p in sorted(identity.providers, key=lambda x: x.name)
    ]
    workloads = [
        c.CWorkload(
            name=w.name,
            issuer=w.issuer,
            audience=w.audience,
            claims=dict(w.claims),
            role=w.role,
            algorithms=list(w.algorithms),
            leeway_s=w.leeway,
        )
        for w in sorted(identity.workloads, key=lambda x: x.name)
    ]
    r = identity.roles
    return c.CIdentity(
        providers=providers,
        workloads=workloads,
        roles={
            "admin": sorted(set(r.admin)),
            "finance": sorted(set(r.finance)),
            "planner": sorted(set(r.planner)),
        },
        token_lifetime_s=identity.token_lifetime,
    )


def _lending(settings: Settings) -> c.CLending:
    lending = settings.lending
    if lending is None:
        return c.CLending()
    return c.CLending(
        order=lending.order, protect_for_s=lending.protect_for, victims=lending.victims
    )


def _alerts(alerts: Alerts | None) -> c.CAlerts | None:
    """The alert settings, compiled: channels sorted by name, durations in seconds."""
    if alerts is None:
        return None
    chans = [
        c.CAlertChannel(
            name=ch.name,
            kind=ch.kind,
            url=ch.url,
            secret_env=ch.secret_env,
            secret_file=ch.secret_file,
            smtp_host=ch.smtp_host,
            smtp_port=ch.smtp_port,
            sender=ch.sender,
            to=list(ch.to),
            timeout_s=ch.timeout,
        )
        for ch in sorted(alerts.channels, key=lambda x: x.name)
    ]
    return c.CAlerts(
        channels=chans,
        contacts=dict(alerts.contacts),
        it=list(alerts.it),
        waiting_after_s=alerts.waiting_after,
    )
