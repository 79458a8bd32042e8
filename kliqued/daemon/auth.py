"""Identity and access: principals, the token book, and who may see or do what.

Principals (api-contract.md "Auth"): ``user:<name>``, ``worker:<pool>``, ``role:admin``,
``role:finance``, ``role:planner``. Group membership and group admins come from the
compiled estate, so a change of ``groups.yaml`` changes access at the next estate revision,
with no token reissued. An admin of a group is also an admin of every group below it (a
department head manages the department's teams: seed section 01); membership (``users``)
does not inherit. Tokens may expire; a revoked or expired one is refused at once, saying
which and when.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from compiler.compiled import CompiledEstate

from kliqued.daemon.errors import ApiError
from kliqued.daemon.ids import TokenHasher
from kliqued.daemon.units import iso

Kind = Literal["user", "worker", "role"]
_KINDS: dict[str, Kind] = {"user": "user", "worker": "worker", "role": "role"}
OIDC = "oidc:"
"""The ``token_id`` prefix of a principal that came with a provider's JWT (issue 30)."""
ROLES = ("admin", "finance", "planner")
"""``planner``: CI's read-only role for ``kliqued plan --against``; it reads the running
revision and the live counts of ``GET /v1/plan/state`` (and the estate), nothing else."""


@dataclass(frozen=True, slots=True)
class Principal:
    kind: Kind
    name: str
    token_id: str | None = None

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def is_admin(self) -> bool:
        return self.kind == "role" and self.name == "admin"

    @property
    def is_finance(self) -> bool:
        return self.kind == "role" and self.name == "finance"

    @property
    def is_planner(self) -> bool:
        return self.kind == "role" and self.name == "planner"

    @property
    def is_user(self) -> bool:
        return self.kind == "user"

    @property
    def is_worker(self) -> bool:
        return self.kind == "worker"

    @staticmethod
    def parse(text: str, token_id: str | None = None) -> "Principal":
        prefix, _, name = text.partition(":")
        kind = _KINDS.get(prefix)
        if kind is None or not name:
            raise ValueError(f"not a principal: {text!r}")
        if kind == "role" and name not in ROLES:
            raise ValueError(f"unknown role {name!r}")
        return Principal(kind, name, token_id)


@dataclass(slots=True)
class TokenRecord:
    id: str
    hash: str
    principal: str
    name: str | None
    created_at: int
    created_by: str | None
    revoked_at: int | None = None
    expires_at: int | None = None
    """Refused from this instant on (``--expires 90d``, or a rotation's grace)."""

    def refusal(self, now: int) -> str | None:
        """Why this token no longer works at ``now``, or None."""
        if self.revoked_at is not None:
            return f"token {self.id} was revoked on {iso(self.revoked_at)}"
        if self.expires_at is not None and now >= self.expires_at:
            return f"token {self.id} expired on {iso(self.expires_at)}"
        return None


