"""The checks of organisation.md: envelopes, user limits and project priority.

Apart from ``checks.py`` because they read the organisation tree (``hierarchy.py``) rather
than single objects; ``checks.run_checks`` calls them with the same source objects, so every
finding has the position of the field at fault, the names involved and a hint.
"""

from __future__ import annotations

from .diagnostics import Diagnostic, error, warning
from .hierarchy import Organisation
from .models import Group, Policy, Pool, Profile, Settings
from .resolve import allowed
from .source import SourceObject
from .units import milli_str


def _gpus(milli: int) -> str:
    return f"{milli_str(milli)} GPU{'s' if milli != 1000 else ''}"


def _policy(obj: SourceObject[Policy]) -> Policy:
    return obj.model


def _below_groups(org: Organisation, group: str) -> list[str]:
    return sorted(g for g, ups in org.ancestors.items() if ups and ups[0] == group)


def check_tree(
    org: Organisation,
    policies: dict[str, SourceObject[Policy]],
    groups: dict[str, SourceObject[Group]],
) -> list[Diagnostic]:
    """Checks of policies and groups on their own: envelope reservations and limits,
    ``user_limit`` against the limit and on an envelope, ``project_priority``."""
    diags: list[Diagnostic] = []
    for name in sorted(org.envelopes):
        diags += _envelope_reservation(org, name, policies)
    for name, obj in policies.items():
        pol = _policy(obj)
        diags += _limit_above_envelope(org, name, policies)
        if pol.user_limit is None:
            continue
        if org.is_envelope(name):
            diags.append(
                error(
                    "user-limit-on-envelope",
                    f"{obj.label} is an envelope (group '{pol.group}' has groups below it: "
                    f"{', '.join(_below_groups(org, pol.group))}), so 'user_limit' does not apply",
                    obj.pos("user_limit"),
                    "a user belongs to a team: set user_limit on the policies of the groups below",
                )
            )
        elif pol.user_limit > pol.limit:
            diags.append(
                error(
                    "user-limit-above-limit",
                    f"{obj.label}: user_limit {_gpus(pol.user_limit)} is above its limit "
                    f"{_gpus(pol.limit)}",
                    obj.pos("user_limit"),
                    f"one user never holds more than the group: lower user_limit to at most "
                    f"{_gpus(pol.limit)}, or raise the limit",
                )
            )
    for group_obj in groups.values():
        g: Group = group_obj.model
        if g.project_priority and not g.projects:
            diags.append(
                error(
                    "project-priority-without-projects",
                    f"{group_obj.label} sets project_priority but lists no projects",
                    group_obj.pos("project_priority"),
                    "list the group's projects under 'projects', first = queued first, or "
                    "remove project_priority",
                )
            )
    return diags


def _envelope_reservation(
    org: Organisation, name: str, policies: dict[str, SourceObject[Policy]]
) -> list[Diagnostic]:
    obj = policies[name]
    nearest = [policies[p] for p in org.nearest.get(name, []) if p in policies]
    total = sum(_policy(p).reservation for p in nearest)
    own = _policy(obj).reservation
    if total <= own:
        return []
    parts = ", ".join(
        f"{p.name} {_gpus(_policy(p).reservation)}" for p in nearest if _policy(p).reservation > 0
    )
    return [
        error(
            "envelope-reservation-exceeded",
            f"{obj.label} (an envelope) reserves {_gpus(own)}, but the policies just below it "
            f"reserve {_gpus(total)} ({parts}): over by {_gpus(total - own)}",
            obj.pos("reservation"),
            f"their reservations are part of the envelope's: lower them by {_gpus(total - own)} "
            f"in all, or raise the envelope's reservation to {_gpus(total)}",
            related=tuple(p.pos("reservation") for p in nearest if _policy(p).reservation > 0),
        )
    ]


def _limit_above_envelope(
    org: Organisation, name: str, policies: dict[str, SourceObject[Policy]]
) -> list[Diagnostic]:
    """One warning per policy, against the envelope above it with the smallest limit."""
    obj = policies[name]
    above = [policies[e] for e in org.levels.get(name, [])[1:] if e in policies]
    if not above:
        return []
    tightest = min(above, key=lambda e: _policy(e).limit)
    limit, cap = _policy(obj).limit, _policy(tightest).limit
    if limit <= cap:
        return []
    return [
        warning(
            "limit-above-envelope",
            f"{obj.label} has limit {_gpus(limit)}, above the limit {_gpus(cap)} of envelope "
            f"'{tightest.name}' above it: it can never be reached",
            obj.pos("limit"),
            f"lower the limit to at most {_gpus(cap)}, or raise the envelope's limit",
            related=(tightest.pos("limit"),),
        )
    ]


