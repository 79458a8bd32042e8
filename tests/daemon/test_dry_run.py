"""Issue 31: a dry run through every channel, on a real ``kliqued serve`` (in process).

The small estate: pool-1 (4 H100s at 2.5 EUR/h) for profile ``one``, team-a and team-b each
reserving 2. erin's team-b fills pool-1, two of its four GPUs borrowed; alice's dry run on
team-a/one then answers "placed now on pool-1 by a reclaim", naming the team-b task it would
take (its id only to those who may see it), team-a's budget with the task running and its
cost. Nothing is stored. Then alice submits for real and the engine does what the dry run
said: the same pool, the same phase, the same victim. The same answer comes through the SDK,
``kliqued submit --dry-run`` and MCP's ``dry_run_task``; refusals are the submission's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kliqued.cli import main
from kliqued.engine.periods import format_time, next_period_start
from kliqued.sdk import Client, KliqueError
from tests.harness.daemon import SMALL_ESTATE
from tests.harness.inproc import InProcServer
from tests.harness.typed import present
from tests.harness.wait import wait_for

CMD = {"command": ["sleep", "3600"]}
PROJECTLESS = {"resource": "team-a/one", **CMD}


def placed(s: InProcServer, ids: list[str]) -> bool:
    return all(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in ids)


def alice_events(s: InProcServer) -> list[dict[str, Any]]:
    """Every event alice caused (as the admin reads the log)."""
    return [e for e in s.ok("GET", "/v1/events?limit=1000")["events"] if e["actor"] == "user:alice"]


@pytest.fixture
def server(tmp_path: Path):
    s = InProcServer(tmp_path).start()
    try:
        yield s
    finally:
        s.stop()


def test_dry_run_answers_what_the_engine_then_does(server: InProcServer) -> None:
    s = server
    alice, erin = s.token("alice"), s.token("erin")
    b = [s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)["id"] for _ in range(4)]
    wait_for(lambda: placed(s, b), 10, "team-b's four tasks placed")

    status, a = s.call("POST", "/v1/tasks", {**PROJECTLESS, "dry_run": True}, alice)
    assert status == 200, a
    assert a["dry_run"] is True and a["outcome"] == "placed"
    assert (a["pool"], a["phase"], a["gpus"], a["user"]) == ("pool-1", "reclaim", 1, "alice")
    assert a["settled"] is True and a["waiting_reason"] is None and a["position"] == 1
    (v,) = a["victims"]
    # alice may not see erin's task: its group and place, not its id or user
    assert (v["task"], v["user"], v["group"], v["kind"]) == (None, None, "team-b", "reclaimed")
    assert v["pool"] == "pool-1" and v["gpus"] == 1 and v["protected_until"] is None
    (bud,) = a["budgets"]
    assert (bud["group"], bud["burn_rate"], bud["burn_rate_with"]) == ("team-a", 0, 1)
    assert bud["start_check"] == "passes" and bud["runout_at"] is None
    assert (a["cost_per_hour"], a["currency"], a["price_pool"]) == (2.5, "EUR", "pool-1")
    assert a["forecast"]["basis"] == "now" and a["forecast"]["start_at"] == a["at"]

    # nothing stored: no task, no event
    assert s.ok("GET", "/v1/tasks", token=alice)["tasks"] == []
    assert alice_events(s) == []

    # an admin dry-running for alice sees which task it would be
    adm = s.ok("POST", "/v1/tasks", {**PROJECTLESS, "dry_run": True, "user": "alice"})
    victim = adm["victims"][0]["task"]
    assert victim in b and adm["victims"][0]["user"] == "erin"

    # the real submission: the engine does what the dry run said
    t = s.ok("POST", "/v1/tasks", PROJECTLESS, alice, expect=201)["id"]
    wait_for(lambda: placed(s, [t]), 10, "alice's task placed")
    ev = wait_for(
        lambda: s.ok("GET", f"/v1/events?task={t}&kind=placed")["events"], 10, "its event"
    )
    assert [(e["data"]["pool"], e["data"]["phase"]) for e in ev] == [("pool-1", "reclaim")]
    assert s.ok("GET", f"/v1/tasks/{victim}")["state"] == "queued"
    assert s.ok("GET", f"/v1/tasks/{victim}")["last_preemption"]["text"] == "reclaimed by team-a"


def test_a_dry_run_has_the_rights_and_checks_of_a_submission(server: InProcServer) -> None:
    s = server
    erin = s.token("erin")
    for body in (PROJECTLESS, {"resource": "team-a/sized", "gpus": 9, **CMD}):
        real = s.call("POST", "/v1/tasks", body, erin)
        dry = s.call("POST", "/v1/tasks", {**body, "dry_run": True}, erin)
        assert dry == real and dry[0] in (403, 422), dry
    assert s.call("POST", "/v1/tasks", {**PROJECTLESS, "dry_run": True}, None)[0] == 401
    status, err = s.call("POST", "/v1/tasks", {**PROJECTLESS, "dry_run": "yes"}, erin)
    assert status == 400 and "/dry_run" in err["error"]["message"]
    status, err = s.call("POST", "/v1/tasks", {"resource": "team-b/one", "dry_run": True}, erin)
    assert status == 422 and err["error"]["code"] == "invalid-task"  # as a submission
    status, err = s.call(
        "POST", "/v1/tasks", {"resource": "team-b/one", "dry_run": True, **CMD}, s.admin
    )
    assert status == 422 and "on behalf of a user" in err["error"]["message"]
    assert s.ok("GET", "/v1/tasks")["tasks"] == []


def test_waiting_with_its_place_in_line(server: InProcServer) -> None:
    """pool-2 (8 GPUs) holds two of alice's 3-GPU tasks (team-a's limit of 10 leaves room for
    a third, the pool does not): a 3-GPU dry run waits for capacity, second in line, with no
    known start."""
    s = server
    alice = s.token("alice")
    sized = {"resource": "team-a/sized", "gpus": 3, **CMD}
    ids = [s.ok("POST", "/v1/tasks", sized, alice)["id"] for _ in range(3)]
    wait_for(lambda: sum(s.ok("GET", f"/v1/tasks/{t}")["state"] == "placed" for t in ids) == 2)
    wait_for(lambda: s.ok("GET", f"/v1/tasks/{ids[2]}")["waiting_reason"]["kind"] == "capacity")
    a = s.ok("POST", "/v1/tasks", {**sized, "dry_run": True}, alice)
    assert a["outcome"] == "waiting" and a["pool"] is None and a["victims"] == []
    assert a["waiting_reason"] == {"kind": "capacity", "text": "no room in pools pool-2"}
    assert a["position"] == 2
    assert a["forecast"] == {
        "start_at": None,
        "basis": "unknown",
        "text": "unknown: waits for capacity",
    }
    (bud,) = a["budgets"]  # time_weight 2 a task: two burn 4 h/h, 6 with one more
    assert (bud["burn_rate"], bud["burn_rate_with"]) == (4, 6)
    assert a["cost_per_hour"] == 3.0 and a["price_pool"] == "pool-2"  # 3 x 1.0 EUR
    # the queued task shows the same forecast
    assert s.ok("GET", f"/v1/tasks/{ids[2]}")["forecast"]["text"] == "unknown: waits for capacity"


def test_sdk_and_cli(server: InProcServer, monkeypatch: pytest.MonkeyPatch, capsys, tmp_path):
    s = server
    erin = s.token("erin")
    b = [s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)["id"] for _ in range(4)]
    wait_for(lambda: placed(s, b), 10, "team-b's four tasks placed")
    k = Client(s.url, s.token("alice"))
    a = k.dry_run("team-a/one", "sleep 3600")
    assert (a["outcome"], a["pool"], a["phase"]) == ("placed", "pool-1", "reclaim")
    with pytest.raises(KliqueError) as refused:
        Client(s.url, erin).dry_run("team-a/one", "true")
    assert refused.value.status == 422
    assert k.tasks() is not None and list(k.tasks()) == []

    monkeypatch.setenv("KLIQUE_CONFIG", str(tmp_path / "absent.yaml"))
    monkeypatch.setenv("KLIQUE_URL", s.url)
    monkeypatch.setenv("KLIQUE_TOKEN", present(s.token("alice")))
    capsys.readouterr()
    assert main(["submit", "--dry-run", "-r", "team-a/one", "--", "sleep", "3600"]) == 0
    out = capsys.readouterr().out
    assert "would be placed now on pool pool-1 (phase reclaim)" in out
    assert "would reclaim a task of team-b (1 GPUs on pool-1" in out
    assert "budget team-a: 1000 of 1000 h left this month, 0 -> 1 h/h with it" in out
    assert "cost: 2.5 EUR/h at pool-1's price" in out
    assert "earliest start: starts now" in out
    assert main(["submit", "--dry-run", "--json", "-r", "team-a/one", "--", "true"]) == 0
    assert json.loads(capsys.readouterr().out)["victims"][0]["group"] == "team-b"
    assert list(k.tasks()) == []  # still nothing stored


def budget_estate(tmp: Path) -> Path:
    """The small estate with team-b's budget at 0 hours a month: its weighted work waits for
    the month's reset from the start."""
    d = tmp / "estate"
    shutil.copytree(SMALL_ESTATE, d)
    pol = (d / "policies.yaml").read_text()
    assert "  - name: team-b\n    group: team-b\n    reservation: 2\n    limit: 10\n" in pol
    (d / "policies.yaml").write_text(
        pol.replace(
            "  - name: team-b\n    group: team-b\n    reservation: 2\n    limit: 10\n",
            "  - name: team-b\n    group: team-b\n    reservation: 2\n    limit: 10\n"
            "    budget: {hours: 0, period: month}\n",
        )
    )
    return d


