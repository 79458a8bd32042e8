"""Issue 25, item 2: a few kilobytes of YAML must not freeze or crash the daemon.

Aliases of aliases expand a 4 KB pipeline to hundreds of thousands of values; before, that
was parsed on the event loop (10-18 s with no answer to anyone) and refused with every
value's error (25 MB). Deep nesting crashed the process in libyaml's composer. A valid
pipeline full of aliases was parsed three times per run of its schedule. Each is checked
here on the real thing: a ``kliqued serve``, the estate compiler, the schedule loop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from compiler.api import SourceFile, compile_files
from kliqued.daemon.state import pipeline_cache
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.replay import rebuild
from kliqued.schedule import pipeline as P
from tests.channels.test_schedule_loop import MIN, T0, Harness
from tests.conftest import require_shared
from tests.harness.daemon import ROOT, Server

SMALL_REPLY = 8 * 1024


def wide_pipeline(args: int = 1800, steps: int = 200) -> str:
    """~4 KB: one step (its command an alias) aliased 200 times, each of its 1,800 command
    values wrong (numbers): 360,000 values and as many errors once expanded."""
    return (
        "pipeline: lol\n"
        f"c: &c [{','.join(['1'] * args)}]\n"
        "s: &s {name: s, resource: team-a/one, command: *c}\n"
        f"steps: [{','.join(['*s'] * steps)}]\n"
    )


def deep_pipeline(levels: int = 50_000) -> str:
    """100 KB of nested sequences: libyaml's composer recursed in C and crashed the process."""
    return "pipeline: deep\nsteps:\n  - name: s\n    resource: team-a/one\n    command: " + (
        "[" * levels + "]" * levels + "\n"
    )


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):
    require_shared()
    s = Server(tmp_path_factory.mktemp("yaml-bounds")).start()
    s.alice = s.token({"user": "alice"})  # type: ignore[attr-defined]
    yield s
    code = s.stop()
    assert code == 0, s.log()


def _post(srv: Server, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        srv.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {srv.alice}"},
    )  # type: ignore[attr-defined]
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _refused_while_responsive(srv: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POSTs ``body`` and, while it is in flight, asks GET /v1/health again and again: the
    slowest answer is the event loop's lag (one request's parse must not stall it)."""
    out: dict[str, Any] = {}

    def post() -> None:
        out["status"], out["raw"] = _post(srv, path, body)

    t = threading.Thread(target=post)
    t.start()
    lags = []
    while t.is_alive():
        t0 = time.monotonic()
        srv.call("GET", "/v1/health", token=None, timeout=120)
        lags.append(time.monotonic() - t0)
        time.sleep(0.02)
    t.join()
    out["lag"] = max(lags, default=0.0)
    return out


@pytest.mark.parametrize("path", ["/v1/pipelines", "/v1/schedules"])
def test_an_alias_bomb_pipeline_is_refused_quickly_in_a_few_lines(srv: Server, path: str) -> None:
    text = wide_pipeline()
    assert len(text) < 4500
    pipe = {"file": "bomb.yaml", "text": text}
    body = pipe if path == "/v1/pipelines" else {"cron": "0 2 * * *", "pipeline": pipe}
    out = _refused_while_responsive(srv, path, body)
    assert out["status"] == 422, out["raw"][:500]
    assert len(out["raw"]) < SMALL_REPLY, f"a {len(out['raw'])}-byte refusal"
    err = json.loads(out["raw"])["error"]
    assert "through aliases" in err["message"] and "alias limit" in err["message"]
    assert err["message"].startswith("bomb.yaml:2:"), err["message"]  # the place: line 2
    assert out["lag"] < 2.0, f"the event loop stalled {out['lag']:.1f} s"


def test_a_deeply_nested_pipeline_is_refused_and_the_daemon_lives(srv: Server) -> None:
    status, raw = _post(srv, "/v1/pipelines", {"file": "deep.yaml", "text": deep_pipeline()})
    assert status == 422, raw[:500]
    assert len(raw) < SMALL_REPLY
    assert "nests deeper than" in json.loads(raw)["error"]["message"]
    assert srv.proc is not None and srv.proc.poll() is None, srv.log()[-2000:]
    assert srv.ok("GET", "/v1/health", token=None)


def test_refusals_list_a_few_short_problems() -> None:
    """Without aliases too: 200 steps with an unknown field each are 20 lines and a count."""
    steps = "".join(
        f"  - {{name: s{i}, resource: team-a/one, command: [x], bad: 1}}\n" for i in range(200)
    )
    with pytest.raises(P.PipelineError) as exc:
        P.load("p.yaml", "pipeline: many\nsteps:\n" + steps)
    assert len(exc.value.errors) == P.MAX_ERRORS + 1
    assert exc.value.errors[-1] == "… and 180 more problems"
    assert all(len(e) <= P.MAX_ERROR_CHARS for e in exc.value.errors)


def wide_estate(args: int = 1800, items: int = 200) -> bytes:
    """The estate's version of the bomb: one profile (its pools an alias) aliased 200 times."""
    return (
        "pools: &ints [" + ",".join(["1"] * args) + "]\n"
        "profiles: [&p {name: x, gpus: 1, pools: *ints, policies: [t]}"
        + ",*p" * (items - 1)
        + "]\n"
    ).encode()


