"""Who a verified token is, by the estate alone: the provider says who someone is, never what
they may do.

- A person: the provider's ``user_claim`` (or the ``users`` map) names an estate user, who
  must still be in the estate (a group's ``users`` or ``admins``, or a role): a user removed
  from ``groups.yaml`` is refused at the next request. They act as ``user:<name>``, or as a
  role the estate gives them when they ask for it (a sign-in with ``role``).
- A job: every claim condition of its workload issuer must hold; it acts as the workload's
  role (``role:planner``).

The refusal names the claim and the value at fault, never the token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compiler.compiled import CompiledEstate, CPeopleProvider, CWorkload
from compiler.models import USER_PATTERN
from klique_util.excerpt import excerpt

from kliqued.daemon.auth import Access, Principal, TokenRecord
from kliqued.daemon.errors import forbidden
from kliqued.daemon.identity.verify import Verified

_USER = re.compile(USER_PATTERN)


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A verified caller: the principal, and what the audit records of the sign-in."""

    principal: Principal
    provider: str
    subject: str
    person: str | None
    """The estate user behind the principal (None for a job)."""


def in_estate(estate: CompiledEstate, access: Access, user: str) -> bool:
    ident = estate.settings.identity
    return bool(
        access.groups_of(user)
        or access.admin_of(user)
        or (ident is not None and ident.in_estate(user))
    )


def user_of(cfg: CPeopleProvider, value: str) -> str:
    """The estate user a claim value names: the ``users`` map, else the user of that name,
    unless that user is mapped to another value (then their name alone is no one)."""
    mapped = cfg.users.get(value)
    if mapped is not None:
        return mapped
    if value in cfg.users.values():
        raise forbidden(
            f"{cfg.name}: {cfg.user_claim} {excerpt(value)} names no one: settings.identity "
            f"maps the user {excerpt(value, quoted=False)} to another value"
        )
    if not _USER.match(value):
        raise forbidden(
            f"{cfg.name}: {cfg.user_claim} {excerpt(value)} is not an estate user name: map it "
            f"in settings.identity.providers[{cfg.name}].users"
        )
    return value


def person(
    v: Verified, cfg: CPeopleProvider, estate: CompiledEstate, access: Access, role: str | None
) -> SignedIn:
    value = v.claims.get(cfg.user_claim)
    if not isinstance(value, str) or not value:
        raise forbidden(
            f"{cfg.name}: the token has no {cfg.user_claim!r} claim to name the user by "
            "(settings.identity user_claim); ask the provider to include it"
        )
    user = user_of(cfg, value)
    if not in_estate(estate, access, user):
        raise forbidden(
            f"{excerpt(user)} signed in through {cfg.name} but is in no group of the running "
            "estate and holds no role: an admin adds them to groups.yaml"
        )
    ident = estate.settings.identity
    if role is not None:
        holders = ident.roles.get(role, []) if ident is not None else []
        if user not in holders:
            raise forbidden(
                f"{excerpt(user)} does not hold the role {excerpt(role)}: "
                f"settings.identity.roles.{role} lists who does"
            )
        p = Principal("role", role)
    else:
        p = Principal("user", user)
    return SignedIn(p, cfg.name, v.subject, user)


def _matches(want: str, got: object) -> bool:
    if not isinstance(got, str):
        return False
    if want.endswith("*"):
        return got.startswith(want[:-1])
    return got == want


def job(v: Verified, cfg: CWorkload) -> SignedIn:
    for claim, want in sorted(cfg.claims.items()):
        got = v.claims.get(claim)
        if not _matches(want, got):
            raise forbidden(
                f"the job's token does not match workload issuer {cfg.name}: {claim} is "
                f"{excerpt(got) if got is not None else 'absent'}, the estate asks {want!r}"
            )
    return SignedIn(Principal("role", cfg.role), cfg.name, v.subject, None)


def signed_in(v: Verified, estate: CompiledEstate, access: Access, role: str | None) -> SignedIn:
    """The caller of a verified token (``role``: a person's asked-for role)."""
    if isinstance(v.issuer, CWorkload):
        return job(v, v.issuer)
    return person(v, v.issuer, estate, access, role)


SIGNIN = "signin:"
"""``created_by`` of a Klique token made at a sign-in: ``signin:<provider>:<person>``."""


def signin_creator(s: SignedIn) -> str:
    return f"{SIGNIN}{s.provider}:{s.person}"


def signin_refusal(rec: TokenRecord, estate: CompiledEstate, access: Access) -> str | None:
    """Why a token made at a sign-in no longer works under ``estate``: its person left every
    group and role, lost the role it acts as, or its provider is no longer trusted. None for
    every other token (an admin's, a worker's: their own revocation rules them)."""
    if not (rec.created_by or "").startswith(SIGNIN):
        return None
    provider, _, who = (rec.created_by or "")[len(SIGNIN) :].partition(":")
    ident = estate.settings.identity
    if ident is None or all(p.name != provider for p in ident.providers):
        return f"token {rec.id} came from a sign-in through {provider}, which the running estate no longer trusts"
    if not in_estate(estate, access, who):
        return f"token {rec.id}: {who} is no longer in the running estate (groups or roles)"
    kind, _, role = rec.principal.partition(":")
    if kind == "role" and who not in ident.roles.get(role, []):
        return f"token {rec.id}: {who} no longer holds the role {role}"
    return None
