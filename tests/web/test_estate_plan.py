"""The Estate page's "The last plan", rendered in process (issue 25, item 7): a new revision
that only adds alert channels or a pool's machines said "No effective change (the same
estate, a new commit)"; it must list the change, as ``kliqued plan`` does."""

from __future__ import annotations

from compiler.api import SourceFile, compile_files
from compiler.compiled import CompiledEstate
from kliqued.web.data import plan_rows
from kliqued.web.frame import Web

ESTATE = """\
settings: {currency: EUR}
pools:
  - {name: onprem, kind: baremetal, capacity: 8, gpu_type: h100}
profiles:
  - {name: gpu1, gpus: 1, pools: [onprem], policies: [team-a]}
policies:
  - {name: team-a, group: team-a, reservation: 1, limit: 4}
groups:
  - {name: team-a, users: [alice]}
"""


def _compiled(text: str) -> CompiledEstate:
    est = compile_files([SourceFile("estate.yaml", text.encode())]).estate
    assert est is not None
    return est


def _page(before: CompiledEstate, after: CompiledEstate) -> str:
    info = {
        "revision": after.revision,
        "applied_at": None,
        "source": "estate",
        "commit": None,
        "pools": 1,
        "profiles": 1,
        "policies": 1,
        "compute_resources": 1,
        "refused": None,
    }
    plan = {"base": before.revision, "head": after.revision, "changes": plan_rows(before, after)}
    return (
        Web()
        .env.get_template("live/estate.html")
        .render(
            estate={"info": info, "pools": [], "profiles": [], "policies": []},
            revisions=[],
            plan=plan,
        )
    )


def test_a_new_alert_webhook_is_shown_not_no_effective_change() -> None:
    before = _compiled(ESTATE)
    after = _compiled(
        ESTATE.replace(
            "settings: {currency: EUR}",
            "settings:\n  currency: EUR\n  alerts:\n    channels:\n"
            "      - {name: ops, kind: webhook, url: 'https://outside.example.com/hook'}",
        )
    )
    assert before.revision != after.revision
    html = _page(before, after)
    assert "No effective change" not in html
    assert "<strong>update</strong> settings" in html
    assert (
        "<code>alerts.channels.ops.url</code>: &#34;https://outside.example.com/hook&#34;" in html
    )


def test_a_pools_machines_are_shown_not_no_effective_change() -> None:
    before = _compiled(ESTATE)
    after = _compiled(
        ESTATE.replace("gpu_type: h100}", "gpu_type: h100, nodes: {count: 2, gpus: 4}}")
    )
    assert before.revision != after.revision
    html = _page(before, after)
    assert "No effective change" not in html
    assert "<strong>update</strong> pool <code>onprem</code>" in html
    assert "<code>nodes</code>: [{count: 2, gpus: 4}]" in html


def test_the_same_estate_still_says_no_effective_change() -> None:
    est = _compiled(ESTATE)
    assert "No effective change" in _page(est, est)
