"""Where a change sends the estate's data: alert channels and recipients (settings.alerts).

An alert carries group and user names, budgets and task ids out of Klique, to a webhook, a
chat or a mailbox. A pull request that adds such a place is a data flow to review, not a
setting: the plan names each new place (an outside webhook URL as written) in a warning,
and the change is IT's to approve (``approvals``: settings are a shared object).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..compiled import CAlerts, CompiledEstate
from .model import Impact


def destinations(alerts: CAlerts | None) -> dict[str, str]:
    """Every place alerts go -> what sends there (``webhook channel ops``)."""
    out: dict[str, str] = {}
    if alerts is None:
        return out
    for ch in alerts.channels:
        if ch.url:
            out.setdefault(ch.url, f"{ch.kind} channel {ch.name}")
        if ch.smtp_host:
            out.setdefault(f"smtp://{ch.smtp_host}:{ch.smtp_port}", f"e-mail channel {ch.name}")
    for address in alerts.it:
        out.setdefault(address, "IT recipient")
    for user, address in sorted(alerts.contacts.items()):
        out.setdefault(address, f"contact of {user}")
    return out


def alert_destinations(base: CompiledEstate, head: CompiledEstate, *_: Any) -> Iterator[Impact]:
    """One warning naming the places alerts go in the head and not in the base."""
    before = destinations(base.settings.alerts)
    new = {d: why for d, why in destinations(head.settings.alerts).items() if d not in before}
    if not new:
        return
    places = "; ".join(f"{d} ({why})" for d, why in new.items())
    yield Impact(
        "warn",
        "alert-destination",
        f"alerts now go to {len(new)} new place{'s' if len(new) != 1 else ''} "
        f"outside Klique: {places}. Each receives group and user names, budgets and "
        "task ids: IT approves where the estate's data goes",
        {"destinations": [{"to": d, "by": why} for d, why in new.items()]},
        ("settings", "settings"),
    )
