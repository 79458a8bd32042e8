"""``kliqued plan --against`` and ``--what-if-from`` given several daemons of one control
plane (issue 18): the URLs repeated or comma-separated as ``--url`` takes them, the leader
followed, and the plan the same as against the leader alone. Two real daemons on one real
PostgreSQL (skipped, saying why, where PostgreSQL is not installed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.daemon.fleet import FleetServer, write_estate
from tests.daemon.test_failover import pair
from tests.harness.wait import wait_for

from .helpers import commit_all, init_repo, run_plan


def test_the_plan_against_a_standby_and_the_leader_is_the_leaders(
    tmp_path: Path, pg_url: str, capsys
) -> None:
    repo = init_repo(tmp_path / "repo")
    write_estate(repo / "estate")
    commit_all(repo, "the estate")
    # --no-watch: the daemons run the committed estate while the working tree changes (as
    # in CI, where the daemons run what was merged); watching, they would apply the change
    # and the second plan would warn of a stale base
    a, b = pair(
        tmp_path, pg_url, FleetServer, estate=repo / "estate", workers=False, extra=["--no-watch"]
    )
    try:
        erin = a.token({"user": "erin"})
        placed = [a.submit(erin, "team-b/one", ["sleep", "100"]) for _ in range(2)]
        a.submit(erin, "team-b/one", ["sleep", "100"])
        wait_for(lambda: all(a.task(t)["state"] == "placed" for t in placed), 10, "placed")
        planner = a.token({"role": "planner", "name": "ci"})
        wait_for(
            lambda: b.call("GET", f"/v1/tasks/{placed[0]}", token=erin)[0] == 200,
            15,
            "the standby to serve reads",
        )
        # team-b's price backdated: the plan counts the usage recorded at that price
        path = repo / "estate" / "pricing.yaml"
        path.write_text(path.read_text().replace("per_gpu_hour: 1.0", "per_gpu_hour: 1.5", 1))

        def plan(*flags: str) -> dict:
            code, out, err = run_plan(
                capsys,
                "--repo",
                str(repo),
                "--base",
                "main",
                "--token",
                planner,
                "--format",
                "json",
                *flags,
            )
            assert code == 2, err
            return json.loads(out)

        alone = plan("--against", a.url, "--what-if-from", a.url, "--since", "1h")
        # comma-separated, the standby first (its redirect followed); repeated, the standby
        # last (every URL kept, not only the last one given)
        both = plan(
            "--against",
            f"{b.url},{a.url}",
            "--what-if-from",
            a.url,
            "--what-if-from",
            b.url,
            "--since",
            "1h",
        )
        assert both["whatif"]["source"].startswith(a.url), both["whatif"]["source"]
        for key in ("impacts", "changes", "envelopes", "whatif"):
            assert _stable(both[key]) == _stable(alone[key]), key
        assert both["against"]["source"] == a.url  # the leader answered, not the standby
        price = next(i for i in both["impacts"] if i["kind"] == "price-backdated")
        assert price["details"]["recorded_gpu_hours"] > 0, price  # the leader's ledger
        # a blank list of URLs is an error naming the flag, not the config's URL
        code, _, err = run_plan(capsys, "--repo", str(repo), "--against", ",")
        assert code == 1 and "--against: no URL given" in err
    finally:
        for s in (a, b):
            s.stop()


def _stable(value: object) -> str:
    """The plan's part with its numbers blanked: the usage and times move with the clock
    between the two runs, the rest (what changes, each impact, the envelopes, the what-if's
    rows) must be the same."""
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", json.dumps(value, sort_keys=True))
