"""The plan misses nothing (issue 25, item 7): for a random valid estate and a random change
of any field of any section, the plan is empty exactly when the revision is unchanged.

An estate is written as IT writes one (every section, the extensions included) and compiled
by the real compiler; a change the compiler refuses is discarded (``assume``). ``MUTATIONS``
changes one field each, to a value drawn from a small set that includes the current one (so
"no change" is tried too); ``test_every_compiled_field_is_mutated`` fails when the compiled
estate gains a field that no mutation here reaches, so the property keeps covering it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from compiler import compiled as c
from compiler.api import SourceFile, compile_files
from compiler.compiled import CompiledEstate
from compiler.plan import Side, make_plan
from compiler.plan.render_text import render_text
from tests.harness.examples import examples

Doc = dict[str, Any]
Draw = Callable[[st.SearchStrategy[Any]], Any]


def compile_doc(doc: Doc) -> CompiledEstate | None:
    return compile_files([SourceFile("estate/estate.yaml", json.dumps(doc).encode())]).estate


def side(doc: Doc, label: str) -> Side:
    return Side(label, None, [SourceFile("estate/estate.yaml", json.dumps(doc).encode())])


@st.composite
def docs(draw: Draw) -> Doc:
    """A small valid estate using every section: a department over two teams, a bare-metal
    pool with machines and a cloud pool, a fixed and a task-sized profile, alerts, prices."""
    cap = draw(st.sampled_from([8, 16]))
    onprem: Doc = {
        "name": "onprem",
        "kind": "baremetal",
        "capacity": cap,
        "gpu_type": "h100",
        "gpu_memory_gb": 80,
        "generation": 2023,
        "labels": {"country": "de"},
        "settings": {"partition": "gpu"},
    }
    if draw(st.booleans()):
        onprem["nodes"] = {"count": cap // 4, "gpus": 4}
    cloud: Doc = {
        "name": "cloud",
        "kind": "cloud",
        "gpu_type": "h100",
        "autoscale": {"max": 16, "idle_timeout": "10m", "spot_first": True},
    }
    fixed: Doc = {
        "name": "gpu1",
        "gpus": 1,
        "pools": ["onprem", "cloud"],
        "policies": ["team-a", "team-b"],
    }
    sized: Doc = {
        "name": "any",
        "gpus": {"from_task": "gpus", "default": 1, "max": 2},
        "pools_by": {"min_gpu_memory_gb": 40},
        "policies": ["team-a"],
    }
    doc: Doc = {
        "settings": {"pass_interval": "1s", "low_watermark": "15m", "currency": "EUR"},
        "pools": [onprem, cloud],
        "profiles": draw(st.permutations([fixed, sized])),
        "policies": [
            {"name": "dept", "group": "dept", "reservation": 2, "limit": 8},
            {
                "name": "team-a",
                "group": "team-a",
                "reservation": 1,
                "limit": 4,
                "budget": {"hours": 100, "period": "week", "alert_at": [0.8]},
            },
            {"name": "team-b", "group": "team-b", "reservation": 1, "limit": 4},
        ],
        "groups": [
            {"name": "dept", "admins": ["dana"]},
            {
                "name": "team-a",
                "parent": "dept",
                "users": ["alice"],
                "admins": ["carol"],
                "projects": ["llm", "vision"],
            },
            {"name": "team-b", "parent": "dept", "users": ["bob"]},
        ],
        "pricing": [
            {"gpu_type": "h100", "per_gpu_hour": 2.5, "effective_from": "2026-01-01T00:00:00Z"}
        ],
    }
    if draw(st.booleans()):
        doc["settings"]["alerts"] = {
            "it": ["ops@example.org"],
            "contacts": {"carol": "carol@example.org"},
            "channels": [
                {"name": "ops", "kind": "webhook", "url": "https://alerts.example.org/klique"}
            ],
        }
    if draw(st.booleans()):
        doc["settings"]["attribution"] = {"reserved_idle": "group"}
    return doc


def _pool(doc: Doc, name: str) -> Doc:
    return next(p for p in doc["pools"] if p["name"] == name)


def _named(doc: Doc, section: str, name: str) -> Doc:
    return next(o for o in doc[section] if o["name"] == name)


def _alerts(doc: Doc) -> Doc:
    return doc["settings"].setdefault("alerts", {})


def _channel(doc: Doc) -> Doc:
    chans = _alerts(doc).setdefault("channels", [])
    if not chans:
        chans.append({"name": "ops", "kind": "webhook", "url": "https://alerts.example.org/k"})
    ch: Doc = chans[0]
    return ch


def _set(getter: Callable[[Doc], Doc], key: str, values: list[Any]) -> Callable[[Doc, Draw], None]:
    def mutate(doc: Doc, draw: Draw) -> None:
        value = draw(st.sampled_from(values))
        if value is None:
            getter(doc).pop(key, None)
        else:
            getter(doc)[key] = value

    return mutate


def _settings(doc: Doc) -> Doc:
    s: Doc = doc["settings"]
    return s


def _attribution(doc: Doc) -> Doc:
    a: Doc = doc["settings"].setdefault("attribution", {})
    return a


def _lending(doc: Doc) -> Doc:
    lend: Doc = doc["settings"].setdefault("lending", {})
    return lend


def _identity(doc: Doc) -> Doc:
    ident: Doc = doc["settings"].setdefault("identity", {})
    return ident


PROVIDER = {"name": "corp", "issuer": "https://login.example.org", "audience": "klique"}
WORKLOAD = {
    "name": "github",
    "issuer": "https://token.actions.githubusercontent.com",
    "audience": "klique",
    "claims": {"repository": "org/estate"},
}


def _provider(doc: Doc) -> Doc:
    provs = _identity(doc).setdefault("providers", [])
    if not provs:
        provs.append(dict(PROVIDER))
    p: Doc = provs[0]
    return p


def _workload(doc: Doc) -> Doc:
    loads = _identity(doc).setdefault("workloads", [])
    if not loads:
        loads.append(copy.deepcopy(WORKLOAD))
    w: Doc = loads[0]
    return w


def _autoscale(doc: Doc) -> Doc:
    a: Doc = _pool(doc, "cloud")["autoscale"]
    return a


def _team_a(doc: Doc) -> Doc:
    return _named(doc, "policies", "team-a")


def _budget(doc: Doc) -> Doc:
    b: Doc = _team_a(doc).setdefault("budget", {"hours": 100, "period": "week"})
    return b


def _group_a(doc: Doc) -> Doc:
    return _named(doc, "groups", "team-a")


def _price(doc: Doc) -> Doc:
    p: Doc = doc["pricing"][0]
    return p


def _onprem(doc: Doc) -> Doc:
    return _pool(doc, "onprem")


def _fixed(doc: Doc) -> Doc:
    return _named(doc, "profiles", "gpu1")


def _sized(doc: Doc) -> Doc:
    return _named(doc, "profiles", "any")


def _add_pool(doc: Doc, draw: Draw) -> None:
    doc["pools"].append(
        {
            "name": "extra",
            "kind": draw(st.sampled_from(["hpc", "kubernetes"])),
            "capacity": 4,
            "gpu_type": "h100",
        }
    )


def _reorder_profiles(doc: Doc, draw: Draw) -> None:
    doc["profiles"] = draw(st.permutations(doc["profiles"]))


def _move_team(doc: Doc, draw: Draw) -> None:
    if draw(st.booleans()):
        _group_a(doc).pop("parent", None)
    else:
        _group_a(doc)["parent"] = "dept"


def _regroup(doc: Doc, draw: Draw) -> None:
    """team-b's policy moves to a new group (or stays), the group added either way."""
    doc["groups"].append({"name": "loose", "parent": "dept"})
    _named(doc, "policies", "team-b")["group"] = draw(st.sampled_from(["team-b", "loose"]))


