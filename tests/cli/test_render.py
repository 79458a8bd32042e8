"""What the user commands print from the server's JSON (issue 10: bugs 5, 10 and 14)."""

from __future__ import annotations

import json

from kliqued.commands import budget, status

TASK = {
    "id": "t-1",
    "state": "ended",
    "end_reason": "finished",
    "resource": "a/one",
    "group": "a",
    "policy": "a",
    "profile": "one",
    "user": "alice",
    "project": None,
    "gpus": 1,
    "submitted_at": "2026-11-29T09:00:00Z",
    "gpu_hours": 2.2e-05,
    "command": ["python", "-c", "print('hello world')"],
    "payload": {"notebook": True, "name": None},
    "revision": "sha256:x",
}

POLICY = {
    "name": "a",
    "group": "a",
    "used": 1,
    "limit": 4,
    "reservation": 2,
    "borrowed": 0,
    "budget": {
        "hours": 0.1,
        "period": "day",
        "period_start": "2026-11-29T00:00:00Z",
        "resets_at": "2026-11-30T00:00:00Z",
        "used_hours": 0.1004,
        "left_hours": -0.0004,
        "burn_rate": 1.0,
        "runout_at": None,
        "alerts": [],
    },
}


def test_status_shows_small_gpu_hours_json_payload_and_a_quoted_command() -> None:
    text = status.detail(TASK)
    assert "gpu-hours 0.000022" in text and "e-05" not in text
    assert """command   python -c 'print('"'"'hello world'"'"')'""" in text
    assert f"payload   {json.dumps(TASK['payload'])}" in text
    assert "True" not in text


def test_budget_left_is_never_minus_zero() -> None:
    text = budget.detail(POLICY)
    assert "left         -0.0004 h" in text and "used         0.1 h (100%)" in text


def test_logs_end_with_why_it_ran_again_and_why_it_ended(capsys) -> None:
    from kliqued.commands import logs

    task = {
        **TASK,
        "state": "ended",
        "preemptions": 2,
        "last_preemption": {
            "kind": "reclaim",
            "text": "reclaimed by vision",
            "at": "2026-11-29T09:00:00Z",
        },
        "end": {
            "text": "failed: exit code 3: CUDA out of memory",
            "by": None,
            "message": "CUDA out of memory",
        },
    }
    logs._ending("t-1", task)
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "==> t-1 preempted 2x, last: reclaimed by vision",
        "==> t-1 ended: failed: exit code 3: CUDA out of memory",
    ]


def _pol(name: str, path: str, levels: list[str]) -> dict:
    return {**POLICY, "name": name, "group": name, "path": path, "levels": levels, "budget": None}


def test_budget_tree_nests_under_the_nearest_envelope_shown_in_the_organisations_order():
    """A team whose department is not shown (not the caller's, or a department with no
    policy) starts a tree of its own; siblings follow their groups' paths, so the teams of
    a policy-less department (lab) stay together; a daemon before the tree: flat."""
    pols = [
        _pol("zeta", "co/lab/zeta", ["zeta"]),
        _pol("alpha", "co/sales/dep/alpha", ["alpha", "dep", "sales"]),
        _pol("dep", "co/sales/dep", ["dep", "sales"]),
        _pol("beta", "co/lab/beta", ["beta"]),
        _pol("sales", "co/sales", ["sales"]),
        _pol("orphan", "co/other/d2/orphan", ["orphan", "d2"]),
    ]
    got = [(depth, p["name"]) for depth, p in budget.tree(pols)]
    assert got == [(0, "beta"), (0, "zeta"), (0, "orphan"), (0, "sales"), (1, "dep"), (2, "alpha")]
    old = [{k: v for k, v in p.items() if k not in ("path", "levels")} for p in pols]
    assert [d for d, _ in budget.tree(old)] == [0] * 6
