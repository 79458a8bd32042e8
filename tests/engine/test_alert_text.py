"""An alert's text says what its numbers say (issue 10, bug 10): a budget lowered below what
is used reads `200% ... (0.2 of 0.1 h)`, not `90% used (0.2 of 0.1 h)`."""

from __future__ import annotations

from kliqued.engine import Alert

from .helpers import MIN, START, Engine, build_estate


def _estate(hours: float):
    return build_estate(
        pools=[{"name": "p", "capacity": 4}],
        profiles=[{"name": "one", "gpus": 1, "pools": ["p"], "policies": ["a"]}],
        policies=[
            {
                "name": "a",
                "reservation": 4,
                "limit": 4,
                "budget": {
                    "hours": hours,
                    "period": "day",
                    "alert_at": [0.5, 0.9],
                    "low_watermark_s": 0,
                },
            }
        ],
    )


def test_alert_text_after_a_budget_is_lowered() -> None:
    e = Engine(_estate(10))
    e.submit("t1", "a/one")
    e.run(START)
    e.advance(START + 12 * MIN)  # 0.2 h used of 10: no alert yet
    e.set_estate(_estate(0.1))
    e.state.bind(e.index, START + 12 * MIN)
    alerts = [d for d in e.run(START + 12 * MIN).decisions if isinstance(d, Alert)]
    assert [a.threshold_milli for a in alerts] == [500, 900]
    for a in alerts:
        assert a.text.startswith("a: 200% of the day's budget used (0.2 of 0.1 h"), a.text
        assert f"alert at {a.threshold_milli // 10}%" in a.text


def test_small_amounts_keep_their_digits() -> None:
    e = Engine(_estate(0.05))
    e.submit("t1", "a/one")
    e.run(START)
    texts = [
        d.text for r in e.advance(START + 2 * MIN) for d in r.decisions if isinstance(d, Alert)
    ]
    assert texts == ["a: 50% of the day's budget used (0.025 of 0.05 h; alert at 50%)"]