def _add_price(doc: Doc, draw: Draw) -> None:
    doc["pricing"].append(
        {
            "gpu_type": "h100",
            "per_gpu_hour": draw(st.sampled_from([2, 3])),
            "effective_from": "2026-06-01T00:00:00Z",
        }
    )


def _node_prices(doc: Doc, draw: Draw) -> None:
    _autoscale(doc)["node_prices"] = draw(
        st.sampled_from(
            [
                [],
                [{"instance_type": "p5.48xlarge", "on_demand": 98.3}],
                [{"instance_type": "p5.48xlarge", "on_demand": 98.3, "spot": 40}],
            ]
        )
    )


Mutation = tuple[str, frozenset[str], Callable[[Doc, Draw], None]]
"""(what it changes, the compiled fields ``Class.field`` it reaches, the change)."""


def m(name: str, covers: str, fn: Callable[[Doc, Draw], None]) -> Mutation:
    return (name, frozenset(covers.split()), fn)


MUTATIONS: list[Mutation] = [
    # settings
    m(
        "settings.pass_interval",
        "CSettings.pass_interval_s",
        _set(_settings, "pass_interval", ["1s", "2s", "5s"]),
    ),
    m(
        "settings.low_watermark",
        "CSettings.low_watermark_s CBudget.low_watermark_s",
        _set(_settings, "low_watermark", ["15m", "30m"]),
    ),
    m("settings.currency", "CSettings.currency", _set(_settings, "currency", ["EUR", "USD"])),
    m(
        "settings.start_timeout",
        "CSettings.start_timeout_s CPool.start_timeout_s",
        _set(_settings, "start_timeout", [None, "10m", "20m"]),
    ),
    m("settings.approvers (review data only)", "", _set(_settings, "approvers", [None, ["dana"]])),
    # settings.identity (issue 30)
    m(
        "settings.identity",
        "CSettings.identity CIdentity.providers CIdentity.workloads",
        _set(_settings, "identity", [None, {"providers": [PROVIDER]}, {"workloads": [WORKLOAD]}]),
    ),
    m(
        "identity.roles",
        "CIdentity.roles",
        _set(_identity, "roles", [{}, {"admin": ["dana"]}, {"finance": ["carol"]}]),
    ),
    m(
        "identity.token_lifetime",
        "CIdentity.token_lifetime_s",
        _set(_identity, "token_lifetime", [None, "8h", "1h"]),
    ),
    m("provider name", "CPeopleProvider.name", _set(_provider, "name", ["corp", "sso"])),
    m(
        "provider issuer",
        "CPeopleProvider.issuer",
        _set(_provider, "issuer", ["https://login.example.org", "https://sso.example.org"]),
    ),
    m(
        "provider audience",
        "CPeopleProvider.audience",
        _set(_provider, "audience", ["klique", "gpu"]),
    ),
    m(
        "provider client_id",
        "CPeopleProvider.client_id",
        _set(_provider, "client_id", [None, "web"]),
    ),
    m(
        "provider user_claim",
        "CPeopleProvider.user_claim",
        _set(_provider, "user_claim", [None, "email"]),
    ),
    m(
        "provider users",
        "CPeopleProvider.users",
        _set(_provider, "users", [{}, {"alice": "a@example.org"}, {"alice": "b@example.org"}]),
    ),
    m(
        "provider algorithms",
        "CPeopleProvider.algorithms",
        _set(_provider, "algorithms", [None, ["RS256"], ["ES256"]]),
    ),
    m("provider leeway", "CPeopleProvider.leeway_s", _set(_provider, "leeway", [None, "30s"])),
    m("provider scopes", "CPeopleProvider.scopes", _set(_provider, "scopes", [None, ["openid"]])),
    m("workload name", "CWorkload.name", _set(_workload, "name", ["github", "gh"])),
    m(
        "workload issuer",
        "CWorkload.issuer",
        _set(
            _workload,
            "issuer",
            ["https://token.actions.githubusercontent.com", "https://gitlab.example.org"],
        ),
    ),
    m("workload audience", "CWorkload.audience", _set(_workload, "audience", ["klique", "gpu"])),
    m(
        "workload claims",
        "CWorkload.claims",
        _set(
            _workload,
            "claims",
            [{"repository": "org/estate"}, {"repository": "org/other", "ref": "refs/heads/*"}],
        ),
    ),
    m("workload role (one value today)", "CWorkload.role", _set(_workload, "role", ["planner"])),
    m(
        "workload algorithms",
        "CWorkload.algorithms",
        _set(_workload, "algorithms", [None, ["RS256"]]),
    ),
    m("workload leeway", "CWorkload.leeway_s", _set(_workload, "leeway", [None, "2m"])),
    m(
        "settings.alerts",
        "CSettings.alerts CAlerts.channels",
        _set(
            _settings,
            "alerts",
            [
                None,
                {"it": ["ops@example.org"]},
                {
                    "channels": [
                        {"name": "hook", "kind": "webhook", "url": "https://evil.example.com/x"}
                    ]
                },
            ],
        ),
    ),
    m(
        "settings.alerts.it",
        "CAlerts.it",
        _set(_alerts, "it", [[], ["ops@example.org"], ["sec@example.org"]]),
    ),
    m(
        "settings.alerts.contacts",
        "CAlerts.contacts",
        _set(_alerts, "contacts", [{}, {"carol": "carol@example.org"}, {"dana": "@dana"}]),
    ),
    m(
        "settings.alerts.waiting_after",
        "CAlerts.waiting_after_s",
        _set(_alerts, "waiting_after", [None, "30m", "1h"]),
    ),
    m(
        "alerts channel url",
        "CAlertChannel.name CAlertChannel.url",
        _set(_channel, "url", ["https://alerts.example.org/k", "https://evil.example.com/x"]),
    ),
    m("alerts channel kind", "CAlertChannel.kind", _set(_channel, "kind", ["webhook", "slack"])),
    m(
        "alerts channel secret_env",
        "CAlertChannel.secret_env",
        _set(_channel, "secret_env", [None, "KEY_A", "KEY_B"]),
    ),
    m(
        "alerts channel secret_file",
        "CAlertChannel.secret_file",
        _set(_channel, "secret_file", [None, "/etc/klique/a.key"]),
    ),
    m(
        "alerts channel smtp",
        "CAlertChannel.smtp_host CAlertChannel.smtp_port CAlertChannel.sender",
        lambda doc, draw: _alerts(doc).__setitem__(
            "channels",
            [
                draw(
                    st.sampled_from(
                        [
                            {
                                "name": "mail",
                                "kind": "email",
                                "smtp_host": "smtp.example.org",
                                "sender": "k@example.org",
                            },
                            {
                                "name": "mail",
                                "kind": "email",
                                "smtp_host": "smtp.evil.com",
                                "sender": "k@example.org",
                                "smtp_port": 587,
                            },
                            {
                                "name": "mail",
                                "kind": "email",
                                "smtp_host": "smtp.example.org",
                                "sender": "other@example.org",
                            },
                        ]
                    )
                )
            ],
        ),
    ),
    m(
        "alerts channel to",
        "CAlertChannel.to",
        _set(_channel, "to", [["admins", "it"], ["it"], ["admins"]]),
    ),
    m(
        "alerts channel timeout",
        "CAlertChannel.timeout_s",
        _set(_channel, "timeout", ["10s", "30s"]),
    ),
    m(
        "settings.attribution",
        "CSettings.attribution CAttribution.reserved_idle",
        _set(_attribution, "reserved_idle", ["group", "overhead"]),
    ),
    m(
        "attribution.overhead_account",
        "CAttribution.overhead_account",
        _set(_attribution, "overhead_account", ["overhead", "it-costs"]),
    ),
    m(
        "attribution.borrowed",
        "CAttribution.borrowed",
        _set(_attribution, "borrowed", ["borrower", "split"]),
    ),
    m(
        "attribution.lost_work",
        "CAttribution.lost_work",
        _set(_attribution, "lost_work", [None, "owner", "taker", "overhead"]),
    ),
    m(
        "settings.lending",
        "CSettings.lending CLending.order",
        _set(_settings, "lending", [None, {"order": "fair"}, {"order": "ordered"}]),
    ),
    m("lending.order", "CLending.order", _set(_lending, "order", ["ordered", "fair"])),
    m(
        "lending.protect_for",
        "CLending.protect_for_s",
        _set(_lending, "protect_for", ["0s", "20m", "1h"]),
    ),
    m(
        "lending.victims",
        "CLending.victims",
        _set(_lending, "victims", ["newest", "least_lost_work"]),
    ),
    # pools
    m("pool.kind", "CPool.kind", _set(_onprem, "kind", ["baremetal", "hpc", "kubernetes"])),
    m("pool.capacity", "CPool.capacity_milli", _set(_onprem, "capacity", [8, 16, 12])),
    m("pool.gpu_type", "CPool.gpu_type", _set(_onprem, "gpu_type", ["h100", "a100"])),
    m("pool.gpu_memory_gb", "CPool.gpu_memory_gb", _set(_onprem, "gpu_memory_gb", [None, 80, 94])),
    m("pool.generation", "CPool.generation", _set(_onprem, "generation", [None, 2023, 2024])),
    m(
        "pool.labels",
        "CPool.labels",
        _set(_onprem, "labels", [{}, {"country": "de"}, {"country": "fr"}]),
    ),
    m(
        "pool.execution_order",
        "CPool.execution_order",
        _set(_onprem, "execution_order", [None, ["gpu1", "any"], ["any", "gpu1"]]),
    ),
    m(
        "pool.settings",
        "CPool.settings",
        _set(_onprem, "settings", [{}, {"partition": "gpu"}, {"partition": "big"}]),
    ),
    m(
        "pool.start_timeout",
        "CPool.start_timeout_s",
        _set(_onprem, "start_timeout", [None, "10m", "0s", "5m"]),
    ),
    m(
        "pool.nodes",
        "CPool.nodes CNodes.count CNodes.gpus_milli",
        lambda doc, draw: _onprem(doc).__setitem__(
            "nodes",
            draw(
                st.sampled_from(
                    [
                        {"count": 2, "gpus": 4},
                        {"count": 1, "gpus": 8},
                        [{"count": 1, "gpus": 4}, {"count": 1, "gpus": 4}],
                        {"count": 4, "gpus": 4},
                        {"count": 2, "gpus": 8},
                    ]
                )
            ),
        ),
    ),
    m(
        "pool.autoscale.max",
        "CPool.autoscale CAutoscale.max_milli",
        _set(_autoscale, "max", [16, 24]),
    ),
    m(
        "pool.autoscale.idle_timeout",
        "CAutoscale.idle_timeout_s",
        _set(_autoscale, "idle_timeout", ["10m", "20m"]),
    ),
    m(
        "pool.autoscale.spot_first",
        "CAutoscale.spot_first",
        _set(_autoscale, "spot_first", [True, False]),
    ),
    m(
        "pool.autoscale.spend_cap",
        "CAutoscale.spend_cap",
        _set(_autoscale, "spend_cap", [None, 25000, 30000]),
    ),
    m(
        "pool.autoscale.node_prices",
        "CAutoscale.node_prices CNodePrice.instance_type CNodePrice.on_demand CNodePrice.spot",
        _node_prices,
    ),
    m("a pool added", "CompiledEstate.pools CPool.name", _add_pool),
    # profiles
    m("profile.gpus", "CProfile.gpus_milli", _set(_fixed, "gpus", [1, 2, 0.5])),
    m(
        "profile.gpus from_task",
        "CProfile.from_task CFromTask.param CFromTask.default_milli CFromTask.max_milli",
        _set(
            _sized,
            "gpus",
            [
                {"from_task": "gpus", "default": 1, "max": 2},
                {"from_task": "gpus", "max": 3},
                {"from_task": "gpus", "default": 2, "max": 2},
            ],
        ),
    ),
    m(
        "profile.time_weight",
        "CProfile.time_weight_milli",
        _set(_fixed, "time_weight", [None, 1, 2, 0]),
    ),
    m(
        "profile.pools",
        "CProfile.pools",
        _set(_fixed, "pools", [["onprem", "cloud"], ["cloud", "onprem"], ["cloud"]]),
    ),
    m(
        "profile.pools_by",
        "CProfile.pools",
        _set(_sized, "pools_by", [{"min_gpu_memory_gb": 40}, {"labels": {"country": "de"}}]),
    ),
    m(
        "profile.policies",
        "CProfile.policies CPolicy.profiles CompiledEstate.compute_resources "
        "CComputeResource.name CComputeResource.policy CComputeResource.profile "
        "CComputeResource.group",
        _set(_fixed, "policies", [["team-a", "team-b"], ["team-b", "team-a"], ["team-a"]]),
    ),
    m(
        "profile.queueing",
        "CProfile.queueing",
        _set(_fixed, "queueing", [None, "strict", "best_effort"]),
    ),
    m("profile.nodes", "CProfile.nodes", _set(_fixed, "nodes", [None, 1, 2])),
    m(
        "profile.idle",
        "CProfile.idle CIdle.wall_s CIdle.cpu_s CIdle.gpu_s CIdle.network_s",
        _set(
            _fixed,
            "idle",
            [None, {"wall": "8h"}, {"wall": "8h", "cpu": "30m"}, {"gpu": "1h", "network": "2h"}],
        ),
    ),
    m(
        "profiles declared in another order",
        "CPool.execution_order CPolicy.profiles",
        _reorder_profiles,
    ),
    m(
        "a profile removed",
        "CompiledEstate.profiles CProfile.name",
        lambda doc, draw: doc.__setitem__("profiles", [_fixed(doc)]),
    ),
    # policies
    m(
        "policy.reservation",
        "CPolicy.reservation_milli CPolicy.shared_reservation_milli",
        _set(_team_a, "reservation", [0, 1, 2]),
    ),
    m("policy.limit", "CPolicy.limit_milli", _set(_team_a, "limit", [4, 3, 8])),
    m(
        "policy.lend_weight",
        "CPolicy.lend_weight_milli",
        _set(_team_a, "lend_weight", [None, 1, 2, 0.5]),
    ),
    m(
        "policy.protect_for",
        "CPolicy.protect_for_s",
        _set(_team_a, "protect_for", [None, "0s", "30m"]),
    ),
    m("policy.user_limit", "CPolicy.user_limit_milli", _set(_team_a, "user_limit", [None, 2, 4])),
    m(
        "policy.budget",
        "CPolicy.budget",
        _set(_team_a, "budget", [None, {"hours": 100, "period": "week", "alert_at": [0.8]}]),
    ),
    m("policy.budget.hours", "CBudget.hours_milli", _set(_budget, "hours", [100, 200])),
    m("policy.budget.period", "CBudget.period", _set(_budget, "period", ["week", "month"])),
    m(
        "policy.budget.low_watermark",
        "CBudget.low_watermark_s",
        _set(_budget, "low_watermark", [None, "15m", "1h"]),
    ),
    m(
        "policy.budget.alert_at",
        "CBudget.alert_at_milli",
        _set(_budget, "alert_at", [None, [0.8], [0.8, 0.95]]),
    ),
    m(
        "policy.pools_allowed",
        "CPolicy.pools_allowed CPoolsAllowed.labels CPoolsAllowed.pools",
        _set(
            _team_a,
            "pools_allowed",
            [None, {"pools": ["onprem", "cloud"]}, {"labels": {}, "pools": ["cloud", "onprem"]}],
        ),
    ),
    m("policy.group", "CPolicy.group CGroup.policy", _regroup),
    m(
        "an envelope removed",
        "CPolicy.envelope CPolicy.levels CPolicy.below CompiledEstate.policies CPolicy.name",
        lambda doc, draw: doc.__setitem__(
            "policies", [p for p in doc["policies"] if p["name"] != "dept"]
        ),
    ),
    # groups
    m("group.parent", "CGroup.parent CGroup.ancestors CPolicy.levels CPolicy.below", _move_team),
    m(
        "group.users",
        "CGroup.users",
        _set(_group_a, "users", [["alice"], ["alice", "eve"], ["eve", "alice"]]),
    ),
    m("group.admins", "CGroup.admins", _set(_group_a, "admins", [["carol"], [], ["carol", "x"]])),
    m(
        "group.projects",
        "CGroup.projects",
        _set(_group_a, "projects", [["llm", "vision"], ["vision", "llm"], ["llm"]]),
    ),
    m(
        "group.project_priority",
        "CGroup.project_priority CGroup.project_order",
        _set(_group_a, "project_priority", [None, False, True]),
    ),
    m(
        "a group added",
        "CompiledEstate.groups CGroup.name",
        lambda doc, draw: doc["groups"].append({"name": "new-team", "users": ["zed"]}),
    ),
    # pricing
    m(
        "pricing.per_gpu_hour",
        "CPrice.per_gpu_hour",
        _set(_price, "per_gpu_hour", [2.5, "2.50", 3]),
    ),
    m("pricing.gpu_type", "CPrice.gpu_type", _set(_price, "gpu_type", ["h100", "a100"])),
    m(
        "pricing.effective_from",
        "CPrice.effective_from",
        _set(_price, "effective_from", ["2026-01-01T00:00:00Z", "2025-06-01T00:00:00Z"]),
    ),
    m(
        "pricing.list_per_gpu_hour",
        "CPrice.list_per_gpu_hour",
        _set(_price, "list_per_gpu_hour", [None, 3, 4]),
    ),
    m("a price added", "CompiledEstate.pricing", _add_price),
]