def test_an_alias_bomb_estate_is_refused_by_the_loader_quickly() -> None:
    require_shared()
    data = wide_estate()
    assert len(data) < 4500
    t0 = time.process_time()
    result = compile_files([SourceFile("bomb.yaml", data)])
    spent = time.process_time() - t0
    assert [d.code for d in result.diagnostics] == ["yaml-alias-limit"]
    d = result.diagnostics[0]
    assert d.pos is not None and d.pos.file == "bomb.yaml" and d.pos.line == 1
    assert len(d.render()) < 1000
    assert spent < 2.0, f"{spent:.1f} s of CPU to refuse a 4 KB estate"


def test_a_deeply_nested_estate_does_not_crash_the_loader() -> None:
    """In a child process: before, libyaml's composer crashed it (SIGSEGV)."""
    require_shared()
    code = (
        "from compiler.loader import load_yaml\n"
        "r = load_yaml('d.yaml', b'pools: ' + b'[' * 60000 + b']' * 60000)\n"
        "print([d.code for d in r.diagnostics])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.strip() == "['yaml-depth-limit']"


def many_aliases(args: int = 1400, steps: int = 60) -> str:
    """A valid ~24 KB pipeline whose steps share one long argument list by an alias:
    84,000 values once expanded."""
    flags = "[" + ",".join(f"--option-{i:05d}" for i in range(args)) + "]"
    out = [
        "pipeline: shared\nsteps:\n",
        f"  - {{name: s00, resource: team-a/one, command: &args {flags}}}\n",
    ]
    out += [
        f"  - {{name: s{i:02d}, resource: team-a/one, command: *args}}\n" for i in range(1, steps)
    ]
    return "".join(out)


def test_a_schedules_pipeline_is_parsed_once_not_at_each_run(tmp_path: Path) -> None:
    require_shared()
    text = many_aliases()
    assert 20_000 < len(text) < 40_000
    loaded = P.load("p.yaml", text)  # valid, and big once expanded
    assert sum(len(s.command) for s in loaded.spec.steps) == 1400 * 60
    del loaded

    async def go() -> None:
        async with Harness(tmp_path) as h:
            before = pipeline_cache.count()
            sid = await h.create(
                resource=None,
                command=None,
                pipeline={"file": "p.yaml", "text": text, "params": {}, "name": "shared"},
            )
            assert pipeline_cache.count() - before == 1  # made: parsed once
            for n in range(1, 4):
                await h.at(T0 + 10 * MIN * n + 1000)
            runs = h.sched(sid).runs
            assert [r.outcome for r in runs] == ["submitted"] * 3, runs
            assert len(h.d.pipelines.running()) == 3
            assert pipeline_cache.count() - before == 1, "a run parsed the file again"
            d2 = Daemon()  # a restart: the schedule and its three runs, one parse
            mark = pipeline_cache.count()
            rebuild(d2, h.store)
            assert len(d2.pipelines.items) == 3
            assert pipeline_cache.count() - mark <= 1
            specs = {id(pr.loaded.spec) for pr in d2.pipelines.items.values()}
            assert len(specs) == 1  # the runs share one parsed form

    asyncio.run(go())
