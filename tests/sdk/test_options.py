"""What a researcher may submit, and the server saying so (issue 10: bug 4, `kliqued
resources`, `kliqued whoami`, an unknown resource listing the valid ones)."""

from __future__ import annotations

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
