"""The OpenAPI document: valid OpenAPI 3.1, the routes the daemon serves, and API fuzzing
driven by it (schemathesis, on a daemon of its own): no 5xx, no traceback, every answer as
the document says, no schema-valid request refused for its form (400) and no schema-invalid
one accepted (issue 32: the rules are in the schema)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate

from kliqued.daemon.api.app import ROUTES, Context, make_app
from kliqued.daemon.api.openapi import document
from kliqued.web.routes import ROUTES as DASHBOARD
from kliqued.daemon.api.handlers.sessions import elsewhere, proxy

from tests.harness.daemon import ADMIN, EXAMPLE_ESTATE, Server
from tests.harness.inproc import InProcServer

DOC = document(routes=ROUTES)
PAGES = {(m, p) for m, p, _ in DASHBOARD}
"""The dashboard's routes (kliqued/web): served by the same application, not the API."""


def test_document_is_valid_openapi_31() -> None:
    validate(DOC)
    assert DOC["openapi"] == "3.1.0"


def test_document_lists_every_route() -> None:
    """Every API route; the dashboard's pages are outside /v1 and not in the document."""
    app = make_app(Context(None, None, None, 1.0, None))  # type: ignore[arg-type]
    served = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        path = route.resource.canonical if route.resource else ""
        if (route.method, path) in PAGES:
            assert not path.startswith("/v1"), path
            continue
        if route.handler in (proxy, elsewhere):
            continue  # a session's own app (any method), or the 404 saying where it is
        served.add((route.method.lower(), path))
    documented = {(m, p) for p, ops in DOC["paths"].items() for m in ops}
    assert served == documented


def test_every_served_route_is_declared_and_documented() -> None:
    """The route tables are the one declaration: what is served, its operation id and who
    may call it (the document's "Who" and ``x-klique-roles``)."""
    app = make_app(Context(None, None, None, 1.0, None))  # type: ignore[arg-type]
    served = {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None and r.handler not in (proxy, elsewhere)
    }
    assert served - PAGES == {(r.method, r.path) for r in ROUTES}
    for r in ROUTES:
        op = DOC["paths"][r.path][r.method.lower()]
        assert op["operationId"] == r.operation_id
        assert op["x-klique-roles"] == list(r.allowed)
        assert op["description"] == f"Who: {r.who}."
        assert (op.get("security") == []) == r.public, r.operation_id


def test_an_undeclared_operation_is_refused() -> None:
    with pytest.raises(ValueError, match="no route declaration"):
        document(routes=[r for r in ROUTES if r.operation_id != "getEstate"])


def test_contract_mentions_every_documented_route() -> None:
    contract = (Path(__file__).resolve().parents[2] / "docs" / "api-contract.md").read_text()
    for path, ops in DOC["paths"].items():
        for method in ops:
            # the contract's paths are under /v1, except /metrics (Prometheus's path)
            assert f"{method.upper()} {path.removeprefix('/v1')}" in contract, (method, path)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory) -> Iterator[Server]:
    # The example estate: the document's examples (llm-research/h100, alice) are valid there.
    s = InProcServer(tmp_path_factory.mktemp("fuzz"), estate=EXAMPLE_ESTATE).start()
    alice = s.token({"user": "alice"})
    for body in (
        {"resource": "llm-research/h100", "command": ["true"], "project": "evals"},
        {"resource": "llm-research/h100-8x", "command": ["true"], "project": "evals"},
    ):
        s.ok("POST", "/v1/tasks", body, alice, expect=201)
    yield s
    log = s.log()
    assert s.stop() == 0, log
    assert "Traceback" not in log, log


ACCEPTED = ["2xx", "401", "403", "404", "409", "410", "412", "413", "415", "422", "429", "503"]
"""What a schema-valid request may be answered: anything but a 400. A 400 says the request's
form is wrong, which the schema would have said; what no schema can say (the estate's
resources and projects, who calls, the calendar, a time zone's name) is a 422 or the
check's own code (docs/decisions.md, issue 32)."""
FORM_BEYOND_SCHEMA = {"POST /v1/ledger/sql"}
"""Operations whose body's form the schema cannot hold: SQL's grammar (a syntax error is the
request's form, a 400 `sql-error`)."""

# Bounded to about 200 requests: the examples and fuzzing phases (positive and negative
# data), 10 examples per operation; the exhaustive coverage phase alone sends ~500.
# /mcp speaks the MCP specification's JSON-RPC, not this document's shapes: its bad input is
# tests/mcp/test_mcp_http.py's. The admin's token is schemathesis's own (auth), so a
# negative case without it is sent without it.
schema = schemathesis.openapi.from_dict(
    DOC,
    config=SchemathesisConfig.from_dict(
        {
            "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
            "auth": {"openapi": {"bearer": {"bearer": ADMIN}}},
            "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}},
        }
    ),
).exclude(path="/mcp")

CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.negative_data_rejection,
]


@schema.parametrize()
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_fuzz(case, fuzz_server: Server) -> None:
    response = case.call(base_url=fuzz_server.url)
    assert response.status_code < 500, (case.method, case.path, response.text[:500])
    assert "Traceback" not in response.text
    positive = (
        []
        if f"{case.method} {case.path}" in FORM_BEYOND_SCHEMA
        else [schemathesis.checks.positive_data_acceptance]
    )
    case.validate_response(response, checks=[*CHECKS, *positive])