class TokenBook:
    """Every token by keyed hash (authentication: one HMAC and a dict look-up per request)
    and by id (listing, revocation). ``hasher`` is set at start from the key file."""

    def __init__(self, hasher: TokenHasher | None = None) -> None:
        self.hasher = hasher
        self.by_hash: dict[str, TokenRecord] = {}
        self.by_id: dict[str, TokenRecord] = {}
        self.still: Callable[[TokenRecord], str | None] | None = None
        """Why a token made at a sign-in no longer works under the running estate (its
        person removed, their role or provider gone), or None: set by the daemon
        (identity.mapping.signin_refusal), so a removal ends every such token at once."""

    def refusal(self, rec: TokenRecord, now: int) -> str | None:
        """Why ``rec`` does not work at ``now``: revoked, expired, or its sign-in's person
        no longer in the estate; None when it works."""
        why = rec.refusal(now)
        if why is None and self.still is not None:
            why = self.still(rec)
        return why

    def hash(self, secret: str) -> str:
        if self.hasher is None:
            raise RuntimeError("the token key is not loaded")
        return self.hasher.hash(secret)

    def add(self, rec: TokenRecord) -> None:
        self.by_hash[rec.hash] = rec
        self.by_id[rec.id] = rec

    def usable(self, token_id: str | None, now: int) -> bool:
        """Whether the token ``token_id`` still works (long polls check it while they
        wait: a revoked or expired token's poll ends at once)."""
        rec = self.by_id.get(token_id or "")
        return rec is not None and self.refusal(rec, now) is None

    def ended(self, token_id: str | None, at: int) -> str | None:
        """Why the token a schedule or pipeline is bound to no longer works at ``at``
        (binding.py), or None: it does, or nothing is bound (a schedule made before
        schedules recorded their token)."""
        if token_id is None:
            return None
        rec = self.by_id.get(token_id)
        if rec is None:
            return f"token {token_id} is no longer known"
        return self.refusal(rec, at)

    def seconds_left(self, token_id: str | None, now: int) -> float | None:
        """How long the token ``token_id`` still works from ``now``: None when it has no
        expiry, 0 when it no longer works. A browser cookie opened with it lives no longer
        (the dashboard's, a session's)."""
        rec = self.by_id.get(token_id or "")
        if rec is None or self.refusal(rec, now) is not None:
            return 0.0
        return None if rec.expires_at is None else (rec.expires_at - now) / 1000

    def require_booked(self, p: Principal, what: str) -> None:
        """409 when ``p`` came with an identity provider's own token (``oidc:...``, issue
        30): ``what`` (a schedule, a pipeline, a session's link) is bound to the token of
        the request and lives as long as it, which only a token of this book can say."""
        if p.token_id is not None and p.token_id.startswith(OIDC) and p.token_id not in self.by_id:
            raise ApiError(
                409,
                "conflict",
                f"{what} is bound to the token of the request, and this one is the identity "
                "provider's own: sign in with `kliqued login` (or the dashboard) and use the "
                "Klique token it stores",
            )

    def authenticate(self, header: str | None, now: int) -> Principal:
        if not header:
            raise ApiError(
                401, "unauthenticated", "no token: send the header 'Authorization: Bearer <token>'"
            )
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401, "unauthenticated", "the Authorization header must be 'Bearer <token>'"
            )
        rec = self.by_hash.get(self.hash(token.strip()))
        if rec is None:
            raise ApiError(401, "unauthenticated", "unknown token")
        why = self.refusal(rec, now)
        if why is not None:
            raise ApiError(401, "unauthenticated", why)
        return Principal.parse(rec.principal, rec.id)


class Access:
    """Who is in and who administers which group, for one estate revision."""

    def __init__(self, estate: CompiledEstate) -> None:
        self.revision = estate.revision
        member: dict[str, set[str]] = {}
        admin: dict[str, set[str]] = {}
        below: dict[str, set[str]] = {g.name: {g.name} for g in estate.groups}
        for g in estate.groups:
            for anc in g.ancestors:
                below.setdefault(anc, {anc}).add(g.name)
        for g in estate.groups:
            for u in g.users:
                member.setdefault(u, set()).add(g.name)
            for u in g.admins:
                admin.setdefault(u, set()).update(below.get(g.name, {g.name}))
        self._member = {u: frozenset(s) for u, s in member.items()}
        self._admin = {u: frozenset(s) for u, s in admin.items()}
        self._below = {g: frozenset(s) for g, s in below.items()}
        parents = {g.parent for g in estate.groups if g.parent is not None}
        self._it = frozenset(
            u for g in estate.groups if g.parent is None and g.name in parents for u in g.admins
        )
        """IT: the admins of each top group with groups below it, whom ``kliqued plan`` asks
        to approve pools when the estate names no ``settings.approvers`` (review data, not
        in the compiled estate: compiler/plan/approvals.py)."""

    def subtree(self, group: str) -> frozenset[str]:
        """``group`` and every group below it, at any depth (an unknown group: itself)."""
        return self._below.get(group, frozenset((group,)))

    def groups_of(self, user: str) -> frozenset[str]:
        """Groups that list ``user`` in ``users``: where they may send work."""
        return self._member.get(user, frozenset())

    def admin_of(self, user: str) -> frozenset[str]:
        return self._admin.get(user, frozenset())

    def fixes_pools(self, p: Principal) -> bool:
        """Whether warnings about pools and their machines (capacity truth) are for ``p``:
        those who can change a pool or a machine, platform admins and IT; a researcher
        cannot act on them (issue 32)."""
        return p.is_admin or (p.is_user and p.name in self._it)

    def fixes_budget(self, p: Principal, group: str) -> bool:
        """Whether ``group``'s budget alerts are for ``p``: its admins (the team lead and the
        heads above), who change its budget or its work, finance and platform admins."""
        return p.is_admin or p.is_finance or (p.is_user and group in self.admin_of(p.name))

    def sees_group(self, p: Principal, group: str) -> bool:
        """Queues, policies and usage of ``group``."""
        if p.is_admin:
            return True
        if p.is_user:
            return group in self.groups_of(p.name) or group in self.admin_of(p.name)
        return False

    def sees_task(self, p: Principal, user: str, group: str) -> bool:
        """A task's details (command, payload, labels): its user, its group's admins,
        platform admins."""
        if p.is_admin:
            return True
        return p.is_user and (user == p.name or group in self.admin_of(p.name))
