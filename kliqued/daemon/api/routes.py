"""Route declarations: each handler module lists its routes with their operation id and the
roles that may call them, and the one check (``check``) runs before any handler.

The roles are those of api-contract.md "Auth": ``admin``, ``finance``, ``planner`` (the
``role:`` principals), ``user`` and ``worker``. A route names its object-level rule in
words (``rule``, e.g. "a user: their own tasks and their admin groups'"); the rule itself
stays in the handler (``auth.Access``, ``fleet.worker_of``), because it needs the object.
The OpenAPI document's "Who" text and the access-matrix test are derived from these
declarations, so the three cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from aiohttp import web

from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ROLES = ("admin", "finance", "planner", "user", "worker")
ANY = ROLES
"""Any valid token."""
PUBLIC: tuple[str, ...] = ()
"""No token at all (health, the OpenAPI document)."""


def role_of(p: Principal) -> str:
    """``role:admin`` -> ``admin``, ``user:bob`` -> ``user``, ``worker:pool-1`` -> ``worker``."""
    return p.name if p.kind == "role" else p.kind


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    operation_id: str
    allowed: tuple[str, ...]
    """The roles that may call it; empty: public, no token needed."""
    rule: str = ""
    """The object-level rule, in words (checked by the handler)."""
    hint: str = ""
    """Added to a refusal: what the caller should use instead."""

    def __post_init__(self) -> None:
        unknown = set(self.allowed) - set(ROLES)
        if unknown:
            raise ValueError(f"{self.operation_id}: unknown roles {sorted(unknown)}")

    @property
    def public(self) -> bool:
        return not self.allowed

    @property
    def who(self) -> str:
        """The OpenAPI document's "Who" text."""
        if self.public:
            return "anyone (no token)"
        roles = "any token" if set(self.allowed) == set(ROLES) else ", ".join(self.allowed)
        return f"{roles}; {self.rule}" if self.rule else roles

    def check(self, p: Principal) -> None:
        """403 unless ``p``'s role may call this route, saying which roles may."""
        if role_of(p) not in self.allowed:
            hint = f"; {self.hint}" if self.hint else ""
            raise ApiError(
                403,
                "forbidden",
                f"{p.text} may not call {self.operation_id} ({self.method} "
                f"{self.path}): it is for {', '.join(self.allowed)}{hint}",
                {"allowed": list(self.allowed)},
            )


def table(routes: Iterable[Route]) -> dict[tuple[str, str], Route]:
    """Routes by (method, path template); a route declared twice is an error."""
    out: dict[tuple[str, str], Route] = {}
    for r in routes:
        key = (r.method, r.path)
        if key in out:
            raise ValueError(f"{r.method} {r.path} is declared twice")
        out[key] = r
    return out
