"""Why a task ended and who ended it, read by its owner with `status`, `logs` and `events`
(issue 10, bug 5)."""

from __future__ import annotations

import json

from kliqued.sdk import Client


def test_owner_sees_who_cancelled_and_why(server, as_user):
    bob = Client(server.url, server.token("bob"))
    tid = bob.submit("llm-research/h100", command=["sleep", "60"], project="evals")["id"]
    rc, out, err = as_user("alice", "cancel", tid, "--reason", "the wrong data set")
    assert rc == 0, err
    rc, out, err = as_user("bob", "status", tid)
    assert rc == 0 and "state     ended (cancelled by user:alice: the wrong data set)" in out
    rc, out, err = as_user("bob", "status", "--state", "ended")
    line = next(x for x in out.splitlines() if x.startswith(tid))
    assert line.endswith("cancelled by user:alice: the wrong data set"), line
    rc, out, err = as_user("bob", "logs", tid)
    assert rc == 0 and out == ""
    assert f"{tid} ended: cancelled by user:alice: the wrong data set" in err
    rc, out, err = as_user("bob", "events", "--task", tid)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["SEQ", "AT", "KIND", "TASK", "ACTOR", "DETAIL"]
    assert "submitted" in lines[1] and "user:bob" in lines[1]
    assert "cancelled" in lines[-1] and "user:alice" in lines[-1]
    assert "the wrong data set" in lines[-1]
    rc, out, err = as_user("bob", "events", "--task", tid, "--json")
    kinds = [e["kind"] for e in json.loads(out)["events"]]
    assert kinds[0] == "submitted" and kinds[-1] == "cancelled"
    rc, out, err = as_user("erin", "events", "--task", tid)  # another group: not hers
    assert rc == 1 and "no task" in err
