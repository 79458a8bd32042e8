"""In-process checks of the daemon's own bookkeeping against the engine: queue positions,
the fast submission check against the OpenAPI schema, ids."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.api import compile_dir
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.prepared import Overlay
from kliqued.daemon.state.submission import Submission
from kliqued.daemon.ids import IdMaker
from kliqued.daemon.api.openapi import submission_surely_valid, validator

from tests.harness.daemon import SMALL_ESTATE
from tests.harness.examples import examples


def _daemon() -> Daemon:
    d = Daemon()
    estate = compile_dir(SMALL_ESTATE).estate
    assert estate is not None
    d.prepare_estate(estate, "test", "test", d.clock.now(), Overlay()).apply()
    return d


def test_positions_follow_the_engine_queue_order() -> None:
    """Submissions, passes (placements, reclaims that requeue at the front), cancellations of
    queued and placed tasks: every queued task's position is its place in the engine's
    iteration of the queue."""
    d = _daemon()
    rnd = random.Random(3)
    users = {"team-a": "bob", "team-b": "erin"}
    for step in range(600):
        now = d.clock.now() + step
        d.clock.at_least(now)
        if step % 100 == 0:  # the other group's turn: it starts from nothing
            g = "team-a" if (step // 100) % 2 == 0 else "team-b"
            for tid, rec in d.records.items():
                if rec.group == g and rec.state != "ended":
                    d.prepare_cancel(Principal("role", "admin"), tid, now, Overlay()).apply()
        r = rnd.random()
        if r < 0.6:
            g = "team-a" if (step // 100) % 2 == 0 else "team-b"  # borrow, then reclaim
            res = rnd.choice([f"{g}/one", f"{g}/sized"])
            f: dict[str, Any] = {
                "resource": res,
                "user": users[g],
                "project": None,
                "gpus_milli": rnd.choice([500, 1000, 3000]) if res.endswith("sized") else None,
                "command": None,
                "payload": None,
                "labels": {},
            }
            d.prepare_submit(Principal("user", users[g]), Submission(**f), now, Overlay()).apply()
        elif r < 0.7:
            live = [t for t, rec in d.records.items() if rec.state != "ended"]
            if live:
                tid = rnd.choice(live)
                d.prepare_cancel(Principal("role", "admin"), tid, now, Overlay()).apply()
        else:
            d.run_pass(now)
        for name, q in d.st().queues.items():
            order = [t.id for t in q]
            assert [d.position(d.records[t]) for t in order] == list(range(1, len(order) + 1))
    assert any(rec.preemptions for rec in d.records.values()), "no reclaim was exercised"


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**4),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
json_any = st.recursive(
    json_leaf,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=6,
)
bodies = st.fixed_dictionaries(
    {"resource": st.one_of(st.text(max_size=8), st.integers())},
    optional={
        "command": st.one_of(
            st.none(), st.lists(st.one_of(st.text(max_size=3), st.integers()), max_size=3)
        ),
        "payload": json_any,
        "gpus": st.one_of(st.none(), st.integers(-2, 9), st.floats(-1, 9)),
        "project": st.one_of(st.none(), st.text(max_size=3), st.integers()),
        "user": st.one_of(st.none(), st.text(max_size=3)),
        "labels": st.one_of(
            st.dictionaries(
                st.text(max_size=3), st.one_of(st.text(max_size=3), st.integers()), max_size=3
            ),
            st.integers(),
            st.none(),
        ),
        "extra": st.integers(),
    },
)


@settings(max_examples=examples(400), deadline=None)
@given(bodies | json_any)
def test_fast_submission_check_never_accepts_what_the_schema_refuses(body) -> None:
    if submission_surely_valid(body):
        assert validator("TaskSubmission").is_valid(body), body


def test_fast_submission_check_leaves_null_labels_to_the_schema() -> None:
    """``labels`` is an object or absent: the schema refuses null, so the fast check must not
    vouch for it (it once read ``labels: null`` as no labels)."""
    body = {"resource": "a/b", "labels": None}
    assert not validator("TaskSubmission").is_valid(body)
    assert not submission_surely_valid(body)
    assert submission_surely_valid({"resource": "a/b", "labels": {}})


def test_task_ids_sort_in_issue_order() -> None:
    m = IdMaker("t-")
    ids = [m.next(t) for t in (5, 5, 5, 4, 6, 6)]  # a clock that went back is not followed
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    again = IdMaker("t-")
    again.seed(ids[-1])
    assert again.next(6) > ids[-1]
