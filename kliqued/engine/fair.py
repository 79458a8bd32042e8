"""lending.md "Fair shares": a level's share of borrowed GPUs, the diverging levels of two
groups, and the fair choice among competitors (phases 3 and 4 with ``order: fair``).

The **share** of a level ``x`` (a team's policy or an envelope) is
``max(0, used(x) - reservation(x)) / lend_weight(x)``; shares are compared exactly (as
fractions), so the choice never depends on rounding. The fair choice walks down the
organisation from the top: among the levels that hold candidates, the lowest share, ties to
the level whose first candidate comes first in engine.md's order; then inside it, and so on
down to a team, whose candidates go in engine.md's order.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence, TypeVar

from .index import EstateIndex, GroupInfo
from .rules import Key
from .state import State

P = TypeVar("P")


def share(index: EstateIndex, state: State, x: str) -> Fraction:
    """``borrowed(x) / lend_weight(x)``, GPUs per unit of weight (milli both: the ratio)."""
    xi = index.groups[x]
    borrowed = state.used.get(x, 0) - xi.reservation
    return Fraction(max(0, borrowed), xi.lend_weight)


def diverging(a: GroupInfo, b: GroupInfo) -> tuple[str, str]:
    """The first levels, from the top down, where ``a``'s and ``b``'s lists differ (one on
    each side). Teams have no groups below them, so two different teams always differ
    somewhere; a list that ends first (which a compiled estate cannot give) pairs its last
    level."""
    ta, tb = a.levels[::-1], b.levels[::-1]
    for i in range(max(len(ta), len(tb))):
        x = ta[min(i, len(ta) - 1)]
        y = tb[min(i, len(tb) - 1)]
        if x != y:
            return x, y
    return ta[-1], tb[-1]


def fair_pick(index: EstateIndex, state: State, items: Sequence[tuple[Key, GroupInfo, P]]) -> P:
    """The payload of the candidate that goes first under ``order: fair``; ``items`` is not
    empty, each (engine.md's key, the candidate's group, payload)."""
    shares: dict[str, Fraction] = {}
    cur = list(items)
    depth = 0
    while True:
        parts: dict[str, list[tuple[Key, GroupInfo, P]]] = {}
        for it in cur:
            lv = it[1].levels
            parts.setdefault(lv[max(0, len(lv) - 1 - depth)], []).append(it)
        if len(parts) == 1:
            ((level, members),) = parts.items()
            if all(len(m[1].levels) - 1 <= depth for m in members):
                return min(members, key=lambda m: m[0])[2]  # a team: engine.md's order
        else:
            best: tuple[Fraction, Key] | None = None
            chosen: list[tuple[Key, GroupInfo, P]] = []
            for level, members in parts.items():
                s = shares.get(level)
                if s is None:
                    s = shares[level] = share(index, state, level)
                rank = (s, min(m[0] for m in members))
                if best is None or rank < best:
                    best, chosen = rank, members
            cur = chosen
        depth += 1
