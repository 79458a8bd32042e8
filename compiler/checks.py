"""Stage 2 of compiling: the rules of estate.md that span objects.

Each check reads the validated models and reports with the position of the field at fault,
the object's name and a hint. Checks never stop at the first finding.
"""

from __future__ import annotations

import difflib
import re

from pydantic import BaseModel

from .diagnostics import Diagnostic, error, plural_word, warning
from .hierarchy import Organisation, organisation, reservation_demands
from .models import NAME_PATTERN, Group, Policy, Pool, Profile
from .idle_checks import check_profile_idle
from .node_checks import check_pool_nodes, check_profile_nodes
from .setting_checks import check_pool_settings
from .lending_checks import check_lending
from .identity_checks import check_identity
from .org_checks import check_connection, check_handles, check_tree, listed_envelope
from .reservations import check_reservations
from .resolve import allowed, pool_capacity, resolve_pools
from .source import SourceMap, SourceObject
from .units import milli_str


_VALID_NAME = re.compile(NAME_PATTERN)


def _did_you_mean(word: str, options: list[str]) -> str | None:
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else None


def _gpus(milli: int) -> str:
    return f"{milli_str(milli)} GPU{'s' if milli != 1000 else ''}"


def _ref(
    sources: SourceMap, obj: SourceObject[BaseModel], kind: str, name: str, *path: str | int
) -> Diagnostic | None:
    if sources.exists(kind, name):
        return None
    options = sorted(sources.of(kind)) + sorted(
        n for n in sources.broken.get(kind, set()) if _VALID_NAME.match(n)
    )
    return error(
        "unknown-reference",
        f"{obj.label} refers to {kind} '{name}', which does not exist",
        obj.pos(*path),
        _did_you_mean(name, options)
        or (
            f"known {plural_word(kind)}: {', '.join(options[:8])}"
            if options
            else f"declare the {kind}"
        ),
    )


