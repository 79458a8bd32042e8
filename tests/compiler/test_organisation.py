"""Departments, business units and teams (organisation.md): what the compiled estate carries
for the engine, and the checks that need more than one golden case to pin down."""

from __future__ import annotations

import json
from pathlib import Path

from compiler.api import compile_dir
from tests.harness.typed import present

from .helpers import MINIMAL, codes, compile_text

TREE = """\
pools:
  - {name: fra, kind: kubernetes, capacity: 64, gpu_type: h100}
  - {name: ams, kind: kubernetes, capacity: 16, gpu_type: h100}
profiles:
  - {name: one, gpus: 1, pools: [fra], policies: [team-a, team-b, solo]}
  - {name: far, gpus: 1, pools: [ams], policies: [team-c]}
policies:
  - {name: unit, group: unit, reservation: 30, limit: 60}
  - {name: research, group: research, reservation: 20, limit: 40,
     budget: {hours: 1000, period: month}}
  - {name: team-a, group: team-a, reservation: 8, limit: 24, user_limit: 4}
  - {name: team-b, group: team-b, reservation: 4, limit: 16}
  - {name: team-c, group: team-c, reservation: 2, limit: 8}
  - {name: solo, group: solo, reservation: 1, limit: 4}
groups:
  - {name: company}
  - {name: unit, parent: company}
  - {name: research, parent: unit}
  - {name: team-a, parent: research, projects: [zeta, alpha, zeta], project_priority: true}
  - {name: team-b, parent: research, projects: [zeta, alpha]}
  - {name: team-c, parent: unit}
  - {name: solo}
pricing:
  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}
"""


def test_the_compiled_tree_has_levels_envelopes_and_shared_reservations() -> None:
    result = compile_text(TREE)
    assert result.ok, [d.render() for d in result.diagnostics]
    est = result.estate
    assert est is not None
    pol = {p.name: p for p in est.policies}
    assert pol["team-a"].levels == ["team-a", "research", "unit"]
    assert pol["team-c"].levels == ["team-c", "unit"]
    assert pol["research"].levels == ["research", "unit"]
    assert pol["solo"].levels == ["solo"]
    assert {n for n, p in pol.items() if p.envelope} == {"unit", "research"}
    assert pol["research"].below == ["team-a", "team-b"]
    assert pol["unit"].below == ["research", "team-c"]
    # research: 20 - (8 + 4); unit: 30 - (20 + 2); a team shares nothing.
    assert pol["research"].shared_reservation_milli == 8000
    assert pol["unit"].shared_reservation_milli == 8000
    assert pol["team-a"].shared_reservation_milli == 0
    assert pol["team-a"].user_limit_milli == 4000
    assert pol["team-b"].user_limit_milli is None
    # No compute resource is made for an envelope.
    assert {c.policy for c in est.compute_resources} == {"team-a", "team-b", "team-c", "solo"}
    grp = {g.name: g for g in est.groups}
    assert grp["team-a"].project_priority is True
    assert grp["team-a"].project_order == ["zeta", "alpha"]  # as listed, duplicates dropped
    assert grp["team-a"].projects == ["alpha", "zeta"]
    assert grp["team-b"].project_order == []  # no priority: submission order only


def test_a_flat_estate_compiles_with_neutral_new_fields() -> None:
    est = compile_text(MINIMAL).estate
    assert est is not None
    data = json.loads(est.canonical_json())
    (policy,) = data["policies"]
    assert policy["envelope"] is False and policy["levels"] == ["team-a"]
    assert policy["below"] == [] and policy["shared_reservation_milli"] == 0
    assert policy["user_limit_milli"] is None
    (group,) = data["groups"]
    assert group["project_priority"] is False and group["project_order"] == []


def test_compiled_json_without_the_new_fields_still_loads() -> None:
    """A compiled estate written before departments (the daemon's last good revision) is
    read with the neutral values."""
    from compiler.compiled import CompiledEstate

    est = compile_text(MINIMAL).estate
    assert est is not None
    data = json.loads(est.canonical_json())
    for key in ("envelope", "levels", "below", "shared_reservation_milli", "user_limit_milli"):
        del data["policies"][0][key]
    for key in ("project_priority", "project_order"):
        del data["groups"][0][key]
    old = CompiledEstate.from_json(json.dumps(data))
    assert old.policies[0].envelope is False and old.groups[0].project_order == []


def test_reservations_exactly_at_the_envelope_are_fine_and_one_more_is_an_error() -> None:
    at = TREE.replace("reservation: 20, limit: 40", "reservation: 12, limit: 40")
    assert "envelope-reservation-exceeded" not in codes(compile_text(at))
    over = TREE.replace("reservation: 20, limit: 40", "reservation: 11.5, limit: 40")
    result = compile_text(over)
    (d,) = [d for d in result.diagnostics if d.code == "envelope-reservation-exceeded"]
    assert "team-a 8 GPUs, team-b 4 GPUs" in d.message and "over by 0.5 GPUs" in d.message
    assert d.pos is not None and (d.pos.line, d.pos.col) == (9, 52)


def test_a_shared_reservation_may_be_served_by_any_pool_of_the_subtree() -> None:
    # unit keeps 8 GPUs for research and team-c; team-c alone reaches ams (16), so moving
    # the whole shared part there fits, while the fra side is full.
    full = TREE.replace("capacity: 64", "capacity: 21")
    assert "reservations-do-not-fit" not in codes(compile_text(full))
    short = full.replace("capacity: 16", "capacity: 9")
    result = compile_text(short)
    (d,) = [d for d in result.diagnostics if d.code == "reservations-do-not-fit"]
    assert "unit (shared 8 GPUs)" in d.message and "research (shared 8 GPUs)" in d.message


def test_a_cycle_of_parents_with_policies_gives_one_clear_error() -> None:
    text = MINIMAL.replace(
        "{name: team-a, users: [alice]}",
        "{name: team-a, parent: dept}\n  - {name: dept, parent: team-a}",
    )
    text = text.replace(
        "  - {name: team-a, group: team-a, reservation: 2, limit: 8}",
        "  - {name: team-a, group: team-a, reservation: 2, limit: 8}\n"
        "  - {name: dept, group: dept, limit: 8}",
    )
    result = compile_text(text)
    assert sorted(codes(result)) == ["group-cycle", "unused-policy"]
    (cycle,) = [d for d in result.diagnostics if d.code == "group-cycle"]
    assert "dept → team-a → dept" in cycle.message


def test_the_example_estate_has_a_department_budget_shared_by_teams_without_one() -> None:
    result = compile_dir(Path(__file__).resolve().parents[2] / "estate")
    assert result.ok and not result.diagnostics, [d.render() for d in result.diagnostics]
    est = result.estate
    assert est is not None
    # A business unit: below the top, with departments that have teams below them.
    depth = {g.name: len(g.ancestors) for g in est.groups}
    units = {a for g in est.groups if depth[g.name] == 3 for a in g.ancestors if depth[a] == 1}
    assert units == {"science", "commercial"}
    shared_budget = [
        p
        for p in est.policies
        if p.envelope
        and p.budget is not None
        and p.below
        and all(present(est.policy(b)).budget is None for b in p.below)
    ]
    assert shared_budget, "no department whose budget is shared by teams without one"
