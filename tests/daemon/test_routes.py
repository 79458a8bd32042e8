"""Route declarations (kliqued/daemon/api/routes.py): the role check, the table, and the layering
that lets handlers declare their routes (handlers never import the application)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kliqued.daemon.api.app import ROUTES
from kliqued.daemon.auth import Principal
from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.routes import ANY, ROLES, Route, role_of, table

HANDLERS = Path(__file__).resolve().parents[2] / "kliqued" / "daemon" / "handlers"


async def _handler(request):  # pragma: no cover - never called
    raise AssertionError


def test_role_of_each_kind_of_principal() -> None:
    assert [
        role_of(Principal.parse(t))
        for t in ("role:admin", "role:finance", "role:planner", "user:bob", "worker:pool-1")
    ] == list(ROLES)


def test_a_refusal_names_the_operation_and_the_roles_it_admits() -> None:
    r = Route("POST", "/v1/engine", _handler, "setEngine", ("admin",))
    r.check(Principal.parse("role:admin"))
    with pytest.raises(ApiError) as exc:
        r.check(Principal.parse("user:bob"))
    assert exc.value.status == 403 and exc.value.code == "forbidden"
    assert exc.value.message == (
        "user:bob may not call setEngine (POST /v1/engine): it is for admin"
    )
    assert exc.value.details == {"allowed": ["admin"]}


def test_a_hint_is_added_to_the_refusal() -> None:
    r = Route(
        "POST", "/v1/tasks", _handler, "submitTask", ("admin", "user"), hint="use a user's token"
    )
    with pytest.raises(ApiError, match="for admin, user; use a user's token"):
        r.check(Principal.parse("worker:pool-1"))


def test_any_token_admits_every_role_and_public_none() -> None:
    r = Route("GET", "/v1/estate", _handler, "getEstate", ANY)
    for text in ("role:admin", "role:finance", "role:planner", "user:bob", "worker:p"):
        r.check(Principal.parse(text))
    assert r.who == "any token" and not r.public
    assert Route("GET", "/v1/health", _handler, "health", ()).public


def test_unknown_roles_and_duplicates_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown roles"):
        Route("GET", "/v1/x", _handler, "x", ("admins",))
    r = Route("GET", "/v1/x", _handler, "x", ANY)
    with pytest.raises(ValueError, match="declared twice"):
        table([r, r])


def test_operation_ids_are_unique() -> None:
    ids = [r.operation_id for r in ROUTES]
    assert len(ids) == len(set(ids))


def test_handlers_do_not_import_the_application() -> None:
    """app.py assembles the handlers' route tables; a handler importing it is the old
    cycle (issue 11). Request helpers are in request.py."""
    for f in sorted(HANDLERS.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                assert mod not in ("..app", "kliqued.daemon.api.app"), f.name
                assert not (mod == ".." and any(a.name == "app" for a in node.names)), f.name