def run_checks(sources: SourceMap) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    pools = {n: o for n, o in sources.of("pool").items()}
    profiles = sources.of("profile")
    policies = sources.of("policy")
    groups = sources.of("group")
    pool_models: list[Pool] = [o.model for o in pools.values()]

    diags += _check_pools(sources, pools)
    diags += check_pool_nodes(pools)
    diags += check_pool_settings(pools)
    diags += _check_groups(sources, groups, policies)
    org = organisation([o.model for o in policies.values()], [o.model for o in groups.values()])
    diags += check_tree(org, policies, groups)
    diags += check_handles(sources.settings, groups)
    diags += check_lending(org, policies, sources.settings)
    diags += check_identity(sources.settings, groups)

    resolved: dict[str, list[str]] = {}
    for name, obj in profiles.items():
        prof: Profile = obj.model
        diags += _check_profile(sources, obj, prof, pool_models)
        resolved[name] = resolve_pools(prof, pool_models)
        diags += check_profile_nodes(obj, prof, resolved[name], pools)
        diags += check_profile_idle(obj, prof)

    connected: dict[str, list[str]] = {p: [] for p in policies}
    for name, obj in profiles.items():
        prof = obj.model
        seen: set[str] = set()
        for i, pol in enumerate(prof.policies):
            if pol in seen:
                diags.append(
                    error(
                        "invalid-value",
                        f"{obj.label} lists policy '{pol}' twice",
                        obj.pos("policies", i),
                        "remove the second entry",
                    )
                )
                continue
            seen.add(pol)
            d = _ref(sources, obj, "policy", pol, "policies", i)
            if d:
                diags.append(d)
            elif pol in policies and org.is_envelope(pol):
                diags.append(listed_envelope(org, obj, i, policies[pol]))
            elif pol in policies:
                connected[pol].append(name)
                diags += _check_connection(obj, prof, i, policies[pol], resolved[name], pools)
                size, maximum = _size(prof)
                diags += check_connection(
                    org, obj, prof, i, policies[pol], size, maximum, resolved[name], policies, pools
                )

    for name, pol_obj in policies.items():
        policy = pol_obj.model
        if policy.reservation > policy.limit:
            diags.append(
                error(
                    "reservation-above-limit",
                    f"{pol_obj.label}: reservation {_gpus(policy.reservation)} is above its limit "
                    f"{_gpus(policy.limit)}",
                    pol_obj.pos("reservation"),
                    "a limit counts borrowed GPUs too: raise the limit or lower the reservation",
                )
            )
        if policy.budget is not None:
            for i, frac in enumerate(policy.budget.alert_at):
                if not 0 < frac <= 1000:
                    diags.append(
                        error(
                            "invalid-value",
                            f"{pol_obj.label}: alert_at "
                            f"{milli_str(frac)} is not a fraction in (0, 1]",
                            pol_obj.pos("budget", "alert_at", i),
                            "write 0.8 for 80%",
                        )
                    )
        if not connected[name] and not org.is_envelope(name) and not sources.broken.get("profile"):
            diags.append(
                warning(
                    "unused-policy",
                    f"{pol_obj.label} is connected to no profile, so its group cannot send work",
                    pol_obj.pos("name"),
                    "list the policy under some profile's 'policies'",
                )
            )

    used_pools = {q for qs in resolved.values() for q in qs}
    for name, pool_obj in pools.items():
        if name not in used_pools and not sources.broken.get("profile"):
            diags.append(
                warning(
                    "unused-pool",
                    f"{pool_obj.label} is used by no profile",
                    pool_obj.pos("name"),
                    "list it under some profile's 'pools'",
                )
            )
    diags += _check_execution_order(sources, pools, profiles, resolved)
    for name, obj in profiles.items():
        if not obj.model.policies:
            diags.append(
                warning(
                    "unused-profile",
                    f"{obj.label} is connected to no policy, so it makes no compute resource",
                    obj.pos("name"),
                    "list the policies that may use it under 'policies'",
                )
            )

    diags += _check_pricing(sources, pools)
    diags += _check_cloud_spend(sources, pools)
    # The max-flow check over a partly broken estate would report shortfalls that are only
    # echoes of the errors above (a pool that failed validation has no capacity here).
    cascading = any(sources.broken.get(k) for k in ("pool", "profile", "policy")) or any(
        d.code in ("unknown-reference", "profile-pools", "profile-no-pool") for d in diags
    )
    if not cascading:
        diags += _check_reservations(org, policies, connected, resolved, pools)
    attribution = sources.settings.model.attribution if sources.settings is not None else None
    if (
        attribution is not None
        and sources.settings is not None
        and attribution.overhead_account in groups
    ):
        diags.append(
            error(
                "invalid-value",
                f"settings: attribution.overhead_account "
                f"'{attribution.overhead_account}' is a group: idle capacity would be reported "
                "as that group's",
                sources.settings.pos("attribution", "overhead_account"),
                "name an account that is no group, e.g. it-overhead",
            )
        )
    if sources.settings is not None and sources.settings.model.pass_interval <= 0:
        diags.append(
            error(
                "invalid-value",
                "settings: pass_interval must be above 0",
                sources.settings.pos("pass_interval"),
                "the default is 1s",
            )
        )
    return diags


def _check_pools(sources: SourceMap, pools: dict[str, SourceObject[Pool]]) -> list[Diagnostic]:
    diags = []
    for obj in pools.values():
        pool: Pool = obj.model
        if pool.kind == "cloud":
            if pool.capacity is not None and pool.autoscale is not None:
                diags.append(
                    error(
                        "cloud-capacity",
                        f"{obj.label} has both 'capacity' and 'autoscale'",
                        obj.pos("capacity"),
                        "a fixed cloud pool (reserved or neocloud capacity) has "
                        "'capacity'; an autoscaled one has 'autoscale.max'",
                    )
                )
            elif pool.capacity is None and pool.autoscale is None:
                diags.append(
                    error(
                        "cloud-capacity",
                        f"{obj.label} has neither 'capacity' nor 'autoscale'",
                        obj.pos("name"),
                        "add 'capacity: N' or 'autoscale: {max: N}'",
                    )
                )
        else:
            if pool.capacity is None:
                diags.append(
                    error(
                        "missing-field",
                        f"{obj.label}: missing required field 'capacity'",
                        obj.pos("name"),
                        "declare the pool's GPUs: 'full' means this is used",
                    )
                )
            if pool.autoscale is not None:
                diags.append(
                    error(
                        "invalid-value",
                        f"{obj.label}: 'autoscale' is for cloud pools, not {pool.kind}",
                        obj.pos("autoscale"),
                        "remove it, or make the pool kind: cloud",
                    )
                )
    return diags


