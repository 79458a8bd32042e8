"""Hours and costs as people read them: one rule, used by the engine's alert and reason texts,
the daemon's views and every CLI command.

A fixed number of decimals fails both ways (issue 10): ``0.04 h`` reads ``0.0 h left``, a
small overrun ``left -0 h``, a short task's ``2.2e-05`` GPU-hours comes out in exponent form.
So an amount keeps three significant digits (never fewer than its whole part), drops trailing
zeros, is never written with an exponent, and zero is ``0`` whatever its sign.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

SIGNIFICANT = 3


def amount(
    value: float | Decimal | str | None, significant: int = SIGNIFICANT, grouped: bool = False
) -> str:
    """``1234.56 -> '1235'``, ``12.345 -> '12.3'``, ``0.04 -> '0.04'``,
    ``0.000022 -> '0.000022'``, ``-0.0004 -> '-0.0004'``, ``-0.0 -> '0'``; None is ``-``.
    Text that is a number (an exact DECIMAL from the API) is read as one; other text is
    returned as it is. ``grouped`` separates thousands (``12,346``) for report tables."""
    if value is None:
        return "-"
    if isinstance(value, str):
        text = value
        try:
            value = Decimal(text)
        except ArithmeticError:
            return text
    x = float(value)
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    decimals = max(0, significant - 1 - magnitude)
    text = f"{x:,.{decimals}f}" if grouped else f"{x:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def money(value: float | Decimal | str | None, currency: str | None = None) -> str:
    """A cost as people read it, one rule for every page (issue 32: cost rows read
    ``0.000267`` beside a total of ``0.00``): to the cent, thousands grouped
    (``1,234.50``); a cost that is not zero but under half a cent reads ``< 0.01`` (or
    ``> -0.01``), never ``0.00``, so a row is not read as free; ``currency`` after it.
    Exact decimal text (the ledger's) is read as a Decimal and rounded half up; None and
    other text are returned as :func:`amount` returns them."""
    if value is None:
        return "-"
    try:
        d = value if isinstance(value, Decimal) else Decimal(str(value))
    except ArithmeticError:
        return str(value)
    if not d.is_finite():
        return str(value)
    cents = d.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    if cents == 0 and d != 0:
        text = "< 0.01" if d > 0 else "> -0.01"
    else:
        text = f"{cents:,.2f}" if cents != 0 else "0.00"
    return f"{text} {currency}" if currency else text


def hours(value: float | Decimal | str | None) -> str:
    """Hours (GPU-hours, budget hours, burn rates): :func:`amount`."""
    return amount(value)


def percent(part: float, whole: float) -> str:
    """``part`` of ``whole`` in whole percent, rounded down, so a threshold crossed reads at
    least its own figure (``90%`` once 90% is used, ``180%`` for a budget lowered below what
    is already used). A budget of 0 is all used: ``100%``."""
    if whole <= 0:
        return "100%"
    return f"{math.floor(part * 100 / whole)}%"


def span(seconds: float) -> str:
    """A duration as people say it, to two units: ``45s``, ``9m 52s``, ``2h 5m``,
    ``3d 4h``, ``2w 1d``; never a bare count of seconds past a minute (issue 32: alerts read
    ``waited 592 s``)."""
    total = max(0, int(seconds))
    units = (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    parts: list[str] = []
    for name, size in units:
        if total >= size or (name == "s" and not parts):
            n, total = divmod(total, size)
            parts.append(f"{n}{name}")
            if len(parts) == 2:
                break
        elif parts:
            break  # the next unit down is zero: '2h' not '2h 0m'
    return " ".join(parts)
