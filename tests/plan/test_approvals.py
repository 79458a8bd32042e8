"""Who approves each change, and the envelopes a change touches (organisation.md)."""

from __future__ import annotations

from compiler.api import SourceFile
from compiler.plan import Side, make_plan
from compiler.plan.model import Plan
from tests.harness.typed import present

ORG = """\
settings:
  forge_handles: {ursula: "@ursula-nw", trent: "@northwind/it"}
pools:
  - {name: onprem, kind: baremetal, capacity: 32, gpu_type: h100}
profiles:
  - name: gpu1
    gpus: 1
    pools: [onprem]
    policies: [fin, cust, ops]
policies:
  - {name: digital, group: digital, reservation: 8, limit: 20,
     budget: {hours: 3000, period: month}}
  - {name: fin, group: fin, reservation: 2, limit: 8}
  - {name: cust, group: cust, reservation: 4, limit: 16}
  - {name: platform, group: platform, limit: 8}
  - {name: ops, group: ops, limit: 4}
groups:
  - {name: northwind, admins: [trent]}
  - {name: commercial, parent: northwind, admins: [victor]}
  - {name: digital, parent: commercial, admins: [ursula]}
  - {name: fin, parent: digital, users: [rupert], admins: [rupert]}
  - {name: cust, parent: digital, users: [mallory], admins: [mallory]}
  - {name: platform, parent: northwind, admins: [pat]}
  - {name: ops, parent: platform, users: [oz]}
"""


def plan_of(base: str, head: str) -> Plan:
    def side(text: str, label: str) -> Side:
        return Side(label, None, [SourceFile("estate/estate.yaml", text.encode())])

    plan = make_plan(side(base, "base"), side(head, "head"), "estate")
    assert plan.valid, plan.head.diagnostics
    return plan


def approvers(plan: Plan, address: str) -> list[str]:
    found = [a for a in plan.approvals if a.address == address]
    assert found, [a.address for a in plan.approvals]
    return [p.user for p in found[0].approvers]


def test_team_change_needs_the_team_and_every_group_above() -> None:
    plan = plan_of(ORG, ORG.replace("reservation: 4, limit: 16", "reservation: 4, limit: 18"))
    assert approvers(plan, "policy.cust") == ["mallory", "ursula", "victor", "trent"]
    roles = {p.user: (p.role, p.group, p.handle) for p in plan.approvals[0].approvers}
    assert roles["ursula"] == ("above", "digital", "@ursula-nw")
    assert roles["mallory"] == ("group", "cust", None)


def test_moving_a_team_needs_both_departments() -> None:
    head = ORG.replace("{name: ops, parent: platform,", "{name: ops, parent: digital,")
    plan = plan_of(ORG, head)
    assert set(approvers(plan, "group.ops")) == {"ursula", "victor", "trent", "pat"}
    # Both envelopes' figures move: digital gains ops's limit, platform loses it.
    rows = {r.name: r for r in plan.envelopes}
    assert present(rows["digital"].before).team_limits_milli == 24000
    assert present(rows["digital"].after).team_limits_milli == 28000
    assert rows["platform"].before is not None and rows["platform"].after is None


def test_shared_objects_go_to_it_and_a_profile_to_its_groups_too() -> None:
    plan = plan_of(
        ORG,
        ORG.replace("capacity: 32", "capacity: 40").replace(
            "policies: [fin, cust, ops]", "policies: [cust, fin, ops]"
        ),
    )
    assert approvers(plan, "pool.onprem") == ["trent"]
    assert plan.approvals[0].approvers[0].role == "it"
    assert set(approvers(plan, "profile.gpu1")) == {
        "mallory",
        "rupert",
        "ursula",
        "victor",
        "trent",
        "pat",
    }
    assert plan.envelopes == ()  # a pool or profile changes no envelope's figures


def test_settings_approvers_replace_the_top_groups_admins() -> None:
    base = ORG.replace("settings:\n", "settings:\n  approvers: [ian]\n")
    plan = plan_of(base, base.replace("capacity: 32", "capacity: 40"))
    assert approvers(plan, "pool.onprem") == ["ian"]
    assert plan.approvals[0].approvers[0].group is None


def test_envelope_figures_before_and_after() -> None:
    plan = plan_of(ORG, ORG.replace("reservation: 4, limit: 16", "reservation: 6, limit: 20"))
    (row,) = [r for r in plan.envelopes if r.name == "digital"]
    assert row.before is not None and row.after is not None
    assert (row.before.shared_milli, row.after.shared_milli) == (2000, 0)
    assert (row.before.team_limits_milli, row.after.team_limits_milli) == (24000, 28000)
    assert row.before.oversubscription == 1.2 and row.after.oversubscription == 1.4
    assert row.after.budget_hours_milli == 3_000_000 and row.after.budget_period == "month"
    assert [r.name for r in plan.envelopes] == ["digital"]


def test_flat_estate_without_admins_names_nobody_and_says_how() -> None:
    flat = """\
pools: [{name: p, kind: baremetal, capacity: 8, gpu_type: h100}]
profiles: [{name: g, gpus: 1, pools: [p], policies: [a]}]
policies: [{name: a, group: a, limit: 4}]
groups: [{name: a, users: [al]}]
"""
    from compiler.plan.render_text import render_text

    plan = plan_of(flat, flat.replace("capacity: 8", "capacity: 9"))
    assert approvers(plan, "pool.p") == []
    assert "nobody named: set settings.approvers" in render_text(plan)


def test_handles_are_review_data_not_a_new_revision() -> None:
    """The engine never reads handles or approvers: editing them makes no plan change."""
    head = ORG.replace('ursula: "@ursula-nw"', 'ursula: "@ursula"').replace(
        "settings:\n", "settings:\n  approvers: [ian]\n"
    )
    plan = plan_of(ORG, head)
    assert plan.base.estate_revision == plan.head.estate_revision
    assert plan.changes == () and plan.approvals == ()


def test_a_renamed_envelope_is_one_row_with_both_sides() -> None:
    head = ORG.replace(
        "{name: digital, group: digital, reservation: 8, limit: 20,",
        "{name: digital-products, renamed_from: digital, group: digital,\n"
        "     reservation: 8, limit: 24,",
    )
    plan = plan_of(ORG, head)
    (row,) = plan.envelopes
    assert row.name == "digital-products"
    assert (present(row.before).limit_milli, present(row.after).limit_milli) == (20000, 24000)