def _check_groups(
    sources: SourceMap,
    groups: dict[str, SourceObject[Group]],
    policies: dict[str, SourceObject[Policy]],
) -> list[Diagnostic]:
    diags = []
    for obj in groups.values():
        g: Group = obj.model
        if g.parent is not None:
            d = _ref(sources, obj, "group", g.parent, "parent")
            if d:
                diags.append(d)
    # Cycles of parents: report each cycle once, at its first member in sorted order.
    reported: set[frozenset[str]] = set()
    for start in sorted(groups):
        path: list[str] = []
        cur: str | None = start
        while cur is not None and cur in groups and cur not in path:
            path.append(cur)
            cur = groups[cur].model.parent
        if cur is not None and cur in path:
            cycle = path[path.index(cur) :]
            key = frozenset(cycle)
            if key not in reported:
                reported.add(key)
                first = sorted(cycle)[0]
                ring = cycle[cycle.index(first) :] + cycle[: cycle.index(first)] + [first]
                diags.append(
                    error(
                        "group-cycle",
                        "group parents form a cycle: " + " → ".join(ring),
                        groups[first].pos("parent"),
                        "a department is above its groups: break the cycle",
                    )
                )
    by_group: dict[str, list[SourceObject[Policy]]] = {}
    for pol_obj in policies.values():
        pol: Policy = pol_obj.model
        d = _ref(sources, pol_obj, "group", pol.group, "group")
        if d:
            diags.append(d)
        by_group.setdefault(pol.group, []).append(pol_obj)
    for group, objs in sorted(by_group.items()):
        if len(objs) > 1:
            names = ", ".join(f"'{o.name}'" for o in objs)
            for o in objs[1:]:
                diags.append(
                    error(
                        "group-multiple-policies",
                        f"group '{group}' has more than one policy: {names}",
                        o.pos("group"),
                        "a policy is the group's one set of rules: merge them",
                        related=(objs[0].pos("group"),),
                    )
                )
    return diags


def _check_profile(
    sources: SourceMap, obj: SourceObject[Profile], prof: Profile, pools: list[Pool]
) -> list[Diagnostic]:
    diags = []
    if prof.pools is not None and prof.pools_by is not None:
        diags.append(
            error(
                "profile-pools",
                f"{obj.label} has both 'pools' and 'pools_by'",
                obj.pos("pools_by"),
                "keep one: a list of pools, or a capability",
            )
        )
    elif prof.pools is None and prof.pools_by is None:
        diags.append(
            error(
                "profile-pools",
                f"{obj.label} has neither 'pools' nor 'pools_by'",
                obj.pos("name"),
                "add 'pools: [first, second]' in placement order",
            )
        )
    if prof.pools is not None:
        seen: set[str] = set()
        for i, name in enumerate(prof.pools):
            if name in seen:
                diags.append(
                    error(
                        "invalid-value",
                        f"{obj.label} lists pool '{name}' twice",
                        obj.pos("pools", i),
                        "remove the second entry",
                    )
                )
            seen.add(name)
            d = _ref(sources, obj, "pool", name, "pools", i)
            if d:
                diags.append(d)
        if prof.pools == []:
            diags.append(
                error(
                    "profile-no-pool",
                    f"{obj.label} lists no pool",
                    obj.pos("pools"),
                    "add the pools it may use, first = tried first",
                )
            )
    elif prof.pools_by is not None and prof.pools is None:
        if not resolve_pools(prof, pools):
            diags.append(
                error(
                    "profile-no-pool",
                    f"{obj.label}: pools_by matches no pool",
                    obj.pos("pools_by"),
                    "relax the capability, or declare a pool that has it",
                )
            )
    if isinstance(prof.gpus, int):
        pass
    else:
        ft = prof.gpus
        if ft.default > ft.max:
            diags.append(
                error(
                    "invalid-value",
                    f"{obj.label}: default size {_gpus(ft.default)} is above max {_gpus(ft.max)}",
                    obj.pos("gpus", "default"),
                    "lower the default or raise max",
                )
            )
    return diags


