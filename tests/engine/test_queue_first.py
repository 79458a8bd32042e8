"""``CRQueue.first`` and ``CRQueue.min_size_where`` (issue 29's what-if): past a short walk
they answer from (user, size) buckets instead of walking every task. Checked against the
plain walk in queue order over random queues: pushes in and out of project order, tasks
placed from the middle (stale entries), preemptions back to the front part, resizes, and
compactions, with predicates on user and size such as the rules ask."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kliqued.engine.queues import _WALK, PLACED, QUEUED, CRQueue
from kliqued.engine.state import Task
from tests.harness.examples import examples

USERS = ("ann", "bob", "cy")
PROJECTS = ("p0", "p1", None)


def make(seq: int, user: str, size: int, project: str | None) -> Task:
    return Task(f"t{seq}", "a/one", "a", user, project, None, size, 1000, seq, seq * 1000)


def walk_first(q: CRQueue, ok) -> Task | None:
    return next((t for t in q if ok(t)), None)


ops = st.lists(
    st.tuples(
        st.sampled_from(("push", "push", "push", "place", "preempt", "resize")),
        st.integers(0, 10_000),
    ),
    min_size=1,
    max_size=300,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    ops=ops,
    ranked=st.booleans(),
    room=st.integers(1, 4),
    held=st.sets(st.sampled_from(USERS)),
)
def test_first_is_the_walks_answer(
    ops: list[tuple[str, int]], ranked: bool, room: int, held: set[str]
) -> None:
    q = CRQueue({"p0": 0, "p1": 1} if ranked else None)
    queued: list[Task] = []
    out: list[Task] = []
    seq = 0

    def ok(t: Task) -> bool:
        return t.user not in held and t.size <= room

    for op, x in ops:
        if op == "push" or not (queued or out):
            seq += 1
            t = make(seq, USERS[x % 3], 1 + x % 4, PROJECTS[x % 3])
            q.push(t)
            queued.append(t)
        elif op == "place" and queued:
            t = queued.pop(x % len(queued))
            t.status = PLACED
            q.left(t)
            out.append(t)
        elif op == "preempt" and out:
            t = out.pop(x % len(out))
            t.status = QUEUED
            t.ran_before = True
            q.push(t)
            queued.append(t)
        elif op == "resize" and queued:
            t = queued[x % len(queued)]
            was, t.size = t.size, 1 + (t.size + x) % 4
            if t.size != was:
                q.resized(t, was)
        # The answers never depend on whether the buckets exist yet.
        assert q.first(ok) is walk_first(q, ok)
        sizes = [t.size for t in q if ok(t)]
        assert q.min_size_where(ok) == (min(sizes) if sizes else None)
        assert q.first(lambda t: True) is q.head()


def test_a_deep_queue_held_by_its_users_answers_from_the_buckets() -> None:
    """The case the what-if met: thousands of tasks of users at their limit ahead of one
    that may go. The answer is the same as the walk's; the buckets hold one entry a task."""
    q = CRQueue()
    n = 50 * _WALK
    for i in range(n):
        q.push(make(i, "held", 1, None))
    last = make(n, "free", 2, None)
    q.push(last)

    def ok(t: Task) -> bool:
        return t.user == "free"

    assert q.first(ok) is last
    assert q.buckets is not None
    assert sorted((k, len(h)) for k, h in q.buckets.items()) == [(("free", 2), 1), (("held", 1), n)]
    assert q.min_size_where(ok) == 2
    assert q.first(lambda t: t.size > 2) is None
    # Placing the free task leaves a stale bucket front: dropped, and the answer is None.
    last.status = PLACED
    q.left(last)
    assert q.first(ok) is None
    assert ("free", 2) not in q.buckets
