"""The checks of ``settings.identity`` (docs/identity.md): the rules that keep sign-in from
naming the wrong person or trusting the wrong job.

- Each provider and workload issuer has its own name and its own issuer: a token is matched
  to its configuration by ``iss``, so two with one issuer would make the match ambiguous.
- A claim value maps to one estate user: two users given one value in ``users``, or a value
  given to one user that is another user's name, is an error naming both places (the
  daemon would otherwise have to guess who signed in).
- ``users`` names estate users (in some group or role): a mapping for nobody is a typo.
- A workload's conditions name the repository or project: an issuer like GitHub's signs
  tokens for every repository on it, and a condition on ``ref`` alone would admit them all.
- ``leeway`` at most 5 minutes and ``token_lifetime`` between 1 minute and 7 days: a longer
  skew accepts expired tokens, a longer Klique token outlives the removal it should follow.
"""

from __future__ import annotations

from .diagnostics import Diagnostic, error
from .models import Group, Identity, PeopleProvider, Settings, WorkloadIssuer
from .source import SourceObject

MAX_LEEWAY_S = 300
MIN_LIFETIME_S = 60
MAX_LIFETIME_S = 7 * 86400
SCOPING_CLAIMS = (
    "repository",
    "repository_id",
    "repository_owner",
    "repository_owner_id",
    "project_path",
    "project_id",
    "namespace_path",
    "namespace_id",
    "sub",
)
"""Claims that name what a CI token was issued to (GitHub Actions', GitLab's)."""


def estate_users(groups: dict[str, SourceObject[Group]], identity: Identity | None) -> set[str]:
    """Every user the estate names: in a group's ``users`` or ``admins``, or in a role."""
    users = {u for o in groups.values() for u in (*o.model.users, *o.model.admins)}
    if identity is not None:
        r = identity.roles
        users.update(r.admin, r.finance, r.planner)
    return users


def check_identity(
    settings: SourceObject[Settings] | None, groups: dict[str, SourceObject[Group]]
) -> list[Diagnostic]:
    if settings is None or settings.model.identity is None:
        return []
    ident: Identity = settings.model.identity
    diags: list[Diagnostic] = []
    pos = settings.pos
    if not MIN_LIFETIME_S <= ident.token_lifetime <= MAX_LIFETIME_S:
        diags.append(
            error(
                "invalid-value",
                f"settings: identity.token_lifetime must be between 1m and 7d, found "
                f"{ident.token_lifetime}s",
                pos("identity", "token_lifetime"),
                "kliqued login renews the token, so a short lifetime costs nothing; 8h is "
                "the default",
            )
        )
    issuers: dict[str, str] = {}
    names: dict[str, str] = {}
    entries: list[tuple[str, int, PeopleProvider | WorkloadIssuer]]
    entries = [("providers", i, p) for i, p in enumerate(ident.providers)]
    entries += [("workloads", i, w) for i, w in enumerate(ident.workloads)]
    for kind, i, entry in entries:
        where = f"identity.{kind}[{i}]"
        if entry.name in names:
            diags.append(
                error(
                    "duplicate-name",
                    f"settings: {where} is named '{entry.name}' like {names[entry.name]}",
                    pos("identity", kind, i, "name"),
                    "give each provider and workload issuer its own name",
                )
            )
        names.setdefault(entry.name, where)
        if entry.issuer in issuers:
            diags.append(
                error(
                    "duplicate-issuer",
                    f"settings: {where} ('{entry.name}') has the issuer {entry.issuer} of "
                    f"{issuers[entry.issuer]}: a token is matched to its settings by 'iss'",
                    pos("identity", kind, i, "issuer"),
                    "declare each issuer once (a provider for people, or a workload issuer)",
                )
            )
        issuers.setdefault(entry.issuer, f"{where} ('{entry.name}')")
        if entry.leeway > MAX_LEEWAY_S:
            diags.append(
                error(
                    "invalid-value",
                    f"settings: {where}.leeway must be at most 5m, found {entry.leeway}s",
                    pos("identity", kind, i, "leeway"),
                    "a leeway is for clock skew; 60s is the default",
                )
            )
    known = estate_users(groups, ident)
    for i, prov in enumerate(ident.providers):
        diags += _check_users(settings, i, prov.name, prov.users, known)
    for i, w in enumerate(ident.workloads):
        if not w.claims:
            diags.append(
                error(
                    "workload-unscoped",
                    f"settings: workload issuer '{w.name}' has no claim conditions: every job "
                    f"of every repository on {w.issuer} would act as {w.role}",
                    pos("identity", "workloads", i, "claims"),
                    "add claims: {repository: your-org/your-estate, ref: refs/heads/main}",
                )
            )
        elif not any(c in w.claims and not w.claims[c].startswith("*") for c in SCOPING_CLAIMS):
            diags.append(
                error(
                    "workload-unscoped",
                    f"settings: workload issuer '{w.name}' has no condition naming the "
                    f"repository or project ({', '.join(SCOPING_CLAIMS)}): jobs of other "
                    f"repositories on {w.issuer} would act as {w.role}",
                    pos("identity", "workloads", i, "claims"),
                    "add repository: your-org/your-estate (GitHub) or project_path: "
                    "group/project (GitLab)",
                )
            )
    return diags


def _check_users(
    settings: SourceObject[Settings],
    i: int,
    provider: str,
    users: dict[str, str],
    known: set[str],
) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    owner: dict[str, str] = {}
    for user, value in users.items():
        at = settings.pos("identity", "providers", i, "users", user)
        if user not in known:
            diags.append(
                error(
                    "unknown-user",
                    f"settings: identity.providers[{i}] ('{provider}') maps a claim to "
                    f"'{user}', who is in no group's users or admins and holds no role",
                    at,
                    "add them to a group in groups.yaml, or remove the line",
                )
            )
        if value in owner:
            diags.append(
                error(
                    "claim-maps-to-two-users",
                    f"settings: identity.providers[{i}] ('{provider}') maps the claim value "
                    f"{value!r} to both '{owner[value]}' and '{user}'",
                    at,
                    "a sign-in must name one person: give each user their own value",
                )
            )
            continue
        owner[value] = user
        if value != user and value in known and users.get(value, value) == value:
            diags.append(
                error(
                    "claim-maps-to-two-users",
                    f"settings: identity.providers[{i}] ('{provider}') maps the claim value "
                    f"{value!r} to '{user}', but {value!r} is also the estate user of that "
                    f"name, whom it names when unmapped",
                    at,
                    f"map '{value}' to a value of their own in users, or map '{user}' to "
                    "another value",
                )
            )
    return diags