def _size(prof: Profile) -> tuple[int, int | None]:
    """(size that must fit the limit, from_task max or None)."""
    if isinstance(prof.gpus, int):
        return prof.gpus, None
    return prof.gpus.default, prof.gpus.max


def _check_connection(
    obj: SourceObject[Profile],
    prof: Profile,
    index: int,
    pol_obj: SourceObject[Policy],
    resolved: list[str],
    pools: dict[str, SourceObject[Pool]],
) -> list[Diagnostic]:
    diags = []
    pol: Policy = pol_obj.model
    size, maximum = _size(prof)
    if size > pol.limit:
        what = "default size" if maximum is not None else "size"
        diags.append(
            error(
                "profile-too-large",
                f"{obj.label} ({what} {_gpus(size)}) is connected to policy "
                f"'{pol.name}' whose limit is {_gpus(pol.limit)}",
                obj.pos("policies", index),
                "a task could never start: raise the limit or use a smaller profile",
            )
        )
    elif maximum is not None and maximum > pol.limit:
        diags.append(
            warning(
                "from-task-max-above-limit",
                f"{obj.label} allows tasks up to {_gpus(maximum)} but policy "
                f"'{pol.name}' has a limit of {_gpus(pol.limit)}",
                obj.pos("gpus", "max"),
                "tasks above the limit are refused at submission",
            )
        )
    if pol.pools_allowed is not None:
        for name in resolved:
            pool: Pool = pools[name].model
            if not allowed(pool, pol.pools_allowed.labels, pol.pools_allowed.pools):
                path = ("pools", prof.pools.index(name)) if prof.pools else ("pools_by",)
                rule = ", ".join(f"{k}={v}" for k, v in pol.pools_allowed.labels.items())
                diags.append(
                    error(
                        "pool-not-allowed",
                        f"{obj.label} is connected to policy '{pol.name}' but uses pool '{name}', "
                        f"outside the policy's pools_allowed ({rule or 'pools list'})",
                        obj.pos(*path),
                        "work of this group must not run there: give the group a profile that "
                        "lists allowed pools only",
                    )
                )
    return diags


def _check_execution_order(
    sources: SourceMap,
    pools: dict[str, SourceObject[Pool]],
    profiles: dict[str, SourceObject[Profile]],
    resolved: dict[str, list[str]],
) -> list[Diagnostic]:
    diags = []
    users: dict[str, list[str]] = {p: [] for p in pools}
    for prof, qs in resolved.items():
        for q in qs:
            users[q].append(prof)
    for name, obj in pools.items():
        pool: Pool = obj.model
        if pool.execution_order is None:
            continue
        for i, prof in enumerate(pool.execution_order):
            if prof not in profiles and sources.exists("profile", prof):
                continue  # it failed validation: that error is reported already
            if prof not in profiles:
                diags.append(
                    error(
                        "unknown-reference",
                        f"{obj.label}: execution_order names "
                        f"profile '{prof}', which does not exist",
                        obj.pos("execution_order", i),
                        _did_you_mean(prof, sorted(profiles)) or "remove it",
                    )
                )
            elif prof not in users[name]:
                diags.append(
                    warning(
                        "execution-order-unused",
                        f"{obj.label}: execution_order "
                        f"names profile '{prof}', which does not use this pool",
                        obj.pos("execution_order", i),
                        "remove it from the list",
                    )
                )
        missing = [p for p in users[name] if p not in pool.execution_order]
        if missing:
            text = (
                f"profile '{missing[0]}' uses this pool but is not in its "
                "execution_order; it is placed after the listed ones"
                if len(missing) == 1
                else f"profiles {', '.join(missing)} use this pool but are not in its "
                "execution_order; they are placed after the listed ones"
            )
            diags.append(
                warning(
                    "execution-order-unlisted",
                    f"{obj.label}: {text}",
                    obj.pos("execution_order"),
                    "list them where they belong",
                )
            )
    return diags


