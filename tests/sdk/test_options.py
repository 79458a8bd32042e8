"""What a researcher may submit, and the server saying so (issue 10: bug 4, `kliqued
resources`, `kliqued whoami`, an unknown resource listing the valid ones)."""

from __future__ import annotations

import json

import pytest

from kliqued.sdk import Client, KliqueError


def test_a_group_with_projects_needs_one_of_them(server):
    alice = Client(server.url, server.token("alice"))
    for project in (None, "nope"):
        with pytest.raises(KliqueError) as e:
            alice.submit("llm-research/h100", command=["true"], project=project)
        assert e.value.status == 422 and e.value.code == "submission-refused"
        assert "evals, foundation-7b, rlhf" in e.value.message, e.value.message
    t = alice.submit("llm-research/h100", command=["true"], project="rlhf")
    alice.cancel(t["id"])


def test_status_of_someone_elses_tasks_says_it_is_not_allowed(as_user):
    rc, out, err = as_user("bob", "status", "--user", "alice")
    assert rc == 1 and out == "" and "bob may not see alice's tasks" in err, err


def test_an_unknown_resource_lists_the_valid_ones(as_user):
    for resource in ("llm-research/h200", "vision/h100"):
        rc, out, err = as_user("bob", "submit", "-r", resource, "-p", "evals", "--", "true")
        assert rc == 1 and out == ""
        assert "bob may submit to llm-research/bigmem-2x, llm-research/h100, " in err, err
        assert "llm-research/train-4x" in err and "vision/" not in err.split("may submit")[1]


def test_resources_shows_what_i_may_submit_to_and_my_groups_room(server, as_user):
    rc, out, err = as_user("bob", "resources")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["RESOURCE", "GPUS", "WEIGHT", "POOLS"]
    names = [x.split()[0] for x in lines[1:] if x and not x.startswith(" ")]
    assert "llm-research/h100" in names and not any(n.startswith("vision/") for n in names)
    assert "group llm-research:" in out and "GPUs used of reservation 16, limit 48" in out
    assert "budget 12000 h/month" in out and "left" in out
    rc, out, err = as_user("bob", "resources", "--json")
    res = json.loads(out)["resources"]
    h100 = next(r for r in res if r["name"] == "llm-research/h100")
    assert h100["may_submit"] is True and h100["room"]["limit"] == 48
    assert h100["room"]["reservation"] == 16 and h100["room"]["budget"]["hours"] == 12000
    assert h100["room"]["budget"]["left_hours"] <= 12000
    # a group admin who is not one of its users sees the group's resources, may not submit
    admin_view = Client(server.url, server.token("walter")).resources()
    assert admin_view and not any(r["may_submit"] for r in admin_view)


def test_whoami(as_user):
    rc, out, err = as_user("alice", "whoami")
    assert rc == 0, err
    assert "user:alice" in out and "groups    llm-research" in out
    assert "admin of  llm-research" in out
    rc, out, err = as_user("role:finance", "whoami")
    assert rc == 0 and "role:finance" in out and "role      finance" in out
