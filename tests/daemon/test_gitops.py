"""GitOps reload on a real ``kliqued serve``: a watched estate directory, and a git branch
polled (local, and through a remote): each valid new revision is applied between passes and
the placements after it carry it; an invalid one is refused (GET /v1/estate ``refused``,
the event log, the daemon's log) while the last good revision keeps running; the next valid
one is applied."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from .fleet import ESTATE, FleetServer, write_estate
from tests.harness.typed import present
from tests.harness.wait import wait_for

ACTOR = git.Actor("IT", "it@example.com")
BROKEN = "pools:\n  - name: bare\n    kind: baremetal\n    capacity: lots\n"


def bigger(files: dict[str, str], capacity: int) -> dict[str, str]:
    return {
        **files,
        "pools.yaml": files["pools.yaml"].replace(
            "capacity: 2\n    gpu_type: l40s-48gb\n  - name: other",
            f"capacity: {capacity}\n    gpu_type: l40s-48gb\n  - name: other",
            1,
        ),
    }


def commit(repo: git.Repo, files: dict[str, str], message: str) -> str:
    root = Path(repo.working_tree_dir) / "estate"  # type: ignore[arg-type]
    write_estate(root, files)
    repo.index.add([str(root / name) for name in files])
    return repo.index.commit(message, author=ACTOR, committer=ACTOR).hexsha


def estate(s: FleetServer) -> dict:
    return s.ok("GET", "/v1/estate")


def placed_revision(s: FleetServer, token: str) -> tuple[str, str]:
    tid = s.submit(token, "team-b/one", ["true"])
    ev = wait_for(lambda: s.events(tid, "placed"), 5, "placed")
    s.ok("POST", f"/v1/tasks/{tid}/cancel")
    return tid, ev[0]["revision"]


@pytest.fixture
def stop_after():
    started: list[FleetServer] = []
    yield started.append
    for s in started:
        log = s.log()
        assert s.stop() == 0, log
        assert "Traceback" not in log, log


def test_a_watched_directory_is_followed(tmp_path, stop_after) -> None:
    root = write_estate(tmp_path / "estate")
    s = FleetServer(tmp_path, estate=root, workers=False).start()  # no worker in these tests
    stop_after(s)
    erin = s.token({"user": "erin"})
    first = estate(s)
    assert first["refused"] is None and first["source"] == str(root)
    running = s.submit(erin, "team-b/one", ["sleep", "100"])
    wait_for(lambda: s.task(running)["state"] == "placed")
    (root / "pools.yaml").write_text(bigger(ESTATE, 3)["pools.yaml"])
    second = wait_for(
        lambda: estate(s)["revision"] != first["revision"] and estate(s), 10, "the change applied"
    )
    assert [p["capacity"] for p in s.ok("GET", "/v1/pools")["pools"] if p["name"] == "bare"] == [3]
    assert placed_revision(s, erin)[1] == second["revision"]
    # An invalid change is refused; the running revision and its work stay.
    (root / "pools.yaml").write_text(BROKEN)
    refused = wait_for(lambda: estate(s)["refused"], 10, "the refusal")
    assert refused["revision"] is None and refused["source"] == str(root)
    assert any("capacity" in e and "pools.yaml" in e for e in refused["errors"]), refused
    assert estate(s)["revision"] == second["revision"]
    assert s.task(running)["state"] == "placed"
    assert placed_revision(s, erin)[1] == second["revision"]
    assert s.events(kind="estate_refused")[-1]["data"]["errors"] == refused["errors"]
    assert "estate refused" in s.log()
    # The next valid one is applied, and the refusal is cleared.
    (root / "pools.yaml").write_text(bigger(ESTATE, 4)["pools.yaml"])
    third = wait_for(
        lambda: (
            estate(s)
            if estate(s)["revision"] not in (first["revision"], second["revision"])
            else None
        ),
        10,
        "the fix applied",
    )
    assert third["refused"] is None
    assert placed_revision(s, erin)[1] == third["revision"]
    # A restart rebuilds the same, from the log.
    assert s.stop() == 0
    s.start()
    assert estate(s)["revision"] == third["revision"]


def test_a_git_branch_is_followed_and_an_invalid_commit_refused(tmp_path, stop_after) -> None:
    repo = git.Repo.init(tmp_path / "repo", initial_branch="main")
    c1 = commit(repo, ESTATE, "the estate")
    s = FleetServer(
        tmp_path,
        extra=["--git", str(tmp_path / "repo"), "--branch", "main", "--poll", "0.2s"],
        workers=False,
    ).start()
    stop_after(s)
    erin = s.token({"user": "erin"})
    first = estate(s)
    assert first["commit"] == c1 and c1[:12] in first["source"]
    running = s.submit(erin, "team-b/one", ["sleep", "100"])
    wait_for(lambda: s.task(running)["state"] == "placed")
    bad = commit(repo, {**ESTATE, "pools.yaml": BROKEN}, "oops")
    refused = wait_for(lambda: estate(s)["refused"], 10, "the refusal")
    assert refused["commit"] == bad and refused["errors"]
    assert any(e.startswith("estate/pools.yaml:") for e in refused["errors"]), refused
    assert estate(s)["revision"] == first["revision"] and estate(s)["commit"] == c1
    assert s.task(running)["state"] == "placed"
    good = commit(repo, bigger(ESTATE, 3), "more GPUs")
    applied = wait_for(lambda: estate(s)["commit"] == good and estate(s), 10, "applied")
    assert applied["refused"] is None and applied["revision"] != first["revision"]
    _, rev = placed_revision(s, erin)
    assert rev == applied["revision"]
    kinds = [e["kind"] for e in s.events(kind="estate_applied")]
    assert len(kinds) == 2
    assert s.events(kind="estate_applied")[-1]["revision"] == applied["revision"]


def test_a_clone_follows_its_remote(tmp_path, stop_after) -> None:
    origin = git.Repo.init(tmp_path / "origin", initial_branch="main")
    commit(origin, ESTATE, "the estate")
    clone = git.Repo.clone_from(str(tmp_path / "origin"), tmp_path / "clone")
    s = FleetServer(
        tmp_path,
        extra=["--git", str(present(clone.working_tree_dir)), "--poll", "0.2s"],
        workers=False,
    ).start()  # no worker: every pool takes work
    stop_after(s)
    first = estate(s)
    merged = commit(origin, bigger(ESTATE, 5), "merged upstream")
    applied = wait_for(lambda: estate(s)["commit"] == merged and estate(s), 10, "fetched")
    assert applied["revision"] != first["revision"]
    assert clone.head.commit.hexsha != merged  # read from git objects, no checkout


def test_a_file_cut_off_mid_write_is_refused_visibly_then_its_fix_applied(
    tmp_path, stop_after
) -> None:
    """Issue 9, finding 8: a policy file truncated inside ``limit:`` (an editor caught
    mid-save) used to make the compiler raise in the daemon's follower, which logged it at
    debug level only: the revision was neither applied nor refused, and nothing said so."""
    root = write_estate(tmp_path / "estate")
    s = FleetServer(tmp_path, estate=root, workers=False).start()  # no worker in these tests
    stop_after(s)
    erin = s.token({"user": "erin"})
    first = estate(s)
    applied = len(s.events(kind="estate_applied"))
    running = s.submit(erin, "team-b/one", ["sleep", "100"])
    wait_for(lambda: s.task(running)["state"] == "placed")
    text = ESTATE["policies.yaml"]
    (root / "policies.yaml").write_text(text[: text.rindex("limit:") + 2])
    refused = wait_for(lambda: estate(s)["refused"], 10, "the refusal")
    assert refused["revision"] is None
    assert any(
        e.startswith(f"{root / 'policies.yaml'}:") and "yaml-syntax" in e for e in refused["errors"]
    ), refused
    assert s.events(kind="estate_refused")[-1]["data"]["errors"] == refused["errors"]
    assert "estate refused" in s.log() and "policies.yaml" in s.log()
    assert estate(s)["revision"] == first["revision"]
    assert s.task(running)["state"] == "placed"
    assert placed_revision(s, erin)[1] == first["revision"]
    # The editor finishes the save: the same revision as before runs, the refusal cleared.
    (root / "policies.yaml").write_text(text)
    wait_for(lambda: estate(s)["refused"] is None, 10, "the refusal cleared")
    assert estate(s)["revision"] == first["revision"]
    again = s.events(kind="estate_applied")
    assert len(again) == applied + 1 and again[-1]["revision"] == first["revision"]
    assert s.task(running)["state"] == "placed"


def test_a_backdated_price_is_applied_with_a_warning_that_it_reprices_usage(
    tmp_path, stop_after
) -> None:
    """Issue 10, bug 6: the ledger prices usage when it is read, so a price backdated into
    usage already recorded reprices it; the daemon applies it (a correction is legitimate)
    and says so in its log, as ``kliqued plan`` does in review."""
    root = write_estate(tmp_path / "estate")
    s = FleetServer(tmp_path, estate=root, workers=False).start()  # no worker in these tests
    stop_after(s)
    first = estate(s)
    (root / "pricing.yaml").write_text(
        ESTATE["pricing.yaml"].replace("per_gpu_hour: 1.0", "per_gpu_hour: 1.2")
    )
    wait_for(lambda: estate(s)["revision"] != first["revision"], 10, "the change applied")
    wait_for(
        lambda: (
            "reprices recorded usage: price of l40s-48gb from "
            "2026-01-01T00:00:00Z: 1 EUR -> 1.2 EUR per GPU-hour (+20%)" in s.log()
        ),
        5,
        "the warning",
    )
