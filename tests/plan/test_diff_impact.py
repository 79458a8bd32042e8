"""The pure parts of the plan: diff and impacts of two estates, no git involved."""

from __future__ import annotations

import pytest

from compiler.api import SourceFile, compile_files
from compiler.plan import Side, make_plan
from compiler.plan.impact import impacts
from compiler.plan.model import Impact, Plan, Revision
from compiler.plan.render_markdown import MAX_CHARS, render_markdown
from compiler.plan.render_text import render_text

BASE = """\
settings: {low_watermark: 15m}
pools:
  - name: onprem
    kind: baremetal
    capacity: 8
    gpu_type: h100
  - name: cloud
    kind: cloud
    gpu_type: h100
    autoscale:
      max: 16
profiles:
  - name: gpu1
    gpus: 1
    pools: [onprem, cloud]
    policies: [team-a, team-b]
  - name: any
    gpus: {from_task: gpus, max: 4}
    time_weight: 0
    pools: [onprem]
    policies: [team-a]
policies:
  - name: team-a
    group: team-a
    reservation: 2
    limit: 8
    budget: {hours: 100, period: week}
  - name: team-b
    group: team-b
    reservation: 1
    limit: 4
groups:
  - {name: team-a, users: [alice]}
  - {name: team-b, users: [bob]}
pricing:
  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}
"""


def side(text: str | None, label: str) -> Side:
    files = None if text is None else [SourceFile("estate/estate.yaml", text.encode())]
    return Side(label, None, files)


def plan_of(base: str | None, head: str | None) -> Plan:
    return make_plan(side(base, "base"), side(head, "head"), "estate")


def by_address(plan: Plan) -> dict:
    return {c.address: c for c in plan.changes}


def attrs(change) -> dict[str, tuple]:
    return {a.name: (a.op, a.before, a.after, a.pos.line if a.pos else None) for a in change.attrs}


def test_identical_estates_in_another_layout_are_no_changes() -> None:
    relaid = BASE.replace(
        "pools: [onprem, cloud]\n    policies: [team-a, team-b]",
        "policies: [team-a, team-b]\n    pools: [onprem, cloud]",
    )
    plan = plan_of(BASE, relaid + "\n# a comment\n")
    assert plan.changes == () and plan.exit_code == 0
    assert "No changes." in render_text(plan)


def test_a_pool_rename_is_one_change_and_its_references_follow() -> None:
    head = (
        BASE.replace("  - name: onprem\n", "  - name: fra-metal\n    renamed_from: onprem\n")
        .replace("[onprem, cloud]", "[fra-metal, cloud]")
        .replace("[onprem]", "[fra-metal]")
    )
    plan = plan_of(BASE, head)
    assert [(c.action, c.address, c.old_name) for c in plan.changes] == [
        ("rename", "pool.fra-metal", "onprem")
    ]
    assert plan.changes[0].attrs == ()
    assert plan.impacts == ()  # same pool set, same compute resources
    assert 'pool "onprem" → "fra-metal"' in render_text(plan)
    assert "Plan: 0 to add, 1 to change, 0 to remove." in render_text(plan)


def test_a_stale_renamed_from_is_ignored() -> None:
    head = BASE.replace("  - name: onprem\n", "  - name: onprem\n    renamed_from: old-onprem\n")
    assert plan_of(BASE, head).changes == ()


def test_a_policy_rename_renames_its_compute_resources() -> None:
    head = BASE.replace(
        "  - name: team-b\n    group: team-b",
        "  - name: bravo\n    renamed_from: team-b\n    group: team-b",
    ).replace("[team-a, team-b]", "[team-a, bravo]")
    plan = plan_of(BASE, head)
    assert [c.action for c in plan.changes] == ["rename"]
    [impact] = plan.impacts
    assert impact.kind == "compute-resource-renamed" and impact.severity == "warn"
    assert "team-b/gpu1 becomes bravo/gpu1" in impact.message


