"""The request schemas generated from the models (kliqued/api_models) against the
ones written by hand before them (``openapi_requests_before.json``, frozen when they were
replaced; ``openapi_responses_before.json``, the answers'): the same schema keyword for
keyword once words and references are set aside, and the same answer, first error
included, on every body the tests use and on values drawn near each old schema's bounds (hypothesis-jsonschema is not installed: ``near`` below draws
them, valid and just invalid)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from kliqued.api_models.estate import ESTATE_ANSWERS
from kliqued.api_models.requests import REQUESTS
from kliqued.api_models.responses import RESPONSES
from kliqued.daemon.api.openapi import EXAMPLES, document
from kliqued.daemon.api.schema_rules import with_name_rule

from tests.harness.examples import examples

HERE = Path(__file__).parent
REQUESTS_BEFORE: dict[str, Any] = json.loads((HERE / "openapi_requests_before.json").read_text())
RESPONSES_BEFORE: dict[str, Any] = json.loads((HERE / "openapi_responses_before.json").read_text())
# Where the hand-written schema was wrong and the model is not: a batch's accepted report has
# no `error` (fleet/workers.py `prepare_reports`), which the old schema required
# (tests/daemon/test_worker_answers.py shows the answer).
RESPONSES_BEFORE["ReportResults"]["properties"]["results"]["items"]["required"].remove("error")
SINCE: list[tuple[str, tuple[str, ...], Any]] = [
    # issue 32: a pipeline run's project, for its steps that name none
    (
        "PipelineRunRequest",
        ("properties", "project"),
        {"type": ["string", "null"], "minLength": 1, "maxLength": 256},
    ),
    # issue 32: a budget's alerts are for those who can act on them, absent for the others
    (
        "Budget",
        ("required",),
        [
            "hours",
            "period",
            "period_start",
            "resets_at",
            "used_hours",
            "left_hours",
            "burn_rate",
            "runout_at",
        ],
    ),
    # issue 32: the session apps a worker can start, said at registration and shown
    (
        "WorkerRegistration",
        ("properties", "apps"),
        {
            "type": ["array", "null"],
            "items": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,31}$"},
            "maxItems": 32,
        },
    ),
    ("Worker", ("properties", "apps"), {"type": ["array", "null"], "items": {"type": "string"}}),
    (
        "Worker",
        ("required",),
        [
            "id",
            "pool",
            "hostname",
            "executor",
            "gpus",
            "version",
            "registered_at",
            "state",
            "lost_at",
            "cannot_work",
            "leases",
            "apps",
        ],
    ),
]
"""Changes made on purpose since the schemas were frozen: (schema, path, its value now),
applied to the frozen copy so the comparisons below hold the rest as it was."""


def _since(schemas: dict[str, Any]) -> None:
    for name, path, value in SINCE:
        node = schemas.get(name)
        if node is None:
            continue
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value


_since(REQUESTS_BEFORE)
_since(RESPONSES_BEFORE)
# issue 32: the request bodies' names hold no control character, now said in the schema
_named = with_name_rule({**REQUESTS_BEFORE, **RESPONSES_BEFORE}, list(REQUESTS_BEFORE))
REQUESTS_BEFORE = {k: _named[k] for k in REQUESTS_BEFORE}
RESPONSES_BEFORE = {k: _named[k] for k in RESPONSES_BEFORE}
BEFORE = {**REQUESTS_BEFORE, **RESPONSES_BEFORE}
REQUESTS_SINCE = {"SignInRequest"}
RESPONSES_SINCE = {"IdentityProviders"}
"""Models of operations added after the hand-written schemas were frozen (issue 30's
sign-in): nothing to compare them with, so only their presence is checked."""
NAMES = sorted(BEFORE)
WORDS = {"description", "examples", "example"}
URN = "urn:test:openapi"


def _resolved(node: Any, schemas: dict[str, Any]) -> Any:
    """``node`` with every ``$ref`` replaced by what it names, and no words."""
    if isinstance(node, list):
        return [_resolved(v, schemas) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _resolved(schemas[node["$ref"].rsplit("/", 1)[1]], schemas)
    out = {}
    for k, v in node.items():
        if k in WORDS:
            continue
        if k == "properties":
            out[k] = {n: _resolved(s, schemas) for n, s in v.items()}
        else:
            out[k] = _resolved(v, schemas)
    return out


def _generated() -> dict[str, Any]:
    return document()["components"]["schemas"]


def test_every_request_body_of_the_document_comes_from_a_model() -> None:
    bodies = {
        op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        for ops in document()["paths"].values()
        for op in ops.values()
        if "application/json" in op.get("requestBody", {}).get("content", {})
    }
    assert bodies == set(REQUESTS_BEFORE) | REQUESTS_SINCE == {m.__name__ for m in REQUESTS}


def test_the_answers_replaced_by_models_come_from_them() -> None:
    assert set(RESPONSES_BEFORE) | RESPONSES_SINCE == {
        m.__name__ for m in (*RESPONSES, *ESTATE_ANSWERS)
    }


def test_every_schema_of_the_document_comes_from_a_model() -> None:
    """No schema is written by hand any more: each one the document holds is a model's or
    one a model uses (``$defs``), and every hand-written one has its model."""
    from kliqued.api_models.schema import components

    assert document()["components"]["schemas"] == with_name_rule(
        components((*REQUESTS, *RESPONSES, *ESTATE_ANSWERS)), [m.__name__ for m in REQUESTS]
    )
    assert set(BEFORE) <= set(document()["components"]["schemas"])


@pytest.mark.parametrize("name", NAMES)
def test_generated_schema_is_the_hand_written_one(name: str) -> None:
    """Equal as data (dicts compare without their keys' order; lists with it: ``required``,
    ``enum``, ``type``, ``oneOf`` in the order written by hand)."""
    old = _resolved(BEFORE[name], BEFORE)
    new = _resolved(_generated()[name], _generated())
    assert new == old


DEEP = {"properties", "items", "prefixItems", "patternProperties", "$defs"}
"""Keywords whose errors are placed below the value they check (sorted after its own)."""
REORDERED = {
    "TaskReport/properties/outputs",
    "WorkerReports/properties/reports/items/properties/outputs",
}
"""The one field whose order changed (``outputs``, in both report bodies): the hand-written
schemas put ``maxProperties`` before ``propertyNames`` there and after it in ``labels``; the
generator has one order. It shows only for a worker's report of over 100 outputs that also
has a badly named key: refused either way, at the same place, with the other of the two
reasons (``SWAPPED``)."""


SWAPPED = {"maxProperties", "propertyNames"}
"""The two keywords whose order changed (``REORDERED``): which of them is first may differ."""


def _same_place_keywords(node: dict[str, Any]) -> list[str]:
    return [
        k
        for k in node
        if k not in DEEP and not (k == "additionalProperties" and isinstance(node[k], dict))
    ]


@pytest.mark.parametrize("name", NAMES)
def test_generated_schema_keeps_the_order_errors_are_reported_in(name: str) -> None:
    """jsonschema reports errors in the schema's keyword order and the API answers with the
    first one at the shallowest place: at every node, the keywords that fail at the node's
    own place come in the hand-written order."""

    def walk(old: Any, new: Any, where: str) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            a = [k for k in _same_place_keywords(old) if k in new]
            b = [k for k in _same_place_keywords(new) if k in old]
            if a != b:
                assert where in REORDERED, (where, a, b)
                assert [k for k in a if k not in SWAPPED] == [k for k in b if k not in SWAPPED]
            for k in old.keys() & new.keys():
                if k == "properties":
                    for p in old[k].keys() & new[k].keys():
                        walk(old[k][p], new[k][p], f"{where}/{k}/{p}")
                else:
                    walk(old[k], new[k], f"{where}/{k}")
        elif isinstance(old, list) and isinstance(new, list):
            for i, (x, y) in enumerate(zip(old, new)):
                walk(x, y, f"{where}/{i}")

    walk(_resolved(BEFORE[name], BEFORE), _resolved(_generated()[name], _generated()), name)


@lru_cache(maxsize=None)
def _validator(which: str, name: str) -> Draft202012Validator:
    schemas = BEFORE if which == "before" else _generated()
    contents = {"components": {"schemas": schemas}}
    registry = Registry().with_resource(
        URN, Resource.from_contents(contents, default_specification=DRAFT202012)
    )
    return Draft202012Validator({"$ref": f"{URN}#/components/schemas/{name}"}, registry=registry)


def _answer(which: str, name: str, body: Any) -> list[tuple[list[str], str, str]]:
    """Every error, in the order ``request.valid`` sorts them (it answers with the first):
    its place, its keyword and its words."""
    errors = sorted(_validator(which, name).iter_errors(body), key=lambda e: list(e.path))
    return [([str(p) for p in e.path], _keyword(e), e.message) for e in errors]


def _keyword(e: Any) -> str:
    """The keyword that failed at the value's place (``propertyNames`` for a key's
    ``pattern``, which jsonschema reports as the inner keyword)."""
    return "propertyNames" if "propertyNames" in e.schema_path else str(e.validator)


def _agree(name: str, body: Any) -> None:
    """The same errors, and the same first one (the API's answer)."""
    old, new = _answer("before", name, body), _answer("after", name, body)
    assert sorted(map(repr, new)) == sorted(map(repr, old)), (name, body)
    if old and new[0] != old[0]:
        assert {old[0][1], new[0][1]} == SWAPPED and old[0][0] == new[0][0], (name, body)


CORPUS: list[tuple[str, Any]] = [
    *((n, b) for n, b in EXAMPLES.items() if n not in REQUESTS_SINCE),
    ("TaskSubmission", {"resource": "a/b"}),
    ("TaskSubmission", {"resource": "a/b", "gpus": 0.5, "labels": {"k": "v"}, "extra": 1}),
    ("TaskSubmission", {"resource": "", "gpus": 0.0005}),
    ("TaskSubmission", {"resource": "a/b", "labels": {"": "v"}}),
    ("TaskSubmission", {"command": ["x"]}),
    ("TaskSubmission", {"resource": "a/b", "payload": {"any": [1, None]}, "user": None}),
    ("ScheduleCreate", {"cron": "0 2 * * *", "resource": "a/b", "command": ["true"]}),
    ("ScheduleCreate", {"cron": "0 2 * * *", "pipeline": {"text": "steps: []"}}),
    ("ScheduleCreate", {"cron": "0 2 * * *", "pipeline": {"text": ""}}),
    ("ScheduleCreate", {"cron": "0 2 * * *", "concurrency": "sometimes", "missed": None}),
    ("ScheduleCreate", {"cron": "* * * * *", "deadline": "2h", "timezone": "Europe/Paris"}),
    ("ScheduleCreate", {"cron": "* * * * *", "deadline": -1}),
    ("SessionStart", {"resource": "a/b", "app": "jupyter"}),
    ("SessionStart", {"resource": "a/b", "app": "emacs"}),
    ("SessionStart", {"resource": "a/b", "app": "shell", "command": []}),
    ("SessionStart", {"resource": "a/b", "app": "shell", "idle": {"wall": "1h", "gpu": 60}}),
    ("SessionStart", {"resource": "a/b", "app": "shell", "idle": {"disk": "1h"}}),
    ("PipelineRunRequest", {"text": "x", "params": {"a": "b"}, "file": "p.yaml"}),
    ("PipelineRunRequest", {"text": "x", "params": {"a": 1}}),
    ("CancelRequest", {}),
    ("CancelRequest", {"reason": None}),
    ("CancelRequest", {"reason": "x" * 1025}),
    ("EngineSwitch", {"enabled": "yes"}),
    ("EngineSwitch", {}),
    ("TokenRequest", {"worker": True, "pool": "p", "expires_in": "90d"}),
    ("TokenRequest", {"worker": 1, "pool": "p"}),
    ("TokenRequest", {"role": "finance", "expires_at": "2027-01-01T00:00:00Z"}),
    ("TokenRequest", {"role": "root"}),
    ("TokenRequest", {"user": "a", "role": "admin"}),
    ("TokenRequest", {}),
    ("TokenRotation", {"grace": "1h"}),
    ("TokenRotation", {"grace": -5}),
    ("LedgerSql", {"sql": "SELECT 1", "timeout_s": 0}),
    ("LedgerSql", {"sql": "SELECT 1", "timeout_s": 10, "limit": 100_001}),
    ("WorkerRegistration", {"worker_id": "w 1", "pool": "p"}),
    ("WorkerRegistration", {"worker_id": "w1", "pool": "p", "gpus": [1], "new": True}),
    ("LeaseRequest", {"free_gpus": [0], "gpu_free": [{"index": 0, "free": 0.5, "x": 1}]}),
    ("LeaseRequest", {"free_gpus": [-1], "cpu_free": 3}),
    ("LeaseRequest", {"free_gpus": [], "gpu_free": [{"index": 0, "free": 1.5}]}),
    ("Heartbeat", {"running": [], "cannot_work": "disk full"}),
    ("Heartbeat", {"running": [{"task": "t", "epoch": 1, "checkpoint_at": "x" * 65}]}),
    ("Heartbeat", {"running": [{"task": "t"}]}),
    ("TaskReport", {"epoch": 1, "event": "finished", "outputs": {"A": "1"}}),
    ("TaskReport", {"epoch": 1, "event": "finished", "outputs": {"1A": "1"}}),
    ("TaskReport", {"epoch": 0, "event": "exploded"}),
    ("WorkerReports", {"reports": []}),
    ("WorkerReports", {"reports": [{"task": "t", "epoch": 1, "event": "lost", "x": 1}]}),
    ("WorkerReports", {"reports": [{"task": "", "epoch": 1, "event": "lost"}], "x": 1}),
    ("CloudNodeStart", {**EXAMPLES["CloudNodeStart"], "node": "-bad"}),
    ("CloudNodeStart", {**EXAMPLES["CloudNodeStart"], "lifecycle": "reserved"}),
    ("ScalingReport", {"cause": None}),
    ("ScalingReport", {"waiting": 1}),
    ("AutoscalerHeartbeat", {"interval_s": 3601}),
    ("AutoscalerHeartbeat", {"interval_s": True}),
]


@pytest.mark.parametrize("name,body", CORPUS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CORPUS)])
def test_same_answer_on_the_corpus(name: str, body: Any) -> None:
    _agree(name, body)


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-2, 2, allow_nan=False),
    st.text(max_size=3),
)
ANY = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


