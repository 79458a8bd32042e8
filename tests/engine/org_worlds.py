"""Small hierarchical estates and timelines for hypothesis (organisation.md).

An estate is written as IT writes one (pools, profiles, policies, groups) and compiled by the
real compiler, so the levels, ancestors and project orders the engine and the reference read
are the compiler's; an estate the compiler refuses is discarded (``assume``). Trees are two or
three levels deep (business unit > department > team), envelopes may have a reservation (with
a shared part), a limit and a budget or no policy at all, teams may have budgets, user limits
and project priority, and a team may sit at the top beside the departments. Every
combination of lending.md's settings is drawn: order ordered or fair, protect_for 0 or not (in
the settings and per team), victims newest or least_lost_work, lend_weight on teams and
envelopes; tasks may checkpoint. Timelines submit with users and projects, end tasks, and
may move a team to another parent or change the lending settings mid-run.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import assume, note
from hypothesis import strategies as st

from compiler.api import SourceFile, compile_files
from compiler.compiled import CompiledEstate

USERS = ("u0", "u1")
PROJECTS = ("a", "b", "c")

Step = tuple[int, list[tuple[bool, int, float | None, int, int]]]
"""Minutes after the previous step; actions (submit?, which, gpus, user, project)."""

Checkpoints = tuple[int, ...]
"""Task number n checkpoints every ``checkpoints[n % len]`` minutes (0: never)."""


def compile_doc(doc: dict[str, Any]) -> CompiledEstate | None:
    """The estate the compiler builds from ``doc`` (JSON is YAML), or None if it refuses."""
    res = compile_files([SourceFile("estate.yaml", json.dumps(doc).encode())])
    return res.estate


@st.composite
def budgets(draw, p: float) -> dict[str, Any] | None:
    if draw(st.floats(0, 1)) >= p:
        return None
    return {"hours": draw(st.sampled_from([0.1, 0.3, 1, 3])), "period": "day"}


@st.composite
def lending_settings(draw) -> dict[str, Any]:
    """settings.lending as IT writes it: every combination of order, protect_for and
    victims (lending.md)."""
    return {
        "order": draw(st.sampled_from(["ordered", "fair"])),
        "protect_for": draw(st.sampled_from(["0s", "0s", "90s", "5m", "20m"])),
        "victims": draw(st.sampled_from(["newest", "least_lost_work"])),
    }


def lend_weights() -> st.SearchStrategy[float | None]:
    return st.sampled_from([None, None, 0.5, 1, 2, 3])


@st.composite
def org_estates(draw) -> CompiledEstate:
    return draw(org_docs())[1]


@st.composite
def org_docs(draw, borrowing: bool = False) -> tuple[dict[str, Any], CompiledEstate]:
    """An estate as IT writes it, and as the compiler builds it. ``borrowing``: teams with
    room to borrow (limits up to 6, few budgets), every team on every profile, and fair
    order, so phase 4 rebalances often (lending.md)."""
    pools = [
        {
            "name": f"p{i}",
            "kind": "baremetal",
            "capacity": draw(st.integers(2, 6)),
            "gpu_type": "h100",
        }
        for i in range(draw(st.integers(1, 3)))
    ]
    groups: list[dict[str, Any]] = []
    policies: list[dict[str, Any]] = []
    teams: list[str] = []
    counter = [0]

    def team(parent: str | None) -> int:
        """A team with its policy; returns its reservation (milli-free GPUs)."""
        name = f"t{counter[0]}"
        counter[0] += 1
        g: dict[str, Any] = {"name": name, "users": list(USERS)}
        if parent:
            g["parent"] = parent
        if draw(st.booleans()):
            g["projects"] = list(draw(st.permutations(PROJECTS)))
            g["project_priority"] = draw(st.booleans())
        groups.append(g)
        res = draw(st.sampled_from([0, 0, 1, 1, 2]))
        limit = draw(st.integers(max(res, 2), 6 if borrowing else 5))
        pol: dict[str, Any] = {"name": name, "group": name, "reservation": res, "limit": limit}
        if draw(st.integers(0, 2)) == 0:
            pol["user_limit"] = draw(st.integers(2, limit))
        b = draw(budgets(0.1 if borrowing else 0.4))
        if b:
            pol["budget"] = b
        w = draw(lend_weights())
        if w is not None:
            pol["lend_weight"] = w
        if draw(st.integers(0, 3)) == 0:
            pol["protect_for"] = draw(st.sampled_from(["0s", "5m", "30m"]))
        policies.append(pol)
        teams.append(name)
        return res

    def envelope(parent: str | None, depth: int) -> int:
        """A department (depth 1: teams below) or business unit (depth 2); returns the
        reservation its parent counts: its own, or its nearest policies' below."""
        name = f"d{counter[0]}"
        counter[0] += 1
        g: dict[str, Any] = {"name": name}
        if parent:
            g["parent"] = parent
        groups.append(g)
        below = 0
        for _ in range(draw(st.integers(1, 2))):
            below += team(name) if depth == 1 else envelope(name, depth - 1)
        if draw(st.integers(0, 4)) == 0:
            return below  # a group with no policy: it only groups others
        res = below + draw(st.integers(0, 1))
        pol: dict[str, Any] = {
            "name": name,
            "group": name,
            "reservation": res,
            "limit": draw(st.integers(max(res, 2), max(res, 8))),
        }
        b = draw(budgets(0.1 if borrowing else 0.5))
        if b:
            pol["budget"] = b
        w = draw(lend_weights())
        if w is not None:
            pol["lend_weight"] = w
        policies.append(pol)
        return res

    depth = draw(st.integers(1, 2))
    for _ in range(draw(st.integers(1, 2))):
        envelope(None, depth)
    if draw(st.booleans()):
        team(None)
    profiles = []
    for j in range(draw(st.integers(1, 3))):
        pl = draw(st.permutations([p["name"] for p in pools]))
        pl = pl[: draw(st.integers(1, len(pl)))]
        pols = draw(st.permutations(teams))
        if not borrowing:  # borrowing: every team on every profile, so teams compete
            pols = pols[: draw(st.integers(1, len(pols)))]
        prof: dict[str, Any] = {
            "name": f"r{j}",
            "pools": pl,
            "policies": pols,
            "time_weight": draw(st.sampled_from([0, 1, 2])),
            "queueing": draw(st.sampled_from(["strict", "best_effort"])),
        }
        if draw(st.booleans()):
            prof["gpus"] = {"from_task": "gpus", "default": 1, "max": 2}
        else:
            prof["gpus"] = draw(st.sampled_from([0.5, 1, 2]))
        profiles.append(prof)
    lending = draw(lending_settings())
    if borrowing:
        lending["order"] = "fair"
    doc = {
        "settings": {"lending": lending},
        "pools": pools,
        "profiles": profiles,
        "policies": policies,
        "groups": groups,
    }
    estate = compile_doc(doc)
    assume(estate is not None)
    note(f"estate: {json.dumps(doc)}")
    assert estate is not None
    return doc, estate