def _check_pricing(sources: SourceMap, pools: dict[str, SourceObject[Pool]]) -> list[Diagnostic]:
    priced = {o.model.gpu_type for o in sources.of("price").values()}
    priced |= {n.split("@")[0] for n in sources.broken.get("price", set())}
    diags = []
    for pobj in sources.of("price").values():
        price = pobj.model
        if price.list_per_gpu_hour is not None and price.list_per_gpu_hour < price.per_gpu_hour:
            diags.append(
                error(
                    "list-below-price",
                    f"{pobj.label}: list_per_gpu_hour {price.list_per_gpu_hour} "
                    f"is below per_gpu_hour {price.per_gpu_hour}: the list price is the price "
                    "before any contract, so it cannot be lower",
                    pobj.pos("list_per_gpu_hour"),
                    "leave list_per_gpu_hour out when there is no contracted discount",
                )
            )
    for obj in pools.values():
        pool: Pool = obj.model
        if pool.gpu_type not in priced:
            diags.append(
                warning(
                    "missing-price",
                    f"{obj.label}: gpu_type '{pool.gpu_type}' "
                    "has no price, so its GPU-hours are recorded at no cost",
                    obj.pos("gpu_type"),
                    f"add a pricing entry for gpu_type: {pool.gpu_type}",
                )
            )
    return diags


def _check_cloud_spend(
    sources: SourceMap, pools: dict[str, SourceObject[Pool]]
) -> list[Diagnostic]:
    """A node's price is known (``node_prices``, else the gpu_type's price) wherever a spend
    cap must be kept; an instance type is priced once."""
    priced = {o.model.gpu_type for o in sources.of("price").values()}
    priced |= {n.split("@")[0] for n in sources.broken.get("price", set())}
    diags = []
    for obj in pools.values():
        a = obj.model.autoscale
        if a is None:
            continue
        seen: dict[str, int] = {}
        for i, n in enumerate(a.node_prices):
            if n.instance_type in seen:
                diags.append(
                    error(
                        "duplicate-price",
                        f"{obj.label}: instance type "
                        f"'{n.instance_type}' is priced twice in "
                        f"autoscale.node_prices (items {seen[n.instance_type]} "
                        f"and {i})",
                        obj.pos("autoscale", "node_prices", i, "instance_type"),
                        "keep one price per instance type",
                    )
                )
            seen.setdefault(n.instance_type, i)
        if a.spend_cap is not None and not a.node_prices and obj.model.gpu_type not in priced:
            diags.append(
                error(
                    "missing-price",
                    f"{obj.label}: autoscale.spend_cap needs the "
                    f"price of a node, and gpu_type '{obj.model.gpu_type}' has "
                    "none",
                    obj.pos("autoscale", "spend_cap"),
                    "add autoscale.node_prices, or a pricing entry for gpu_type: "
                    f"{obj.model.gpu_type}",
                )
            )
    return diags


def _check_reservations(
    org: Organisation,
    policies: dict[str, SourceObject[Policy]],
    connected: dict[str, list[str]],
    resolved: dict[str, list[str]],
    pools: dict[str, SourceObject[Pool]],
) -> list[Diagnostic]:
    """Max flow over every reservation at once; an envelope's demand is its shared
    reservation, which any pool reachable from a policy below it may serve."""
    own = {n: o.model.reservation for n, o in policies.items()}
    reach = {
        n: sorted({q for prof in connected[n] for q in resolved.get(prof, [])}) for n in policies
    }
    reservations, reach = reservation_demands(org, own, reach)
    capacity = {n: pool_capacity(o.model) for n, o in pools.items()}
    diags = []
    for short in check_reservations(reservations, reach, capacity):
        first = policies[short.policies[0]]
        pol_names = ", ".join(
            f"{p} (shared {_gpus(reservations[p])})" if org.is_envelope(p) else p
            for p in short.policies
        )
        pool_names = ", ".join(short.pools) if short.pools else "no pool"
        one = len(short.policies) == 1
        diags.append(
            error(
                "reservations-do-not-fit",
                f"reservations do not fit: {'policy' if one else 'policies'} {pol_names} "
                f"{'reserves' if one else 'reserve'} {_gpus(short.reserved_milli)}, but the pools "
                f"{'it reaches' if one else 'they reach'} ({pool_names}) have "
                f"{_gpus(short.capacity_milli)}: short by {_gpus(short.short_milli)}",
                first.pos("reservation"),
                "lower these reservations, add capacity to these pools, or connect profiles that "
                "reach other pools",
                related=tuple(policies[p].pos("reservation") for p in short.policies[1:]),
            )
        )
    return diags