def test_forecast_of_a_budget_reset_in_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    s = InProcServer(tmp_path, estate=budget_estate(tmp_path)).start()
    try:
        erin = s.token("erin")
        t = s.ok("POST", "/v1/tasks", {"resource": "team-b/one", **CMD}, erin)["id"]
        wait_for(lambda: s.ok("GET", f"/v1/tasks/{t}")["forecast"] is not None, 10, "a pass")
        view = s.ok("GET", f"/v1/tasks/{t}", token=erin)
        now = s.clock.wall_ms()
        reset = format_time(next_period_start("month", now))
        assert view["waiting_reason"]["kind"] == "budget"
        assert view["forecast"]["basis"] == "budget-reset"
        assert view["forecast"]["start_at"] == reset
        dry = s.ok("POST", "/v1/tasks", {"resource": "team-b/one", "dry_run": True, **CMD}, erin)
        assert dry["outcome"] == "waiting" and dry["forecast"]["start_at"] == reset
        assert dry["budgets"][0]["start_check"] == "fails"

        monkeypatch.setenv("KLIQUE_CONFIG", str(tmp_path / "absent.yaml"))
        monkeypatch.setenv("KLIQUE_URL", s.url)
        monkeypatch.setenv("KLIQUE_TOKEN", present(erin))
        capsys.readouterr()
        assert main(["status", t]) == 0
        out = capsys.readouterr().out
        assert f"earliest  {view['forecast']['text']}" in out
        assert main(["status"]) == 0
        assert f"(earliest {reset.replace('T', ' ')})" in capsys.readouterr().out
    finally:
        s.stop()


