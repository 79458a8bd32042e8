"""The demand export and the what-if against a real daemon with a real worker (issue 16):
``GET /v1/demand`` through the SDK and ``kliqued demand export``, ``kliqued plan
--what-if-from URL``, and the stale-base warning of ``--against`` and ``--what-if-from``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from klique_util.demand import COLUMNS
from kliqued.cli import main
from kliqued.sdk import Client, KliqueError
from tests.daemon.fleet import FleetServer, real_workers, write_estate
from tests.harness.wait import wait_for
from tests.plan.helpers import commit_all, git, init_repo, run_plan


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FleetServer, Path, str, Any]]:
    """A daemon following nothing (--no-watch) on the fleet estate of a git repository's
    main, a real klique-worker on pool ``bare`` (2 GPUs), and a planner token."""
    repo = init_repo(tmp_path / "repo")
    write_estate(repo / "estate")
    commit_all(repo, "the estate")
    s = FleetServer(tmp_path, estate=repo / "estate", extra=["--no-watch"]).start()
    s.wt = s.token({"worker": True, "pool": "bare"})  # type: ignore[attr-defined]
    planner = s.token({"role": "planner", "name": "ci"})
    workers = real_workers(s, tmp_path)
    make = next(workers)
    yield s, repo, planner, make
    next(workers, None)
    s.stop()


def _rows(text: str) -> dict[str, dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames or ()) == COLUMNS
    return {r["id"]: r for r in reader}


def test_the_demand_of_a_window_is_a_trace(served, tmp_path, capsys) -> None:
    s, repo, planner, make = served
    make()
    alice, erin = s.token({"user": "alice"}), s.token({"user": "erin"})
    done = [s.submit(alice, "team-a/one", ["sleep", "0.4"]) for _ in range(2)]
    failed = s.submit(erin, "team-b/one", ["false"])
    wait_for(
        lambda: all(s.task(t)["state"] == "ended" for t in [*done, failed]),
        30,
        "the short tasks ended",
    )
    running = [s.submit(erin, "team-b/one", ["sleep", "60"]) for _ in range(2)]
    # "running" once its worker started it, which a fast worker does at once.
    wait_for(
        lambda: all(s.task(t)["state"] in ("placed", "running") for t in running), 30, "placed"
    )
    queued = s.submit(erin, "team-b/one", ["sleep", "60"])  # team-b's limit is 2
    s.ok("POST", f"/v1/tasks/{queued}/cancel", {"reason": "not needed"}, erin)

    d = Client(s.url, planner).demand("1h")
    assert d.revision == s.ok("GET", "/v1/estate")["revision"]
    rows = _rows(d.text)
    assert list(rows) == [*done, failed, *running, queued]  # in submission order
    for t in done:
        r = rows[t]
        assert (r["resource"], r["user"], r["channel"], r["status"]) == (
            "team-a/one",
            "alice",
            "api",
            "finished",
        )
        assert 0.4 <= float(r["runtime"]) < 30, r
        assert r["submit"].endswith("Z")
    assert rows[failed]["status"] == "failed"
    assert {rows[t]["status"] for t in running} == {"running"}
    assert rows[queued]["status"] == "cancelled" and rows[queued]["runtime"] == "0"

    # The CLI writes the same file; kliqued simulate --trace replays it as it is.
    out = tmp_path / "demand.csv"
    assert (
        main(
            [
                "demand",
                "export",
                "--since",
                "1h",
                "-o",
                str(out),
                "--url",
                s.url,
                "--token",
                planner,
            ]
        )
        == 0
    )
    assert list(_rows(out.read_text())) == list(rows)
    capsys.readouterr()
    assert main(["simulate", "--estate", str(repo / "estate"), "--trace", str(out)]) == 0

    # Who may: admins and planners; a user is told which roles may.
    with pytest.raises(KliqueError) as refused:
        Client(s.url, erin).demand()
    assert refused.value.status == 403 and "planner" in refused.value.message
    with pytest.raises(KliqueError) as bad:
        Client(s.url, planner).demand("yesterday")
    assert bad.value.status == 400 and "since" in bad.value.message
    assert (
        main(["demand", "export", "--since", "yesterday", "--url", s.url, "--token", planner]) == 1
    )
    assert "since: expected a duration" in capsys.readouterr().err

    # The what-if reads the same demand from the daemon.
    code, text, err = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--what-if-from",
        s.url,
        "--since",
        "1h",
        "--token",
        planner,
        "--format",
        "json",
    )
    plan = json.loads(text)
    assert plan["whatif"]["tasks"] == len(rows) and plan["whatif"]["skipped"] == 1, err
    assert plan["drift"] is False and plan["running"]["revision"] == d.revision


def _stale(s: FleetServer, repo: Path) -> None:
    """main moves on (team-b's limit raised) while the daemon keeps what it runs."""
    path = repo / "estate" / "policies.yaml"
    path.write_text(
        path.read_text().replace("reservation: 0\n    limit: 2", "reservation: 0\n    limit: 1")
    )
    commit_all(repo, "team-b: limit 1")
    git(repo, "checkout", "-q", "-b", "change")


def test_a_base_that_is_not_the_running_revision_is_a_stale_plan(served, capsys) -> None:
    s, repo, planner, _ = served
    running = s.ok("GET", "/v1/estate")["revision"]
    code, text, _ = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--against",
        s.url,
        "--token",
        planner,
        "--format",
        "json",
    )
    assert json.loads(text)["drift"] is False  # main is what runs: no warning
    assert "stale-base" not in text
    _stale(s, repo)
    for flags in (["--against", s.url], ["--what-if-from", s.url]):
        code, text, err = run_plan(
            capsys,
            "--repo",
            str(repo),
            "--base",
            "main",
            *flags,
            "--token",
            planner,
            "--format",
            "json",
        )
        plan = json.loads(text)
        assert plan["drift"] is True, (flags, err)
        stale = [i for i in plan["impacts"] if i["kind"] == "stale-base"]
        assert len(stale) == 1 and stale[0]["severity"] == "warn", plan["impacts"]
        assert stale[0]["details"]["running_revision"] == running
        assert stale[0]["details"]["base_revision"] == plan["base"]["estate_revision"]
        assert f"The daemon at {s.url} runs revision {running[:19]}" in stale[0]["message"]
    # Every format says so, also a plan without changes (the head is the base).
    code, out, _ = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--against", s.url, "--token", planner
    )
    assert code == 0 and "not the base" in out and "No changes." in out
    code, out, _ = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--against",
        s.url,
        "--token",
        planner,
        "--format",
        "markdown",
    )
    assert "not the base" in out
    code, out, _ = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--against",
        s.url,
        "--token",
        planner,
        "--format",
        "github",
    )
    assert "::warning title=klique plan%3A stale-base::" in out
