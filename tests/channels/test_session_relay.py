"""The session relay carries large answers whole (issue 25, item 11): a real ``kliqued
serve``, a real ``klique-worker`` and a session app (tests/channels/relay_app.py) on the
worker's 127.0.0.1, reached through the session's URL by a real HTTP client. An answer of
many MiB (more than the old 16 MiB cap too) arrives byte for byte; an answer that breaks off
reaches the client as an error, never as a short body that looks whole; a WebSocket message
of several MiB is relayed exactly, and one too large for the tunnel closes its own socket
with 1009 while the tunnel serves on. Before the fix the worker read a body once
(``resp.content.read(n)``: what was buffered, about 64 KiB) and JupyterLab's bundle arrived
cut."""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest

from klique_util.tunnel import MAX_WS_MESSAGE
from tests.channels.test_sessions import PROFILES, fetch, reachable
from tests.daemon.fleet import ESTATE, PY, FleetServer, real_workers, running_fleet, write_estate
from tests.harness.wait import wait_for

APP = [PY, str(Path(__file__).with_name("relay_app.py"))]


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FleetServer]:
    estate = write_estate(tmp_path / "estate", {**ESTATE, "profiles.yaml": PROFILES})
    yield from running_fleet(tmp_path, users=("alice",), estate=estate, ttl="10s")


@pytest.fixture
def real(fs: FleetServer, tmp_path: Path) -> Iterator[Any]:
    yield from real_workers(fs, tmp_path)


@pytest.fixture
def url(fs: FleetServer, real: Any) -> Iterator[str]:
    """The URL of a running session of relay_app.py, answering through the control plane;
    the session is stopped after the test (its app ends with it)."""
    worker = real("w1")
    s = fs.ok(
        "POST",
        "/v1/sessions",
        {"resource": "team-a/one", "app": "jupyter", "command": APP},
        fs.alice,
        expect=201,
    )  # type: ignore[attr-defined]
    assert reachable(fs, fs.alice, s["id"], s["url"])["hello"] == "relay app"  # type: ignore[attr-defined]
    yield str(s["url"])
    fs.ok("POST", f"/v1/sessions/{s['id']}/stop", token=fs.alice)  # type: ignore[attr-defined]
    wait_for(lambda: fs.task(s["id"])["state"] == "ended", 60, "the session to end")
    # and its app with it: the worker drops a task's record once its process ended (a worker
    # stopped before that leaves the app running until the orphan watch ends it)
    wait_for(
        lambda: not list((worker.state_dir / "tasks").glob("*.json")),
        60,
        "the worker to end the session's app",
    )


def expected(mib: float, seed: int) -> bytes:
    """What relay_app.py's ``big`` answers (the same generator, the same seed)."""
    return random.Random(seed).randbytes(int(mib * 1024 * 1024))


def test_a_large_answer_arrives_whole_and_byte_exact(fs: FleetServer, url: str) -> None:
    for mib, seed in ((8, 1), (24, 2)):  # several MiB; and more than the old 16 MiB cap
        st, body, headers = fetch("GET", f"{url}big?mib={mib}&seed={seed}", fs.alice)  # type: ignore[attr-defined]
        assert st == 200, body[:300]
        want = expected(mib, seed)
        assert len(body) == len(want), (mib, len(body))
        assert hashlib.sha256(body).hexdigest() == hashlib.sha256(want).hexdigest()
        assert headers["Content-Type"] == "application/octet-stream"
    # several at once over the one tunnel, each whole (the frames interleave)

    async def many() -> list[bytes]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {fs.alice}"}) as http:  # type: ignore[attr-defined]

            async def one(seed: int) -> bytes:
                async with http.get(f"{url}big?mib=3&seed={seed}") as resp:
                    assert resp.status == 200
                    return await resp.read()

            return await asyncio.gather(*(one(seed) for seed in (10, 11, 12)))

    assert asyncio.run(many()) == [expected(3, seed) for seed in (10, 11, 12)]


def test_an_answer_that_breaks_off_is_an_error_not_a_short_body(fs: FleetServer, url: str) -> None:
    async def get_cut() -> str:
        async with aiohttp.ClientSession() as http:
            async with http.get(
                url + "cut", headers={"Authorization": f"Bearer {fs.alice}"}
            ) as resp:  # type: ignore[attr-defined]
                assert resp.status == 200  # the head was on its way before the break
                try:
                    body = await resp.read()
                except aiohttp.ClientPayloadError as exc:
                    return f"broken: {type(exc).__name__}"
                return f"read {len(body)} bytes as if whole"

    assert asyncio.run(get_cut()).startswith("broken"), "a cut answer looked whole"
    assert fs.log().count("the client's connection is cut") >= 1
    # the tunnel serves on
    st, body, _ = fetch("GET", f"{url}big?mib=1&seed=3", fs.alice)  # type: ignore[attr-defined]
    assert st == 200 and body == expected(1, 3)


def test_large_websocket_messages_are_relayed_or_refused_alone(fs: FleetServer, url: str) -> None:
    big = expected(5, 4)
    too_big = MAX_WS_MESSAGE / (1024 * 1024) + 9  # MiB; base64'ed, more than a frame holds

    async def go() -> tuple[bytes, str, Any]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {fs.alice}"}) as http:  # type: ignore[attr-defined]
            async with http.ws_connect(url + "ws", max_msg_size=0) as sock:
                await sock.send_bytes(big)
                echoed = await sock.receive_bytes(timeout=60)
                text = "ü" * (2 * 1024 * 1024)  # escaped in the frames' JSON, exact back
                await sock.send_str(text)
                echoed_text = await sock.receive_str(timeout=60)
                assert echoed_text == text
            async with http.ws_connect(url + "ws", max_msg_size=0) as sock:
                await sock.send_str(f"send {too_big}")  # the app sends it
                closed = await sock.receive(timeout=60)
                return echoed, "ok", (closed.type, sock.close_code)

    echoed, _, (kind, code) = asyncio.run(go())
    assert echoed == big
    assert kind in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), kind
    assert code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG, code
    # the tunnel was not closed by it: the session answers at once, on the same tunnel
    st, body, _ = fetch("GET", f"{url}big?mib=1&seed=6", fs.alice)  # type: ignore[attr-defined]
    assert st == 200 and body == expected(1, 6)
    assert fs.log().count("tunnel from its worker open") == 1, fs.log()
