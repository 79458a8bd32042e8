"""lending.md on the engine directly: what a scenario cannot see (the protection's reason
text and next pass time, the lost work each preemption records, a reported checkpoint, a
changed protect_for applying at once, phase 0 ignoring protection)."""

from __future__ import annotations

from compiler.compiled import CLending
from kliqued.engine import Preemption

from .helpers import MIN, START, Engine, build_estate

POOLS = [{"name": "onprem", "capacity": 4}]
PROFILES = [{"name": "gpu1", "gpus": 1, "pools": ["onprem"], "policies": ["a", "b"]}]


def _estate(lending: CLending, b_extra: dict | None = None, **kw):
    b = {"name": "b", "reservation": 2, "limit": 4, **(b_extra or {})}
    return build_estate(
        POOLS, PROFILES, [{"name": "a", "reservation": 2, "limit": 4}, b], lending=lending, **kw
    )


def _borrowed_then_reclaim(lending: CLending, b_extra: dict | None = None) -> Engine:
    e = Engine(_estate(lending, b_extra))
    for i in range(1, 5):
        e.submit(f"b-{i}", "b/gpu1")
    e.run(START)
    e.now = START + 10 * MIN
    e.submit("a-1", "a/gpu1")
    e.submit("a-2", "a/gpu1")
    e.run(START + 10 * MIN)
    return e


def test_protected_reclaim_waits_with_the_protection_end_in_its_reason() -> None:
    e = _borrowed_then_reclaim(CLending(protect_for_s=20 * 60))
    res = e.last
    assert res is not None and not res.preemptions
    r = res.waiting_reason("a-1")
    assert r is not None and r.kind == "capacity"
    assert r.text == "no room in pools onprem; borrowed work protected until 2026-01-05T00:20Z"
    assert res.next_pass_at == START + 20 * MIN  # the moment the protection ends
    res = e.run(START + 20 * MIN)
    assert [(p.task, p.kind, p.lost_ms, p.size_milli) for p in res.preemptions] == [
        ("b-4", "reclaimed", 20 * MIN, 1000),
        ("b-3", "reclaimed", 20 * MIN, 1000),
    ]
    assert abs(res.preemptions[0].lost_gpu_hours - 1 / 3) < 1e-9
    assert e.state.lost_gpu_units("b") == 2 * 1000 * 20 * MIN


def test_a_policy_protect_for_overrides_the_settings_and_a_change_applies_at_once() -> None:
    e = _borrowed_then_reclaim(CLending(protect_for_s=0), {"protect_for_s": 3600})
    assert e.last is not None and not e.last.preemptions
    e.set_estate(_estate(CLending(protect_for_s=0), {"protect_for_s": 5 * 60}))
    res = e.run(START + 11 * MIN)
    assert {p.task for p in res.preemptions} == {"b-3", "b-4"}


def test_a_reclaim_held_by_reservations_names_no_protection() -> None:
    # b holds exactly its reservation: no protection ending would let a-1 in.
    est = build_estate(
        POOLS,
        PROFILES,
        [{"name": "a", "reservation": 2, "limit": 4}, {"name": "b", "reservation": 4, "limit": 4}],
        lending=CLending(protect_for_s=20 * 60),
    )
    e = Engine(est)
    for i in range(1, 5):
        e.submit(f"b-{i}", "b/gpu1")
    e.run(START)
    e.now = START + MIN
    e.submit("a-1", "a/gpu1")
    r = e.run(START + MIN).waiting_reason("a-1")
    assert r is not None and r.text == "no room in pools onprem"


def test_phase_0_ignores_protection() -> None:
    est = build_estate(
        POOLS,
        PROFILES,
        [
            {"name": "a", "reservation": 2, "limit": 4},
            {"name": "b", "reservation": 0, "limit": 4, "budget": {"hours": 1, "period": "day"}},
        ],
        lending=CLending(protect_for_s=3600),
    )
    e = Engine(est)
    e.submit("b-1", "b/gpu1")
    e.run(START)
    res = e.run(START + 60 * MIN)  # 1 budget hour used: a used-up budget stops it at once
    assert [(p.task, p.kind, p.lost_ms) for p in res.preemptions] == [("b-1", "budget", 60 * MIN)]


def test_a_reported_checkpoint_lowers_the_lost_work() -> None:
    e = Engine(_estate(CLending(victims="least_lost_work")))
    for i in range(1, 5):
        e.submit(f"b-{i}", "b/gpu1")
    e.run(START)
    e.state.checkpoint("b-1", START + 25 * MIN)
    e.state.checkpoint("b-2", START + 28 * MIN)
    e.now = START + 30 * MIN
    e.submit("a-1", "a/gpu1")
    e.submit("a-2", "a/gpu1")
    res = e.run(START + 30 * MIN)
    # b-2 (2 minutes lost) then b-1 (5); newest-first would have taken b-4 and b-3.
    got = [(p.task, p.lost_ms) for p in res.preemptions if isinstance(p, Preemption)]
    assert got == [("b-2", 2 * MIN), ("b-1", 5 * MIN)]


def test_only_the_task_that_would_trigger_the_reclaim_names_the_protection_end() -> None:
    # b's two borrowed GPUs are protected for 5 minutes; a (reservation 1, best_effort) queues
    # two tasks, both within reservation taken alone. Only a-1 would trigger a reclaim
    # (engine.md: best_effort, the first task within reservation, and only that one); at
    # 00:05 a-1 takes a GPU back and a-2 is then borrowed work, which reclaims nothing: its
    # reason must not promise it room at 00:05.
    est = build_estate(
        [{"name": "onprem", "capacity": 2}],
        [
            {
                "name": "gpu1",
                "gpus": 1,
                "pools": ["onprem"],
                "policies": ["a", "b"],
                "queueing": "best_effort",
            }
        ],
        [
            {"name": "a", "reservation": 1, "limit": 4},
            {"name": "b", "reservation": 0, "limit": 4, "protect_for_s": 300},
        ],
    )
    e = Engine(est)
    e.submit("b-1", "b/gpu1")
    e.submit("b-2", "b/gpu1")
    e.run(START)
    e.now = START + MIN
    e.submit("a-1", "a/gpu1")
    e.submit("a-2", "a/gpu1")
    res = e.run(START + MIN)
    first, second = res.waiting_reason("a-1"), res.waiting_reason("a-2")
    assert first is not None and first.text == (
        "no room in pools onprem; borrowed work protected until 2026-01-05T00:05Z"
    )
    assert second is not None and second.text == "no room in pools onprem"
    res = e.run(START + 5 * MIN)
    assert [p.task for p in res.preemptions] == ["b-2"] and e.where("a-2") == "queued"
