"""The standing hostile-input suite (issue 9): every operation of the OpenAPI document, with
every kind of principal's token, gets hostile input as raw bytes over real HTTP to a real
``kliqued serve``; no answer may be a 5xx, and the daemon must answer health after each.

Hostile means: lone UTF-16 surrogates written as JSON escapes (``"\\ud800"``), NUL and other
control characters, raw non-UTF-8 bytes in the path, query and headers, NaN and Infinity
literals, numbers beyond a double or 64 bits, huge strings, and nesting hundreds deep; mixed
into otherwise plausible requests (the document's examples), so that they reach the
handlers and not only the first check.

Bounded for a 2-core CI: one daemon for the module, ``EXAMPLES`` per operation.
"""

from __future__ import annotations

import json
import random
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kliqued.daemon.api.openapi import document
from tests.harness.daemon import EXAMPLE_ESTATE, Server
from tests.harness.inproc import InProcServer
from tests.harness.examples import examples

from .edge_client import alive, send

EXAMPLES = examples(50)
"""Hypothesis examples per operation (x 30 operations, 2 requests each): ~15 s here."""


class Raw(str):
    """JSON text written into the body as is (what no JSON encoder would produce)."""


RAW_LEAVES = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "1" + "0" * 400,
    "1e-400",
    "-0",
    "99999999999999999999999",
    '"\\ud800"',
    '"a\\udfff"',
    '"\\udc80\\ud800"',
    '"\\ud83d"',
    '"\\u0000"',
    '"x\\u0000y"',
    '"\\u001b[2J"',
    '"\\u0085"',
    '"\\u202e"',
    '"\\t\\n\\r"',
    "[" * 980 + "]" * 980,
    '{"a":' * 400 + "1" + "}" * 400,
    '"' + "x" * 200_000 + '"',
    '""',
    "[]",
    "{}",
    "null",
    "true",
]
"""Values spliced into bodies verbatim."""

HOSTILE_TEXT = [
    "%00",
    "a%00b",
    "%ED%A0%80",
    "%FF%FE",
    "%C0%AF",
    "%0A%0D",
    "%1B%5B2J",
    "..%2F..%2Fetc",
    "NaN",
    "Infinity",
    "1e400",
    "-1",
    "99999999999999999999999999",
    "x" * 4000,
    "",
    "%E2%80%AE",
    "%F0%9F%98%80",
]
"""Path and query values, already percent-encoded as a client would send them."""

RAW_BYTES = [b"\xff", b"\xed\xa0\x80", b"a\x00b", b"\x1b[2J", b"\xc3\x28"]
"""Raw (not percent-encoded) bytes in the request target and headers."""

RAW_AUTH = [
    b"Bearer kq_\xff",
    b"Bearer \xed\xa0\x80",
    b"Bearer kq_a\x01",
    b"\xff",
    b"Bearer",
    b"Bearer kq_" + b"k" * 8100,
    b"Basic YTpi",
    b"Bearer kq_\x7f",
]
"""Authorization headers no token has."""


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    doc = document()
    return [
        (method.upper(), path, op)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
    ]


OPS = _operations()
SCHEMAS = document()["components"]["schemas"]