def test_effective_values_and_their_places() -> None:
    head = (
        BASE.replace("low_watermark: 15m", "low_watermark: 30m")
        .replace("max: 16", "max: 24")
        .replace("{from_task: gpus, max: 4}", "{from_task: gpus, default: 2, max: 4}")
    )
    plan = plan_of(BASE, head)
    changes = by_address(plan)
    assert attrs(changes["settings"]) == {"low_watermark": ("~", "15m", "30m", 1)}
    # a cloud pool's capacity is its autoscale max: cited at the max line
    assert attrs(changes["pool.cloud"]) == {
        "capacity": ("~", "16", "24", 11),
        "autoscale.max": ("~", "16", "24", 11),
    }
    assert attrs(changes["profile.any"]) == {"gpus.default": ("~", "1", "2", 18)}
    # team-a's budget inherits the low watermark: an effective change, cited at its budget
    assert attrs(changes["policy.team-a"]) == {"budget.low_watermark": ("~", "15m", "30m", 27)}
    kinds = {i.kind: i for i in plan.impacts}
    assert kinds["budget-low-watermark"].severity == "info"
    assert kinds["capacity-added"].message == "capacity of cloud raised: 16 -> 24 GPUs"


def test_budgets_weights_and_guarantees() -> None:
    head = (
        BASE.replace("budget: {hours: 100, period: week}", "budget: {hours: 100, period: day}")
        .replace(
            "    reservation: 1\n    limit: 4\n",
            "    reservation: 0\n    limit: 2\n    budget: {hours: 10, period: day}\n",
        )
        .replace("    time_weight: 0\n", "    time_weight: 0.5\n")
        .replace("    gpus: 1\n", "    gpus: 1\n    time_weight: 1.5\n")
    )
    found = {(i.kind, i.subject[1] if i.subject else None): i for i in plan_of(BASE, head).impacts}
    assert found[("budget-period", "team-a")].severity == "warn"
    assert found[("budget-added", "team-b")].severity == "warn"
    assert "can now wait for budget" in found[("budget-added", "team-b")].message
    assert found[("reservation-lowered", "team-b")].severity == "warn"
    assert found[("limit-lowered", "team-b")].severity == "info"
    weights = [i for i in plan_of(BASE, head).impacts if i.kind == "time-weight"]
    messages = {i.message: i.severity for i in weights}
    assert (
        messages[
            "each task of team-a on gpu1 now burns 1.5 instead of 1 budget hours per hour (+50%)"
        ]
        == "warn"
    )
    assert (
        messages[
            "each task of team-a on any now burns 0.5 instead of 0 budget hours per "
            "hour (was exempt)"
        ]
        == "warn"
    )
    # team-b gets its budget in the same change: the new rate is charged, so a warning too
    assert (
        messages[
            "each task of team-b on gpu1 now burns 1.5 instead of 1 budget hours per hour (+50%)"
        ]
        == "warn"
    )


def test_weight_on_a_policy_without_budget_is_info_and_budget_removed_is_info() -> None:
    head = BASE.replace("    budget: {hours: 100, period: week}\n", "").replace(
        "    gpus: 1\n", "    gpus: 1\n    time_weight: 3\n"
    )
    found = plan_of(BASE, head).impacts
    assert {i.severity for i in found if i.kind == "time-weight"} == {"info"}
    assert any(i.kind == "budget-removed" and i.severity == "info" for i in found)


def test_removals_warn_and_a_negative_headroom_is_an_error() -> None:
    base = compile_files([SourceFile("e.yaml", BASE.encode())]).estate
    assert base is not None
    # a head the compiler would reject, to check the grading does not rely on that
    head = base.model_copy(
        update={
            "pools": [
                p.model_copy(update={"capacity_milli": 1000}) if p.name == "onprem" else p
                for p in base.pools
                if p.name != "cloud"
            ],
        }
    )
    found = impacts(base, head)
    assert found[0].severity == "error"
    errors = {i.kind for i in found if i.severity == "error"}
    assert errors == {"reservation-headroom", "capacity-removed"}
    headroom = next(i for i in found if i.kind == "reservation-headroom" and i.severity == "error")
    assert "exceed the capacity by 2 GPUs" in headroom.message
    assert any(
        i.kind == "capacity-removed"
        and i.severity == "warn"
        and "pool cloud is removed" in i.message
        for i in found
    )


def test_an_error_impact_fails_the_plan() -> None:
    rev = Revision("x", None, "sha256:0")
    ok = Plan(rev, rev, "estate", impacts=(Impact("warn", "k", "m"),))
    bad = Plan(rev, rev, "estate", impacts=(Impact("error", "k", "m"),))
    assert ok.exit_code == 0 and bad.exit_code == 1


def test_absent_sides() -> None:
    added = plan_of(None, BASE)
    assert added.remove == 0 and added.add == len(added.changes) > 5
    assert any(c.address == "settings" and c.action == "create" for c in added.changes)
    removed = plan_of(BASE, None)
    assert removed.add == 0 and removed.remove == len(removed.changes)
    assert all(i.severity != "info" for i in removed.impacts if i.kind.endswith("-removed"))