def steps(max_gap: int = 60) -> st.SearchStrategy[list[Step]]:
    return st.lists(
        st.tuples(
            st.integers(0, max_gap),
            st.lists(
                st.tuples(
                    st.integers(0, 3).map(bool),
                    st.integers(0, 999),
                    st.sampled_from([None, 0.5, 1, 2]),
                    st.integers(0, 1),
                    st.integers(0, 3),
                ),
                min_size=1,
                max_size=6,
            ),
        ),
        min_size=1,
        max_size=8,
    )


Changes = dict[int, CompiledEstate]
"""Before step i (its index in the timeline), the estate becomes this one."""


@st.composite
def moves(draw, doc: dict[str, Any], n_steps: int) -> Changes:
    """Up to two teams moved to another parent (an envelope or the top) during the run
    (organisation.md, estate changes), and sometimes new lending settings (lending.md: a
    changed protect_for applies at once); a change the compiler refuses is left out."""
    changes: Changes = {}
    teams = [g for g in doc["groups"] if "users" in g]
    parents = [None] + [g["name"] for g in doc["groups"] if "users" not in g]
    current = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, n_steps - 1))
        name = draw(st.sampled_from(teams))["name"]
        to = draw(st.sampled_from(parents))
        moved = json.loads(json.dumps(current))
        for g in moved["groups"]:
            if g["name"] == name:
                g.pop("parent", None)
                if to is not None:
                    g["parent"] = to
        estate = compile_doc(moved)
        if estate is not None and at not in changes:
            changes[at] = estate
            current = moved
            note(f"before step {at}: {name} moves to {to or 'the top'}")
    if draw(st.integers(0, 2)) == 0:
        at = draw(st.integers(0, n_steps - 1))
        retuned = json.loads(json.dumps(current))
        retuned["settings"] = {"lending": draw(lending_settings())}
        estate = compile_doc(retuned)
        if estate is not None and at not in changes:
            changes[at] = estate
            note(f"before step {at}: settings become {retuned['settings']}")
    return changes


@st.composite
def org_worlds(
    draw, borrowing: bool = False
) -> tuple[CompiledEstate, list[Step], Changes, Checkpoints]:
    doc, estate = draw(org_docs(borrowing))
    timeline = draw(steps())
    note(f"steps: {timeline}")
    changes = draw(moves(doc, len(timeline)))
    checkpoints = tuple(draw(st.lists(st.sampled_from([0, 0, 7, 15, 30]), min_size=1, max_size=4)))
    return estate, timeline, changes, checkpoints


def apply_actions(index, state, actions, now: int, n: int, checkpoints: Checkpoints = ()) -> int:
    """Submits (with a user and a project of the group, and ``checkpoints``' interval) or ends
    tasks; returns the next id number."""
    crs = sorted(index.estate.compute_resources, key=lambda c: c.name)
    groups = {g.name: g for g in index.estate.groups}
    profiles = {p.name: p for p in index.estate.profiles}
    for submit, k, gpus, user, project in actions:
        if submit:
            cr = crs[k % len(crs)]
            fixed = profiles[cr.profile].from_task is None
            g = None if fixed or gpus is None else round(gpus * 1000)
            # project 3: a task of no project (last under project priority)
            projects = groups[cr.group].projects
            proj = projects[project] if project < len(projects) else None
            every = checkpoints[n % len(checkpoints)] * 60_000 if checkpoints else None
            state.submit(f"t{n}", cr.name, USERS[user], proj, g, at=now, checkpoint_ms=every)
            n += 1
        elif state.tasks:
            tid = sorted(state.tasks)[k % len(state.tasks)]
            state.end(tid, now)
    return n


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Fails the example (rather than hanging the suite) when the engine does not return:
    a pass that loops is a finding, not a reason to wait forever."""

    def expired(signum: int, frame: Any) -> None:
        raise AssertionError(f"no answer within {seconds} s: the engine loops")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