def test_the_price_in_force_is_the_latest_effective_at_the_time() -> None:
    """``price_per_gpu_hour``: the pool's GPU type's price whose ``effective_from`` is the
    latest at or before the time; none before the first; another type's never; a new estate
    is read again (the prices are kept per estate)."""
    from decimal import Decimal

    from compiler.api import compile_dir
    from compiler.compiled import CPrice
    from kliqued.daemon.api.dryrun import price_per_gpu_hour
    from kliqued.daemon.units import parse_iso

    estate = compile_dir(SMALL_ESTATE).estate
    assert estate is not None
    gpu = next(p.gpu_type for p in estate.pools if p.name == "pool-1")
    prices = [
        CPrice(gpu_type=gpu, per_gpu_hour="2.5", effective_from="2026-01-01T00:00:00Z"),
        CPrice(gpu_type=gpu, per_gpu_hour="3.1", effective_from="2026-07-01T00:00:00Z"),
        CPrice(gpu_type="other", per_gpu_hour="9", effective_from="2026-03-01T00:00:00Z"),
    ]
    e = estate.model_copy(update={"pricing": prices})
    at = parse_iso
    assert price_per_gpu_hour(e, "pool-1", at("2025-12-31T23:59:59Z")) is None
    assert price_per_gpu_hour(e, "pool-1", at("2026-01-01T00:00:00Z")) == Decimal("2.5")
    assert price_per_gpu_hour(e, "pool-1", at("2026-06-30T23:59:59Z")) == Decimal("2.5")
    assert price_per_gpu_hour(e, "pool-1", at("2026-07-01T00:00:00Z")) == Decimal("3.1")
    assert price_per_gpu_hour(e, "no-such-pool", at("2026-07-01T00:00:00Z")) is None
    cheaper = e.model_copy(update={"pricing": prices[:1]})
    assert price_per_gpu_hour(cheaper, "pool-1", at("2026-08-01T00:00:00Z")) == Decimal("2.5")