def _huge(n: int, capacity: int) -> str:
    lines = ["pools:"]
    for i in range(n):
        lines.append(
            f"  - {{name: pool-{i:04d}, kind: kubernetes, capacity: {capacity}, "
            f"gpu_type: h100, labels: {{rack: r{i % 7}-{capacity}}}}}"
        )
    lines.append("profiles:")
    for i in range(n):
        lines.append(
            f"  - {{name: prof-{i:04d}, gpus: 1, pools: [pool-{i:04d}], policies: [team-{i:04d}]}}"
        )
    lines.append("policies:")
    for i in range(n):
        lines.append(
            f"  - {{name: team-{i:04d}, group: team-{i:04d}, reservation: 1, limit: {capacity}}}"
        )
    lines.append("groups:")
    for i in range(n):
        lines.append(f"  - {{name: team-{i:04d}, users: [user{i}]}}")
    return "\n".join(lines) + "\n"


@pytest.mark.slow  # long on its own: make test, not make check
def test_markdown_stays_under_the_comment_limit_for_a_huge_diff() -> None:
    plan = plan_of(_huge(400, 8), _huge(400, 4))
    assert len(plan.changes) == 800
    text = render_markdown(plan)
    assert len(text) < MAX_CHARS
    assert text.startswith("<!-- klique-plan -->\n")
    assert "Plan: 0 to add, 800 to change, 0 to remove." in text.splitlines()[3]
    assert "more lines not shown" in text
    assert text.count("<details>") == text.count("</details>")
    assert len(render_text(plan)) > MAX_CHARS  # the terminal gets everything


@pytest.mark.parametrize("limit", [3_000, 8_000, 20_000])
def test_markdown_respects_any_limit(limit: int) -> None:
    plan = plan_of(_huge(120, 8), _huge(120, 4))
    text = render_markdown(plan, max_chars=limit)
    assert len(text) < limit
    assert text.count("<details>") == text.count("</details>")
    assert text.count("```") % 2 == 0


def test_colour_changes_nothing_but_colour() -> None:
    import re

    plan = plan_of(BASE, BASE.replace("capacity: 8", "capacity: 6"))
    coloured = render_text(plan, colour=True)
    assert "\033[" in coloured
    assert re.sub(r"\033\[[0-9;]*m", "", coloured) == render_text(plan)


def test_json_attribute_values_are_typed_as_in_the_estate() -> None:
    """Issue 10, bug 7: ``"after": "8"`` was a string holding JSON; Terraform's plan JSON
    holds typed values, and so does this one."""
    from compiler.plan.render_json import plan_json

    head = (
        BASE.replace("capacity: 8", "capacity: 6")
        .replace(
            "budget: {hours: 100, period: week}",
            "budget: {hours: 100, period: week, low_watermark: 30m, alert_at: [0.5]}",
        )
        .replace("pools: [onprem, cloud]", "pools: [cloud, onprem]")
        .replace("per_gpu_hour: 2.5", "per_gpu_hour: 2.75")
        .replace("  - name: cloud\n", "  - name: cloud\n    labels: {site: fra1}\n")
    )
    got = {
        (c["address"], a["path"]): (a["before"], a["after"])
        for c in plan_json(plan_of(BASE, head))["changes"]
        for a in c["attributes"]
    }
    assert got[("pool.onprem", "capacity")] == (8, 6)
    assert got[("pool.cloud", "labels.site")] == (None, "fra1")
    assert got[("profile.gpu1", "pools")] == (["onprem", "cloud"], ["cloud", "onprem"])
    assert got[("policy.team-a", "budget.low_watermark")] == ("15m", "30m")
    assert got[("policy.team-a", "budget.alert_at")] == (None, [0.5])
    assert got[("price.h100@2026-01-01T00:00:00Z", "per_gpu_hour")] == (2.5, 2.75)


def test_a_failed_plan_counts_its_errors() -> None:
    """Issue 10, bug 7: a failed plan's summary said 0 errors."""
    from compiler.plan.render_json import plan_json

    head = BASE.replace("policies: [team-a, team-b]", "policies: [team-a, team-c]").replace(
        "limit: 4", "limit: x"
    )
    plan = plan_json(plan_of(BASE, head))
    assert plan["valid"] is False and plan["exit_code"] == 1
    assert (
        plan["summary"]["errors"]
        == 2
        == sum(d["severity"] == "error" for d in plan["head"]["diagnostics"])
    )


