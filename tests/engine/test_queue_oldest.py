"""``CRQueue.oldest``: the queued task submitted first, across the queue's two parts, read
without dropping the lazy (stale) entries that ``head`` drops (metrics read it at scrape
time: a read must not change the engine's state)."""

from __future__ import annotations

from kliqued.engine.queues import PLACED, QUEUED, CRQueue
from kliqued.engine.state import Task


def task(seq: int) -> Task:
    return Task(f"t{seq}", "a/one", "a", "u", None, None, 1000, 1000, seq, seq * 1000)


def place(q: CRQueue, t: Task) -> None:
    t.status = PLACED
    q.left(t)


def requeue(q: CRQueue, t: Task) -> None:
    """Preempted: back in its queue, at the front part."""
    t.ran_before = True
    t.status = QUEUED
    q.push(t)


def test_oldest_across_both_parts_without_changing_the_queue() -> None:
    q = CRQueue()
    assert q.oldest() is None
    t1, t2, t3 = task(1), task(2), task(3)
    for t in (t1, t2, t3):
        q.push(t)
    assert q.oldest() is t1
    place(q, t1)
    place(q, t3)
    entries = (len(q.front), len(q.back), q.stale)
    assert q.oldest() is t2  # t1's stale entry is skipped...
    assert (len(q.front), len(q.back), q.stale) == entries  # ...and left where it is
    requeue(q, t3)  # ran before: the front part, but submitted after t2
    assert q.oldest() is t2
    requeue(q, t1)  # submitted first of all
    assert q.oldest() is t1
    place(q, t1)
    place(q, t2)
    assert q.oldest() is t3
    place(q, t3)
    assert q.oldest() is None and q.live == 0
