"""Alert settings compiled, and who each alert goes to (no daemon: the pure parts of
kliqued/daemon/state/alerts.py)."""

from __future__ import annotations

from compiler.compiled import CAlertChannel
from kliqued.daemon.state.alerts import describe, recipients, sign
from tests.compiler.helpers import MINIMAL, compile_text
from tests.harness.typed import present

ALERTS = (
    MINIMAL.replace("users: [alice]}", "users: [alice, bob], admins: [alice]}")
    + """\
settings:
  alerts:
    contacts: {alice: alice@example.org, bob: bob@example.org}
    it: [it@example.org]
    channels:
      - {name: mail, kind: email, smtp_host: smtp.example.org, sender: k@example.org}
      - {name: it-only, kind: slack, url: "https://hooks.example.org/x", to: [it]}
"""
)


def test_channels_compile_and_an_estate_without_them_keeps_its_revision() -> None:
    r = compile_text(ALERTS)
    assert r.estate is not None, r.diagnostics
    a = r.estate.settings.alerts
    assert a is not None and [c.name for c in a.channels] == ["it-only", "mail"]
    assert a.channels[1].timeout_s == 10 and a.channels[1].smtp_port == 25
    plain = compile_text(MINIMAL).estate
    assert plain is not None and '"alerts"' not in plain.canonical_json()


def test_an_incomplete_channel_is_an_error_naming_it() -> None:
    r = compile_text(
        MINIMAL
        + """\
settings:
  alerts:
    channels:
      - {name: hook, kind: webhook}
"""
    )
    assert r.estate is None
    text = " ".join(d.message for d in r.diagnostics)
    assert "channel 'hook': a webhook channel needs 'url'" in text, text


def test_a_budget_alert_goes_to_the_group_admins_and_it() -> None:
    est = compile_text(ALERTS).estate
    assert est is not None
    note = describe(
        7,
        0,
        "alert",
        "team-a",
        {"policy": "team-a", "used_units": 100, "budget_units": 100, "text": "team-a: 100%"},
    )
    assert note.title == "team-a: budget used up"
    assert est.settings.alerts is not None
    mail, it_only = est.settings.alerts.channels[1], est.settings.alerts.channels[0]
    assert recipients(est, mail, note) == ["alice@example.org", "it@example.org"]
    assert recipients(est, it_only, note) == ["it@example.org"]
    crossed = describe(
        8, 0, "alert", "team-a", {"policy": "team-a", "used_units": 80, "budget_units": 100}
    )
    assert crossed.title == "team-a: budget threshold crossed"


def test_the_signature_covers_the_timestamp() -> None:
    assert sign(b"k", "1", b"{}") != sign(b"k", "2", b"{}")
    assert sign(b"k", "1", b"{}").startswith("sha256=")


def test_a_refused_revision_is_worded_for_it() -> None:
    note = describe(
        3,
        0,
        "estate_refused",
        None,
        {"revision": "sha256:ab", "source": "git", "errors": ["pools.yaml:3:5: bad"]},
    )
    assert "refused" in note.title and "pools.yaml:3:5: bad" in note.text
    assert recipients(
        present(compile_text(ALERTS).estate), CAlertChannel(name="x", kind="slack", url="u"), note
    ) == ["it@example.org"]
