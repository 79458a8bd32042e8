"""``fmt.span``: durations as people say them (alerts read ``waited 592 s``, issue 32)."""

from __future__ import annotations

import pytest

from klique_util.fmt import span
from kliqued.web.data import delivery_text


@pytest.mark.parametrize(
    "seconds, said",
    [
        (0, "0s"),
        (45, "45s"),
        (60, "1m"),
        (592, "9m 52s"),
        (3600, "1h"),
        (7500, "2h 5m"),
        (7205, "2h"),  # seconds below the second unit are dropped, never '2h 0m'
        (3 * 86400 + 4 * 3600, "3d 4h"),
        (15 * 86400, "2w 1d"),
        (-5, "0s"),
    ],
)
def test_span(seconds: int, said: str) -> None:
    assert span(seconds) == said


def test_an_alert_delivery_says_its_channel_and_outcome() -> None:
    assert (
        delivery_text({"alert": 12, "channel": "ops-email", "status": "delivered", "attempt": 1})
        == "alert #12 to ops-email: delivered (attempt 1)"
    )
    assert delivery_text(
        {"alert": 3, "channel": "hook", "status": "given_up", "attempt": 5, "error": "refused"}
    ) == ("alert #3 to hook: given up (attempt 5): refused")
