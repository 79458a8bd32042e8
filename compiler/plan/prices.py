"""What a price change does to cost, old price against new, per GPU type.

The ledger prices usage when it is read, by the price in effect at the usage's start
(docs/ledger.md), so a price added, changed or removed with an ``effective_from`` in the
past reprices usage already recorded: the way a wrong price is corrected, and a surprise
when it was meant for the future. The plan therefore compares the two price timelines of
each GPU type piece by piece: a piece that lies in the past (relative to the plan's time)
is a warning naming the period it reprices, a future one is information.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Literal

from klique_util.fmt import hours
from klique_util.units import SECOND_MS, to_ms

from ..compiled import CompiledEstate, CPrice
from ..units import parse_time
from .live import LiveState
from .model import Impact

Timeline = list[tuple[int, Decimal, CPrice]]
"""A GPU type's prices as (effective_from in ms, price, the price object), by time."""


def _ms(text: str) -> int:
    return to_ms(parse_time(text))


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / SECOND_MS, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _timelines(est: CompiledEstate) -> dict[str, Timeline]:
    out: dict[str, Timeline] = {}
    for p in est.pricing:
        out.setdefault(p.gpu_type, []).append((_ms(p.effective_from), Decimal(p.per_gpu_hour), p))
    return {g: sorted(t, key=lambda x: x[0]) for g, t in out.items()}


def _at(timeline: Timeline, t: int) -> tuple[Decimal, CPrice] | None:
    found = None
    for start, price, obj in timeline:
        if start <= t:
            found = (price, obj)
        else:
            break
    return found


def _money(d: Decimal | None, currency: str) -> str:
    return "no price" if d is None else f"{format(d.normalize(), 'f')} {currency}"


def _change(before: Decimal | None, after: Decimal | None) -> str:
    if before is None or after is None or before == 0:
        return ""
    pct = (after - before) * 100 / before
    return f" ({float(pct):+.1f}%)".replace(".0%", "%")


def _months(start_ms: int, end_ms: int) -> list[str]:
    """The UTC months ``[start, end)`` touches, as ``2026-11``."""
    s = datetime.fromtimestamp(start_ms / SECOND_MS, timezone.utc)
    e = datetime.fromtimestamp((end_ms - 1) / SECOND_MS, timezone.utc)
    out, y, m = [], s.year, s.month
    while (y, m) <= (e.year, e.month):
        out.append(f"{y:04d}-{m:02d}")
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def _month_aligned(ms: int) -> bool:
    d = datetime.fromtimestamp(ms / SECOND_MS, timezone.utc)
    return d.day == 1 and (d.hour, d.minute, d.second, d.microsecond) == (0, 0, 0, 0)


def price_impacts(
    base: CompiledEstate, head: CompiledEstate, now_ms: int, live: LiveState | None = None
) -> Iterator[Impact]:
    """One impact per GPU type and piece of time whose price differs between the two."""
    b_all, h_all = _timelines(base), _timelines(head)
    currency = head.settings.currency
    for gpu_type in sorted(set(b_all) | set(h_all)):
        b, h = b_all.get(gpu_type, []), h_all.get(gpu_type, [])
        points = sorted({t for t, _, _ in b} | {t for t, _, _ in h})
        for i, start in enumerate(points):
            end = points[i + 1] if i + 1 < len(points) else None
            old, new = _at(b, start), _at(h, start)
            old_p, new_p = (old[0] if old else None), (new[0] if new else None)
            present = new or old
            if present is None or old_p == new_p:
                continue
            obj = present[1]
            side: Literal["base", "head"] = "head" if new is not None else "base"
            subject = ("price", f"{obj.gpu_type}@{obj.effective_from}")
            details: dict[str, Any] = {
                "gpu_type": gpu_type,
                "from": _iso(start),
                "to": _iso(end) if end is not None else None,
                "before": None if old_p is None else str(old_p),
                "after": None if new_p is None else str(new_p),
                "currency": currency,
            }
            prices = (
                f"{_money(old_p, currency)} -> {_money(new_p, currency)} per GPU-hour"
                f"{_change(old_p, new_p)}"
            )
            if start >= now_ms:
                span = f"from {_iso(start)}" + (f" to {_iso(end)}" if end else "")
                yield Impact(
                    "info",
                    "price-changed",
                    f"price of {gpu_type} {span}: {prices}",
                    details,
                    subject,
                    side,
                )
                continue
            until = min(end, now_ms) if end is not None else now_ms
            span = f"{_iso(start)} to {_iso(until)}" + ("" if until == end else " (now)")
            text = (
                f"price of {gpu_type} from {_iso(start)}"
                + (f" to {_iso(end)}" if end else "")
                + f": {prices}; the usage already recorded from {span} is repriced"
            )
            if live is not None and live.usage is not None:
                months = _months(start, until)
                used = sum(live.usage.get(gpu_type, {}).get(m, 0.0) for m in months)
                exact = _month_aligned(start) and (until == now_ms or _month_aligned(until))
                details["recorded_gpu_hours"] = round(used, 6)
                details["months"] = months
                text += f": {hours(used)} GPU-hours recorded" + (
                    "" if exact else f" in the months it touches ({months[0]} to {months[-1]})"
                )
                if old_p is not None and new_p is not None:
                    delta = (new_p - old_p) * Decimal(str(round(used, 6)))
                    details["cost_change"] = str(delta.quantize(Decimal("0.01")))
                    text += f", {'about ' if not exact else ''}{delta:+.2f} {currency}"
            yield Impact("warn", "price-backdated", text, details, subject, side)