def listed_envelope(
    org: Organisation, profile: SourceObject[Profile], index: int, envelope: SourceObject[Policy]
) -> Diagnostic:
    """A profile that lists an envelope: work is always sent to a team's compute resource."""
    group = _policy(envelope).group
    below = [p for p in org.nearest.get(envelope.name, [])]
    return error(
        "profile-lists-envelope",
        f"{profile.label} lists {envelope.label}, an envelope (group '{group}' has groups "
        f"below it: {', '.join(_below_groups(org, group))})",
        profile.pos("policies", index),
        "work is sent to a team's compute resource: list the policies below it instead"
        + (f" ({', '.join(below)})" if below else ""),
    )


def check_connection(
    org: Organisation,
    obj: SourceObject[Profile],
    prof: Profile,
    index: int,
    pol_obj: SourceObject[Policy],
    size: int,
    maximum: int | None,
    resolved: list[str],
    policies: dict[str, SourceObject[Policy]],
    pools: dict[str, SourceObject[Pool]],
) -> list[Diagnostic]:
    """A profile connected to a policy, against that policy's ``user_limit`` and against
    every envelope above it (its limit and its ``pools_allowed``)."""
    diags: list[Diagnostic] = []
    pol = _policy(pol_obj)
    what = "default size" if maximum is not None else "size"
    if pol.user_limit is not None:
        if size > pol.user_limit:
            diags.append(
                error(
                    "profile-above-user-limit",
                    f"{obj.label} ({what} {_gpus(size)}) is connected to {pol_obj.label} whose "
                    f"user_limit is {_gpus(pol.user_limit)}",
                    obj.pos("policies", index),
                    "no user of the group could ever start such a task: raise user_limit or use "
                    "a smaller profile",
                )
            )
        elif maximum is not None and maximum > pol.user_limit:
            diags.append(
                warning(
                    "from-task-max-above-limit",
                    f"{obj.label} allows tasks up to {_gpus(maximum)} but {pol_obj.label} has a "
                    f"user_limit of {_gpus(pol.user_limit)}",
                    obj.pos("gpus", "max"),
                    "a task above the user limit could never start",
                )
            )
    for env_name in org.levels.get(pol_obj.name, [])[1:]:
        env_obj = policies.get(env_name)
        if env_obj is None:
            continue
        env = _policy(env_obj)
        if size > env.limit:
            diags.append(
                error(
                    "profile-too-large",
                    f"{obj.label} ({what} {_gpus(size)}) is connected to {pol_obj.label}, below "
                    f"envelope '{env_name}' whose limit is {_gpus(env.limit)}",
                    obj.pos("policies", index),
                    "a task could never start: raise the envelope's limit or use a smaller profile",
                )
            )
        if env.pools_allowed is None:
            continue
        for name in resolved:
            pool: Pool = pools[name].model
            if allowed(pool, env.pools_allowed.labels, env.pools_allowed.pools):
                continue
            path = ("pools", prof.pools.index(name)) if prof.pools else ("pools_by",)
            rule = ", ".join(f"{k}={v}" for k, v in env.pools_allowed.labels.items())
            diags.append(
                error(
                    "pool-not-allowed",
                    f"{obj.label} is connected to {pol_obj.label} but uses pool '{name}', outside "
                    f"the pools_allowed of envelope '{env_name}' above it ({rule or 'pools list'})",
                    obj.pos(*path),
                    "an envelope's pools_allowed binds every team below it: give the group a "
                    "profile that lists allowed pools only",
                )
            )
    return diags


def check_handles(
    settings: SourceObject[Settings] | None, groups: dict[str, SourceObject[Group]]
) -> list[Diagnostic]:
    """With a ``forge_handles`` map, every admin and approver should have a handle: one
    without is left out of CODEOWNERS, so the changes they approve would need nobody's
    review from them. Without the map, nothing is asked (CODEOWNERS is optional)."""
    if settings is None:
        return []
    model: Settings = settings.model
    if not model.forge_handles:
        return []
    handles = model.forge_handles
    diags: list[Diagnostic] = []
    hint = (
        "add 'user: \"@their-handle\"' to settings.forge_handles; until then "
        "kliqued codeowners leaves them out"
    )
    for i, user in enumerate(model.approvers or []):
        if user not in handles:
            diags.append(
                warning(
                    "admin-without-handle",
                    f"settings: approver '{user}' has no forge handle in settings.forge_handles",
                    settings.pos("approvers", i),
                    hint,
                )
            )
    for obj in groups.values():
        g: Group = obj.model
        missing = [(i, u) for i, u in enumerate(g.admins) if u not in handles]
        for i, user in missing:
            diags.append(
                warning(
                    "admin-without-handle",
                    f"{obj.label}: admin '{user}' has no forge handle in settings.forge_handles",
                    obj.pos("admins", i),
                    hint,
                )
            )
    return diags
