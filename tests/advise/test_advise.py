"""``kliqued advise`` (issue 31) on small estates whose answer is known by hand.

One pool of ``cap`` GPUs; team-a may hold 2 of them (its limit), team-b the pool. team-a
sends six 1-GPU, one-hour tasks at once: two run, the others wait one and two hours (p95
2 h) while most of the pool is idle. With team-b sending one task at the start, raising
team-a's limit shortens its waits and costs team-b nothing: kept, with the patch and who
must approve. With team-b sending two tasks a minute later on a 4-GPU pool, the same change
would make team-b wait an hour: dropped, naming team-b. Each verdict comes from replaying
the demand (the what-if), so these tests also check the advice is what ``plan --what-if``
finds.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from compiler.api import compile_dir
from kliqued.advise import advise, render_markdown
from kliqued.cli import main
from kliqued.whatif import read_demand, what_if

HOUR = 3600


def estate(tmp: Path, cap: int) -> Path:
    d = tmp / "repo" / "estate"
    d.mkdir(parents=True)
    (d / "estate.yaml").write_text(
        f"""version: 1
settings: {{pass_interval: 1s, currency: EUR}}
pools:
  - {{name: p, kind: baremetal, capacity: {cap}, gpu_type: h100}}
groups:
  - name: lab
    admins: [lena]
  - name: team-a
    parent: lab
    users: [alice]
    admins: [alice]
  - name: team-b
    parent: lab
    users: [bob]
policies:
  - name: team-a
    group: team-a
    reservation: 0
    limit: 2
  - name: team-b
    group: team-b
    reservation: 0
    limit: {cap}
profiles:
  - name: one
    gpus: 1
    pools: [p]
    policies: [team-a, team-b]
"""
    )
    assert compile_dir(d).estate is not None
    return d


def demand(tmp: Path, b_tasks: int, b_at: int) -> Path:
    lines = ["id,submit,resource,user,project,gpus,runtime"]
    lines += [f"a{i},0,team-a/one,alice,,,{HOUR}" for i in range(6)]
    lines += [f"b{i},{b_at},team-b/one,bob,,,{HOUR}" for i in range(b_tasks)]
    path = tmp / "demand.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_limit_that_held_work_back_is_raised(tmp_path: Path) -> None:
    d = estate(tmp_path, cap=8)
    rows = read_demand(str(demand(tmp_path, 1, 0)))
    advice, patch = advise(rows, d, "demand.csv", threshold_s=HOUR)
    base = {r.name: r.base for r in advice.baseline.groups}
    assert base["team-a"].wait_p95_s == 2 * HOUR
    tried = {(p.change.policy, p.change.field, p.change.after) for p in advice.proposals}
    assert tried == {("team-a", "limit", 3.0), ("team-a", "limit", 4.0)}
    for p in advice.proposals:
        assert p.accepted, p.verdict
        assert p.after is not None and p.after.wait_p95_s == HOUR
        assert [a.user for a in p.approvers] == ["alice", "lena"]  # team-a, then lab above
    (kept,) = advice.kept
    assert kept.change.line == 19 and kept.change.before == 2  # the `limit: 2` line
    assert "-    limit: 2\n" in patch and f"+    limit: {kept.change.after:g}\n" in patch
    assert patch.startswith("--- a/estate/estate.yaml\n+++ b/estate/estate.yaml\n")
    # the patch applies to the repository and the changed estate is what was replayed
    base_estate = compile_dir(d).estate
    assert base_estate is not None
    repo = d.parent
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "advice.patch").write_text(patch)
    subprocess.run(["git", "-C", str(repo), "apply", "advice.patch"], check=True)
    head = compile_dir(d).estate
    assert head is not None
    pol = head.policy("team-a")
    assert pol is not None and pol.limit_milli == kept.change.after * 1000
    again = what_if(rows, base_estate, head, "d")
    assert {r.name: r.head for r in again.groups}["team-a"].wait_p95_s == HOUR
    assert advice.together is not None
    text = render_markdown(advice)
    assert "| team-a: limit 2 -> " in text and "**kept**" in text
    assert "2h00m00s -> 1h00m00s" in text and "alice (admin of team-a)" in text


def test_a_change_that_makes_another_group_wait_is_dropped(tmp_path: Path) -> None:
    d = estate(tmp_path, cap=4)
    rows = read_demand(str(demand(tmp_path, 2, 60)))
    advice, patch = advise(rows, d, "demand.csv", threshold_s=HOUR)
    assert advice.proposals, "team-a waited two hours on its limit: a change is tried"
    for p in advice.proposals:
        assert not p.accepted
        assert p.worst_other is not None and p.worst_other[0] == "team-b"
        assert "team-b's p95 wait would rise" in p.verdict
    assert advice.kept == () and patch == ""
    assert "dropped" in render_markdown(advice)


def test_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = estate(tmp_path, cap=8)
    dem = demand(tmp_path, 1, 0)
    out = tmp_path / "advice.md"
    pat = tmp_path / "advice.patch"
    argv = ["advise", "--estate", str(d), "--demand", str(dem), "-o", str(out)]
    assert main(argv + ["--patch", str(pat)]) == 0
    assert "# Klique advice" in out.read_text() and "+    limit: " in pat.read_text()
    capsys.readouterr()
    assert main(["advise", "--estate", str(d), "--demand", str(dem), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["kept"] for p in data["proposals"]].count(True) == 1
    # bad input: a clear message naming the place, exit 1, no traceback
    assert main(["advise", "--estate", str(tmp_path / "none"), "--demand", str(dem)]) == 1
    assert "kliqued advise: " in capsys.readouterr().err
    assert main(["advise", "--estate", str(d), "--demand", str(dem), "--group", "nope"]) == 1
    assert "--group nope: no such group" in capsys.readouterr().err
    assert main(["advise", "--estate", str(d), "--demand", str(dem), "--since", "7d"]) == 1
    assert "--since needs --against" in capsys.readouterr().err


def test_against_a_daemon_reads_its_demand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--against URL``: the demand is the daemon's own (``GET /v1/demand``, a planner
    token), replayed on the estate given; a user's token is refused with the API's words."""
    from tests.harness.daemon import SMALL_ESTATE
    from tests.harness.inproc import InProcServer
    from tests.harness.wait import wait_for

    s = InProcServer(tmp_path).start()
    try:
        bob = s.token("bob")
        ids = [
            s.ok("POST", "/v1/tasks", {"resource": "team-a/one", "command": ["x"]}, bob)["id"]
            for _ in range(3)
        ]
        wait_for(lambda: all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in ids))
        monkeypatch.setenv("KLIQUE_CONFIG", str(tmp_path / "absent.yaml"))
        planner = s.token("role:planner")
        argv = ["advise", "--estate", str(SMALL_ESTATE), "--against", s.url, "--json"]
        capsys.readouterr()
        assert main(argv + ["--token", planner]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["source"] == f"{s.url}, last 14d" and data["proposals"] == []
        assert main(argv[:-1] + ["--token", planner]) == 0  # the report: bob's three tasks
        assert f"Demand: {s.url}, last 14d (3 tasks, " in capsys.readouterr().out
        assert main(argv + ["--token", bob]) == 1
        err = capsys.readouterr().err
        assert err.startswith("kliqued advise: ") and "Traceback" not in err
    finally:
        s.stop()
