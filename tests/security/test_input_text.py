"""Finding 1 (issue 9), at the edge: text the event log cannot hold, or that no name should
carry, is refused with a 400 naming the field; the daemon stays up.

And finding 12 (non-finite numbers, deep nesting) and the API part of finding 15 (a task
with neither command nor payload)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kliqued.daemon.errors import ApiError
from kliqued.daemon.api.inputs import check_tree
from tests.harness.daemon import Server
from tests.harness.inproc import InProcServer

from .edge_client import alive, send
from tests.harness.examples import examples


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    s = InProcServer(tmp_path_factory.mktemp("edge-text")).start()
    s.alice = s.token({"user": "alice"})  # type: ignore[attr-defined]
    s.worker = s.token({"worker": True, "pool": "pool-1"})  # type: ignore[attr-defined]
    yield s
    code = s.stop()
    assert code == 0, s.log()


def _task(extra: str) -> bytes:
    return ('{"resource":"team-a/sized",' + extra + "}").encode()


def _refused(srv: Server, status: int, data: object, pointer: str) -> None:
    assert status == 400, (status, data)
    assert isinstance(data, dict)
    assert data["error"]["message"].startswith(pointer), data
    assert alive(srv)


SURROGATE_BODIES = [
    ('"command":["echo","\\ud800"]', "/command/1"),
    ('"command":["echo"],"labels":{"run":"\\udfff"}', "/labels/run"),
    ('"command":["echo"],"labels":{"\\ud800":"x"}', "/labels/\\ud800"),
    ('"command":["echo"],"payload":{"a":["\\udc00"]}', "/payload/a/0"),
    ('"command":["echo"],"project":"\\ud83d"', "/project"),
]


@pytest.mark.parametrize("extra,pointer", SURROGATE_BODIES)
def test_lone_surrogate_in_a_task_is_a_400_naming_the_field(
    srv: Server, extra: str, pointer: str
) -> None:
    status, data = send(srv, "POST", "/v1/tasks", _task(extra), srv.alice)
    _refused(srv, status, data, pointer)


def test_a_paired_surrogate_escape_is_ordinary_text(srv: Server) -> None:
    status, data = send(
        srv, "POST", "/v1/tasks", _task('"command":["echo","\\ud83d\\ude00"]'), srv.alice
    )
    assert status == 201, data
    assert data["command"] == ["echo", "\U0001f600"]


def test_worker_hostname_and_token_name_with_a_surrogate(srv: Server) -> None:
    body = b'{"worker_id":"w-1","pool":"pool-1","hostname":"h\\ud800"}'
    status, data = send(srv, "POST", "/v1/workers/register", body, srv.worker)
    _refused(srv, status, data, "/hostname")
    status, data = send(srv, "POST", "/v1/tokens", b'{"user":"bob","name":"\\ud800"}', srv.admin)
    _refused(srv, status, data, "/name")


def test_raw_non_utf8_idempotency_key_is_a_400(srv: Server) -> None:
    status, data = send(
        srv,
        "POST",
        "/v1/tasks",
        _task('"command":["echo"]'),
        srv.alice,
        headers={"Idempotency-Key": b"k\xff\xfe"},
    )
    assert status == 400 and "Idempotency-Key" in data["error"]["message"], data
    assert alive(srv)


def test_raw_surrogate_bytes_in_a_body_are_not_utf8(srv: Server) -> None:
    body = b'{"resource":"team-a/sized","command":["echo","\xed\xa0\x80"]}'
    status, data = send(srv, "POST", "/v1/tasks", body, srv.alice)
    assert status == 400 and data["error"]["code"] == "invalid-json", data
    assert alive(srv)


def test_nul_and_controls_in_names_are_refused(srv: Server) -> None:
    for extra, pointer in [
        ('"command":["echo"],"labels":{"a":"b\\u0000"}', "/labels/a"),
        ('"command":["echo"],"project":"p1\\u001b[2J"', "/project"),
        ('"command":["echo\\u0000"]', "/command/0"),
    ]:
        status, data = send(srv, "POST", "/v1/tasks", _task(extra), srv.alice)
        _refused(srv, status, data, pointer)


def test_commands_and_payloads_may_hold_tabs_newlines_and_payload_nul(srv: Server) -> None:
    status, data = send(
        srv,
        "POST",
        "/v1/tasks",
        _task('"command":["sh","-c","echo a\\tb\\necho c"],"payload":{"k":"\\u0000"}'),
        srv.alice,
    )
    assert status == 201, data
    assert data["command"][2] == "echo a\tb\necho c" and data["payload"] == {"k": "\x00"}


def test_query_and_path_with_bad_text(srv: Server) -> None:
    status, data = send(srv, "GET", "/v1/tasks?user=a%00b", token=srv.alice)
    assert status == 400 and "query parameter user" in data["error"]["message"], data
    for target in (
        b"/v1/events?kind=%ED%A0%80",
        b"/v1/events?kind=\xed\xa0\x80",
        b"/v1/tasks/t-\xff",
    ):
        status, data = send(srv, "GET", target, token=srv.admin)
        assert status in (200, 400, 404), (target, status, data)
    status, data = send(srv, "GET", "/v1/tasks/t-%00", token=srv.alice)
    assert status == 400 and "path" in data["error"]["message"], data
    assert alive(srv)


# ---------------------------------------------------------------- finding 12


@pytest.mark.parametrize("gpus", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_gpus_is_a_400_naming_gpus(srv: Server, gpus: str) -> None:
    status, data = send(
        srv, "POST", "/v1/tasks", _task(f'"command":["x"],"gpus":{gpus}'), srv.alice
    )
    _refused(srv, status, data, "/gpus")


def test_nan_gpu_free_in_a_lease_request_is_a_400(srv: Server) -> None:
    key = {"X-Klique-Worker-Key": "n" * 43}  # the worker's proof of identity
    send(
        srv,
        "POST",
        "/v1/workers/register",
        b'{"worker_id":"w-nan","pool":"pool-1"}',
        srv.worker,
        headers=key,
    )
    status, data = send(
        srv,
        "POST",
        "/v1/workers/w-nan/lease?wait=0",
        b'{"free_gpus":[],"gpu_free":[{"index":0,"free":NaN}]}',
        srv.worker,
        headers=key,
    )
    _refused(srv, status, data, "/gpu_free/0/free")


def test_huge_integers_are_a_400(srv: Server) -> None:
    status, data = send(
        srv,
        "POST",
        "/v1/workers/register",
        b'{"worker_id":"w-big","pool":"pool-1","gpus":[{"index":' + b"9" * 30 + b"}]}",
        srv.worker,
    )
    _refused(srv, status, data, "/gpus/0/index")


@pytest.mark.parametrize("depth", [40, 980, 100_000])
def test_deep_nesting_is_a_400(srv: Server, depth: int) -> None:
    payload = "[" * depth + "]" * depth
    status, data = send(
        srv, "POST", "/v1/tasks", _task(f'"command":["x"],"payload":{payload}'), srv.alice
    )
    assert status == 400 and "nested deeper" in data["error"]["message"], data
    assert alive(srv)


# ---------------------------------------------------------------- finding 15, API part


@pytest.mark.parametrize(
    "extra", ["", '"command":null', '"command":[]', '"command":null,"payload":null']
)
def test_a_task_with_neither_command_nor_payload_is_a_422(srv: Server, extra: str) -> None:
    body = _task(extra) if extra else b'{"resource":"team-a/sized"}'
    status, data = send(srv, "POST", "/v1/tasks", body, srv.alice)
    assert status == 422, data
    msg = data["error"]["message"]
    assert "command" in msg and "payload" in msg, msg


def test_a_payload_alone_is_a_task(srv: Server) -> None:
    status, data = send(srv, "POST", "/v1/tasks", _task('"payload":{"notebook":"a"}'), srv.alice)
    assert status == 201, data
    assert json.dumps(data["payload"]) == '{"notebook": "a"}'


def test_the_daemon_survived_the_module(srv: Server) -> None:
    assert alive(srv)
    assert "cannot write the event log" not in srv.log()


if __name__ == "__main__":
    pytest.main([__file__, "-q", "-x", str(Path(__file__))])


# ---------------------------------------------------------------- the edge's promise

any_char = st.integers(0, 0x10FFFF).map(chr)  # surrogates included
any_text = st.lists(any_char, max_size=6).map("".join)
any_json = st.recursive(
    st.one_of(any_text, st.integers(-(2**70), 2**70), st.floats(), st.booleans(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(any_text, inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=examples(300), deadline=None)
@given(body=any_json, schema=st.sampled_from([None, "TaskSubmission", "TaskReport"]))
def test_what_the_edge_accepts_the_event_log_can_store(body: object, schema: str) -> None:
    """Either a 400, or text DuckDB and every client can hold (UTF-8 encodable, finite)."""
    try:
        check_tree(body, schema)
    except ApiError as exc:
        assert exc.status == 400 and exc.message
        exc.message.encode("utf-8")  # the refusal itself never echoes a surrogate
        return
    json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")


@pytest.mark.parametrize("header", [b"Bearer kq_\xff", b"Bearer \xed\xa0\x80"])
def test_an_authorization_header_no_token_has_is_a_401(srv: Server, header: bytes) -> None:
    status, data = send(srv, "GET", "/v1/whoami", headers={"Authorization": header})
    assert status == 401 and data["error"]["code"] == "unauthenticated", data
    status, _ = send(srv, "GET", "/v1/health", headers={"Authorization": header})
    assert status == 200