def _around(lo: int | None, hi: int | None) -> st.SearchStrategy[int]:
    """A length near a bound: each bound, one past it, and small ones (bounds above 300
    are met by their value alone, not by drawing each length up to them)."""
    near = {0, 1, 2}
    for b in (lo, hi):
        if b is not None and b <= 300:
            near |= {max(b - 1, 0), b, b + 1}
    return st.sampled_from(sorted(near))


def _string(s: dict[str, Any]) -> st.SearchStrategy[str]:
    hi = s.get("maxLength")
    long = [] if hi is None else ["x" * hi, "x" * (hi + 1)]
    return _around(s.get("minLength"), hi).flatmap(
        lambda n: st.text(st.sampled_from("aZ0_-.: /"), min_size=n, max_size=n)
    ) | st.sampled_from(long or [""])


def _number(s: dict[str, Any], integer: bool) -> st.SearchStrategy[Any]:
    edges = [
        s[k] + d for k in ("minimum", "maximum", "exclusiveMinimum") if k in s for d in (-1, 0, 1)
    ]
    base = st.integers(-3, 2000) if integer else st.floats(-2, 2000, allow_nan=False)
    fractions = (
        st.sampled_from([0.5, 0.001, 0.0005, 1.0, 1e-4, 2.25]) if not integer else st.nothing()
    )
    return base | st.sampled_from(edges or [0]) | fractions


