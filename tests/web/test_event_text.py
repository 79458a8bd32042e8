"""The audit trail's one-line texts (``web.data.event_text``), for events whose payload has
holes: a refused estate has no revision (it did not compile), and its line named it
``estate revision None`` (issue 32)."""

from __future__ import annotations

from dataclasses import asdict

from kliqued.daemon.events import EstateRefused
from kliqued.web.data import event_text


def _refused(**data: object) -> dict[str, object]:
    payload = EstateRefused(**data)  # type: ignore[arg-type]  # the event's own shape
    return {"kind": "estate_refused", "revision": "sha256:running", "data": asdict(payload)}


def test_a_refused_estate_is_named_by_its_commit_and_source_never_none() -> None:
    text = event_text(
        _refused(
            commit="1a2b3c4d5e6f7a8b9c0d",
            source="git:/srv/estate@main",
            errors=["groups.yaml:3:5: error[unknown-group]: ..."],
        )
    )
    assert text == (
        "estate at commit 1a2b3c4d5e6f from git:/srv/estate@main refused: 1 error(s); "
        "first: groups.yaml:3:5: error[unknown-group]: ..."
    )
    assert "None" not in event_text(_refused(source="estate/", errors=[]))
    assert event_text(_refused(source="estate/")) == "estate from estate/ refused: 0 error(s)"