NOT_MUTATED = {
    "CompiledEstate.format": "the compiler's format version: one per compiler",
    "CompiledEstate.revision": "the digest itself",
    "CompiledEstate.settings": "every field of the settings is mutated above",
}


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(st.data())
def test_the_plan_is_empty_exactly_when_the_revision_is_unchanged(data: st.DataObject) -> None:
    base_doc = data.draw(docs())
    head_doc = copy.deepcopy(base_doc)
    for name, _, mutate in data.draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=2)):
        note(f"mutation: {name}")
        mutate(head_doc, data.draw)
    base, head = compile_doc(base_doc), compile_doc(head_doc)
    assume(base is not None and head is not None)
    assert base is not None and head is not None
    note(f"head: {json.dumps(head_doc)}")
    plan = make_plan(side(base_doc, "base"), side(head_doc, "head"), "estate", now_ms=0)
    same = base.revision == head.revision
    assert (plan.changes == ()) == same, [c.address for c in plan.changes]
    assert plan.exit_code == (0 if same else 2)
    assert ("No changes." in render_text(plan)) == same
    assert len(plan.approvals) == len(plan.changes)


def _fields(model: type[BaseModel]) -> set[str]:
    return {f"{model.__name__}.{f}" for f in model.model_fields}


def test_every_compiled_field_is_mutated() -> None:
    """A field added to the compiled estate later must be added to a mutation here, so the
    property above covers it too."""
    models = [
        obj
        for obj in vars(c).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__ == c.__name__
        and not obj.__name__.startswith("_")
    ]
    every = set().union(*(_fields(mdl) for mdl in models))
    reached = set().union(*(covers for _, covers, _ in MUTATIONS)) | set(NOT_MUTATED)
    assert every - reached == set(), "no mutation in MUTATIONS changes these fields"