def near(s: Any, schemas: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values near schema ``s``: mostly shaped like it, at and just past its bounds, with
    now and then a key missing, a key it does not know, or any JSON value at all."""
    if s is True or s == {}:
        return ANY
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[1]
        return st.deferred(lambda: near(schemas[name], schemas))
    if "const" in s:
        return st.just(s["const"]) | SCALARS
    if "enum" in s:
        return st.sampled_from(s["enum"]) | st.text(max_size=3)
    if "oneOf" in s or "anyOf" in s:
        return st.one_of([near(b, schemas) for b in s.get("oneOf", s.get("anyOf"))])
    shaped = _shaped(s, schemas)
    return st.integers(0, 9).flatmap(lambda i: SCALARS if i == 0 else shaped)


def _shaped(s: dict[str, Any], schemas: dict[str, Any]) -> st.SearchStrategy[Any]:
    types = s.get("type")
    kinds = [types] if isinstance(types, str) else list(types or [])
    options: list[st.SearchStrategy[Any]] = []
    for kind in kinds:
        if kind == "null":
            options.append(st.none())
        elif kind == "string":
            options.append(_string(s))
        elif kind in ("integer", "number"):
            options.append(_number(s, kind == "integer"))
        elif kind == "boolean":
            options.append(st.booleans())
        elif kind == "array":
            options.append(_array(s, schemas))
        elif kind == "object":
            options.append(_object(s, schemas))
    return st.one_of(options) if options else SCALARS


def _array(s: dict[str, Any], schemas: dict[str, Any]) -> st.SearchStrategy[list[Any]]:
    item = near(s.get("items", True), schemas)
    return _around(s.get("minItems"), s.get("maxItems")).flatmap(
        lambda n: st.lists(item, min_size=n, max_size=n)
    )


def _object(s: dict[str, Any], schemas: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    props = s.get("properties", {})
    if not props:
        value = near(s.get("additionalProperties", True), schemas)
        keys = st.text(st.sampled_from("aZ_1-"), max_size=4) | _string(s.get("propertyNames", {}))
        return _around(None, s.get("maxProperties")).flatmap(
            lambda n: st.dictionaries(keys, value, min_size=n, max_size=n)
        )
    required = set(s.get("required", []))
    fields = {k: near(v, schemas) for k, v in props.items()}
    whole = st.fixed_dictionaries(
        {k: v for k, v in fields.items() if k in required},
        optional={
            **{k: v for k, v in fields.items() if k not in required},
            "unknown": SCALARS,
        },
    )
    return whole | whole.flatmap(
        lambda d: st.sampled_from(sorted(d) or [""]).map(
            lambda k: {x: y for x, y in d.items() if x != k}
        )
    )


@pytest.mark.parametrize("name", NAMES)
def test_same_answer_on_values_near_the_old_schema(name: str) -> None:
    @settings(
        max_examples=examples(150),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(near(BEFORE[name], BEFORE))
    def check(body: Any) -> None:
        _agree(name, body)

    check()