def _dump(v: Any) -> str:
    """JSON text of ``v`` with ``Raw`` parts spliced in verbatim."""
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, dict):
        return (
            "{"
            + ",".join(
                f"{_dump(k) if isinstance(k, Raw) else json.dumps(k)}:{_dump(x)}"
                for k, x in v.items()
            )
            + "}"
        )
    if isinstance(v, list):
        return "[" + ",".join(_dump(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


leaf = st.one_of(
    st.sampled_from(RAW_LEAVES).map(Raw),
    st.text(max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=8), st.sampled_from(RAW_LEAVES[9:18]).map(Raw)),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=8,
)


HOSTILE_STRINGS = [Raw(x) for x in RAW_LEAVES[9:18]]
HOSTILE_NUMBERS = [Raw(x) for x in RAW_LEAVES[:9]]


@st.composite
def mutated(draw: st.DrawFn, plausible: Any) -> Any:
    """``plausible`` with one hostile part of the same type (so that it passes the schema
    and reaches the handler, the sequencer and the log), or any hostile value."""
    if isinstance(plausible, str):
        return draw(st.sampled_from(HOSTILE_STRINGS))
    if isinstance(plausible, bool) or plausible is None:
        return draw(value)
    if isinstance(plausible, (int, float)):
        return draw(st.sampled_from(HOSTILE_NUMBERS))
    if isinstance(plausible, list) and plausible:
        out = list(plausible)
        i = draw(st.integers(0, len(out) - 1))
        out[i] = draw(mutated(out[i]))
        return out
    if isinstance(plausible, dict) and plausible:
        mapping = dict(plausible)
        k = draw(st.sampled_from(sorted(mapping)))
        if draw(st.booleans()):
            mapping[k] = draw(mutated(mapping[k]))
        else:
            mapping[draw(st.sampled_from(HOSTILE_STRINGS))] = mapping.pop(k)
        return mapping
    return draw(value)


EXTRA = {
    "command": ["python", "train.py"],
    "payload": {"a": ["b"]},
    "name": "laptop",
    "hostname": "gpu01",
    "labels": {"run": "r1"},
    "project": "rlhf",
    "gpu_free": [{"index": 0, "free": 0.5}],
    "message": "done",
    "signal": "SIGTERM",
    "reports": [{"task": "t-01M8K8MWK70000", "epoch": 1, "event": "finished"}],
}
"""Plausible values of fields the document's examples leave out."""


def _props(schema: dict[str, Any]) -> list[str]:
    """Property names a body schema (or its oneOf branches) knows."""
    if "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[1]]
    names = list(schema.get("properties", {}))
    for branch in schema.get("oneOf", []):
        names += [n for n in _props(branch) if n not in names]
    return names


@st.composite
def bodies(draw: st.DrawFn, op: dict[str, Any]) -> bytes | None:
    content = op.get("requestBody", {}).get("content", {})
    if "application/octet-stream" in content:
        return draw(st.binary(max_size=64)) + draw(st.sampled_from(RAW_BYTES))
    media = content.get("application/json")
    if media is None:
        return draw(st.sampled_from([None, b"", b'{"x":"\\ud800"}']))
    example = dict(media.get("example") or {})
    shape = draw(st.sampled_from(["mutated", "mutated", "mutated", "any", "raw"]))
    if shape == "raw":
        return draw(st.sampled_from(RAW_LEAVES)).encode()
    if shape == "any":
        return _dump(draw(value)).encode("utf-8", "surrogatepass")
    names = _props(media["schema"])
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        seed = example.get(name, EXTRA.get(name))
        example[name] = draw(mutated(seed)) if seed is not None else draw(value)
    if draw(st.booleans()):
        example[Raw('"\\ud800"')] = "x"
    return _dump(example).encode("utf-8", "surrogatepass")


@st.composite
def targets(draw: st.DrawFn, path: str, op: dict[str, Any], plausible: dict[str, str]) -> bytes:
    """The request target: path variables and query parameters, some hostile."""
    out = path.encode()
    query: list[bytes] = []
    for p in op.get("parameters", []):
        name = p["name"]
        if p["in"] == "path":
            choice = draw(st.sampled_from(["plausible", "text", "raw"]))
            if choice == "plausible":
                key = "worker" if path.startswith("/v1/workers") else name
                key = "token" if path.startswith("/v1/tokens") else key
                v = quote(plausible.get(key, "x"), safe="").encode()
            elif choice == "text":
                v = draw(st.sampled_from(HOSTILE_TEXT)).encode() or b"x"
            else:
                v = b"x" + draw(st.sampled_from(RAW_BYTES))
            out = out.replace(b"{" + name.encode() + b"}", v)
        elif p["in"] == "query":
            if name == "wait":
                query.append(b"wait=0")  # a long poll would hold the test, not the daemon
                continue
            choice = draw(st.sampled_from(["absent", "text", "raw"]))
            if choice == "text":
                query.append(name.encode() + b"=" + draw(st.sampled_from(HOSTILE_TEXT)).encode())
            elif choice == "raw":
                query.append(name.encode() + b"=" + draw(st.sampled_from(RAW_BYTES)))
    if draw(st.booleans()):
        query.append(draw(st.sampled_from([b"%00=1", b"%ED%A0%80=x", b"x=%ED%A0%80"])))
    return out + (b"?" + b"&".join(query) if query else b"")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    # The example estate: the document's examples (alice, llm-research/h100, the pool
    # onprem-baremetal) are valid there, so mutated examples reach deep.
    s = InProcServer(tmp_path_factory.mktemp("hostile"), estate=EXAMPLE_ESTATE).start()
    tokens: dict[str, str | None] = {
        "none": None,
        "admin": s.admin,
        "finance": s.token({"role": "finance"}),
        "alice": s.token({"user": "alice"}),
        "bob": s.token({"user": "bob"}),
        "worker": s.token({"worker": True, "pool": "onprem-baremetal"}),
    }
    revoked = s.ok("POST", "/v1/tokens", {"user": "carol"}, expect=201)
    s.ok("DELETE", f"/v1/tokens/{revoked['id']}", expect=204)
    tokens["revoked"] = revoked["token"]
    spare = s.ok("POST", "/v1/tokens", {"user": "carol", "name": "spare"}, expect=201)
    example = document()["paths"]["/v1/workers/register"]["post"]["requestBody"]
    reg = example["content"]["application/json"]["example"]
    s.worker_key = secrets.token_urlsafe(32)  # type: ignore[attr-defined]
    s.ok(
        "POST",
        "/v1/workers/register",
        reg,
        token=tokens["worker"],
        headers={"X-Klique-Worker-Key": s.worker_key},  # type: ignore[attr-defined]
    )
    task = s.ok(
        "POST",
        "/v1/tasks",
        {"resource": "llm-research/h100", "command": ["true"], "project": "evals"},
        token=tokens["alice"],
        expect=201,
    )
    s.tokens = tokens  # type: ignore[assignment]  # None: the request without a token
    s.plausible = {  # type: ignore[attr-defined]
        "id": task["id"],
        "worker": reg["worker_id"],
        "token": spare["id"],
        "policy": "llm-research",
        "profile": "h100",
        "name": "llm-research",
    }
    yield s
    code = s.stop()
    assert code == 0, s.log()


def test_the_suite_covers_every_operation_the_daemon_serves(srv: Server) -> None:
    status, doc = send(srv, "GET", "/v1/openapi.json")
    assert status == 200
    served = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert served == {(m, p) for m, p, _ in OPS}


@pytest.mark.parametrize("method,path,op", OPS, ids=[f"{m} {p}" for m, p, _ in OPS])
def test_hostile_input_never_gets_a_5xx_nor_stops_the_daemon(
    srv: Server, method: str, path: str, op: dict
) -> None:
    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        who=st.sampled_from(sorted(srv.tokens)),
        body=bodies(op),  # type: ignore
        target=targets(path, op, srv.plausible),  # type: ignore[attr-defined]
        key=st.one_of(st.none(), st.sampled_from(RAW_BYTES)),
        auth=st.one_of(st.none(), st.none(), st.sampled_from(RAW_AUTH)),
    )
    def check(
        who: str, body: bytes | None, target: bytes, key: bytes | None, auth: bytes | None
    ) -> None:
        headers: dict[str, bytes | str] = {}
        if key is not None:
            headers["Idempotency-Key"] = key
        token: str | None = srv.tokens[who]
        if who == "worker":  # the registered worker's key: its calls reach the handlers
            headers["X-Klique-Worker-Key"] = srv.worker_key  # type: ignore[attr-defined]
        if auth is not None:
            headers["Authorization"], token, who = auth, None, f"raw {auth[:20]!r}"
        status, data = send(srv, method, target, body, token, headers=headers, timeout=20)
        shown = (body or b"")[:300]
        assert status < 500, (
            f"{method} {target[:200]!r} as {who}: {status} {data!r:.500}\n"
            f"body {shown!r}\nlog tail:\n{srv.log()[-2000:]}"
        )
        assert alive(srv), f"{method} {target[:200]!r} as {who} stopped it:\n{srv.log()}"

    check()


def test_the_daemon_is_alive_and_logged_no_fatal_error(srv: Server) -> None:
    assert alive(srv)
    log = srv.log()
    assert "cannot write the event log" not in log
    errors = [line for line in log.splitlines() if " kliqued ERROR " in line]
    assert not errors, errors[:5]


if __name__ == "__main__":
    random.seed(0)
    pytest.main([__file__, "-q", str(Path(__file__))])