NOW = 1_790_000_000_000  # 2026-09-21T...Z: the plan's time in the price tests


def price_impacts_of(head_pricing: str) -> list[Impact]:
    head = BASE.replace(
        '  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}\n',
        head_pricing,
    )
    plan = make_plan(side(BASE, "base"), side(head, "head"), "estate", now_ms=NOW)
    assert plan.valid, plan.head.diagnostics
    return [i for i in plan.impacts if i.kind.startswith("price")]


def test_a_backdated_price_warns_naming_the_period_it_reprices() -> None:
    """Issue 10, bug 6: the ledger prices usage when it is read, so a price that takes effect
    in the past reprices usage already recorded; the plan says so."""
    [i] = price_impacts_of(
        '  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}\n'
        '  - {gpu_type: h100, per_gpu_hour: 3, effective_from: "2026-06-01T00:00:00Z"}\n'
    )
    assert i.severity == "warn" and i.kind == "price-backdated"
    assert i.message.startswith(
        "price of h100 from 2026-06-01T00:00:00Z: 2.5 EUR -> 3 EUR "
        "per GPU-hour (+20%); the usage already recorded from "
        "2026-06-01T00:00:00Z to 2026-09-21T"
    ), i.message
    assert i.details["before"] == "2.5" and i.details["after"] == "3"
    assert i.pos is not None and i.pos.line == 37  # the new price's line


def test_a_changed_amount_reprices_its_whole_past_period() -> None:
    [i] = price_impacts_of(
        '  - {gpu_type: h100, per_gpu_hour: 2.75, effective_from: "2026-01-01T00:00:00Z"}\n'
    )
    assert i.severity == "warn" and "from 2026-01-01T00:00:00Z to" in i.message


def test_a_future_price_is_information_with_old_and_new_price() -> None:
    [i] = price_impacts_of(
        '  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}\n'
        '  - {gpu_type: h100, per_gpu_hour: 2, effective_from: "2027-01-01T00:00:00Z"}\n'
    )
    assert (i.severity, i.kind) == ("info", "price-changed")
    assert i.message == (
        "price of h100 from 2027-01-01T00:00:00Z: 2.5 EUR -> 2 EUR per GPU-hour (-20%)"
    )


def test_a_removed_past_price_is_a_warning_too() -> None:
    [i] = price_impacts_of("")
    assert i.severity == "warn" and "2.5 EUR -> no price" in i.message
    assert i.side == "base"


def test_headroom_is_one_line_per_policy_before_and_after_when_a_pool_is_added() -> None:
    """Issue 10: pool sets that appear and disappear when a pool is added were hard to
    read; each policy's line says its pools and headroom before and after."""
    head = BASE.replace("pools: [onprem, cloud]", "pools: [onprem, cloud, extra]").replace(
        "profiles:\n",
        "  - {name: extra, kind: baremetal, capacity: 4, gpu_type: h100}\nprofiles:\n",
        1,
    )
    lines = [i for i in impacts_of(BASE, head) if i.kind == "reservation-headroom"]
    assert [i.details["policy"] for i in lines] == ["team-a", "team-b"]
    for i in lines:
        assert (
            "(capacity 24 -> 28 in [cloud, onprem] -> [cloud, extra, onprem], reserved 3 "
            "by [team-a, team-b])"
        ) in i.message, i.message
        assert i.details["pools"] == ["cloud", "extra", "onprem"]
        assert i.message.startswith(
            f"reservation headroom for {i.details['policy']}: 21 -> 25 GPUs"
        )


def impacts_of(base: str, head: str) -> list[Impact]:
    return list(plan_of(base, head).impacts)


def test_an_error_caused_away_from_the_change_is_also_reported_on_the_changed_lines() -> None:
    """Issue 10: an edit in one file reported only where the error shows (another file) never
    appears on the pull request's diff; the plan repeats it on the lines the change touched."""
    from compiler.plan.render_github import render_github

    pools = (
        "pools:\n  - name: onprem\n    kind: baremetal\n    capacity: 8\n"
        "    gpu_type: h100\n  - name: cloud\n    kind: cloud\n    gpu_type: h100\n"
        "    autoscale:\n      max: 16\n"
    )
    rest = BASE[BASE.index("profiles:") :].replace("settings: {low_watermark: 15m}\n", "")
    base = [
        SourceFile("estate/pools.yaml", pools.encode()),
        SourceFile("estate/rest.yaml", rest.encode()),
    ]
    head = [
        SourceFile(
            "estate/pools.yaml", pools.replace("  - name: cloud", "  - name: cloud2").encode()
        ),
        base[1],
    ]
    plan = make_plan(Side("main", None, base), Side("head", None, head), "estate")
    assert not plan.head.valid
    [err] = [d for d in plan.head.diagnostics if d.is_error]
    assert err.pos is not None and err.pos.file == "estate/rest.yaml"
    out = render_github(plan)
    assert (
        "::error file=estate/pools.yaml,line=6,title=klique plan%3A caused by this change::"
        f"this change causes: {err.message} at {err.pos}"
    ) in out, out
    text = render_text(plan)
    assert (
        "This error shows away from the lines the change touched (estate/pools.yaml:6); "
        "the change causes it." in text
    ), text


DEPARTMENT = BASE.replace(
    "policies:\n", "policies:\n  - {name: dept, group: dept, reservation: 4, limit: 12}\n", 1
).replace(
    "  - {name: team-a, users: [alice]}\n  - {name: team-b, users: [bob]}\n",
    "  - {name: dept}\n  - {name: team-a, parent: dept, users: [alice]}\n"
    "  - {name: team-b, parent: dept, users: [bob]}\n",
)


def test_headroom_counts_a_departments_shared_reservation_once_in_its_teams_pools() -> None:
    """Issue 12: an envelope reserves for its teams, so only its shared part (4 - 2 - 1) is a
    demand of its own, served by its teams' pools; its whole reservation on top of its
    teams' would report headroom that is not lost."""
    head = DEPARTMENT.replace("pools: [onprem, cloud]", "pools: [onprem, cloud, extra]").replace(
        "profiles:\n",
        "  - {name: extra, kind: baremetal, capacity: 4, gpu_type: h100}\nprofiles:\n",
        1,
    )
    found = impacts_of(DEPARTMENT, head)
    assert not [i for i in found if i.severity == "error"], [i.message for i in found]
    lines = [i for i in found if i.kind == "reservation-headroom"]
    assert [i.details["policy"] for i in lines] == ["dept", "team-a", "team-b"]
    for i in lines:
        assert "reserved 4 by [dept, team-a, team-b]" in i.message, i.message
        assert ": 20 -> 24 GPUs" in i.message, i.message


def test_the_diff_shows_user_limit_and_project_priority_in_the_listed_order() -> None:
    """Issue 12: a change to who may use how much of a team's share, or to which project
    goes first, is what a team lead's review is about; the plan must show it."""
    head = BASE.replace(
        "    reservation: 1\n    limit: 4\n",
        "    reservation: 1\n    limit: 4\n    user_limit: 2\n",
    ).replace(
        "{name: team-b, users: [bob]}",
        "{name: team-b, users: [bob], projects: [zeta, alpha], project_priority: true}",
    )
    changes = {c.address: c for c in plan_of(BASE, head).changes}
    attrs = {".".join(a.path): (a.op, a.before, a.after) for a in changes["policy.team-b"].attrs}
    assert attrs == {"user_limit": ("+", None, "2")}
    attrs = {".".join(a.path): (a.op, a.before, a.after) for a in changes["group.team-b"].attrs}
    assert attrs == {
        "projects": ("+", None, "[zeta, alpha]"),
        "project_priority": ("+", None, "true"),
    }


def test_a_backdated_price_says_a_tiny_usage_in_decimals() -> None:
    """The GPU-hours recorded read as people write them (``0.000095``), never in Python's
    ``:g`` exponent form (``9.5e-05``), which a fresh clone's run met in a plan's message."""
    from compiler.plan.live import LiveState
    from compiler.plan.prices import price_impacts

    head = BASE.replace(
        '  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}\n',
        '  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}\n'
        '  - {gpu_type: h100, per_gpu_hour: 3, effective_from: "2026-09-01T00:00:00Z"}\n',
    )
    b = compile_files([SourceFile("estate/estate.yaml", BASE.encode())]).estate
    h = compile_files([SourceFile("estate/estate.yaml", head.encode())]).estate
    assert b is not None and h is not None
    live = LiveState(
        "test", b.revision, "2026-09-21T00:00:00Z", NOW, {}, {}, {}, {"h100": {"2026-09": 0.000095}}
    )
    [i] = [i for i in price_impacts(b, h, NOW, live) if i.kind == "price-backdated"]
    assert ": 0.000095 GPU-hours recorded" in i.message, i.message
    assert "e-0" not in i.message
