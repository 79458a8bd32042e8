"""lending.md's fair choice kept incrementally: the same pick as ``fair.fair_pick``, without
comparing every candidate at every placement (issue 28: with 10,000 candidates and 50,000
placements the naive walk did not finish a first pass in 400 s).

The organisation is a tree: the root, then each top level, down to the teams, whose members
are the candidates. ``fair_pick`` chooses, at each node from the root down, the child with
the lowest (share, first candidate of its subtree by engine.md's order), and in a team its
first candidate. So each node keeps two lazy heaps of its children: by their first key (its
own first key is the top), and by (share, first key) (the pick goes down through the top).
A change pushes fresh entries up the one path it touches; stale entries are dropped when
they come to the top, recognised by comparing them with the child's current figures.

Shares are compared exactly as integers: ``borrowed x (L / lend_weight)`` with ``L`` the
least common multiple of the estate's weights orders the levels as the fractions do.
"""

from __future__ import annotations

import heapq
from math import lcm
from typing import Generic, TypeVar

from .index import EstateIndex, GroupInfo
from .rules import Key
from .state import State

P = TypeVar("P")

ROOT = "\0root"
"""The tree's root: no group is named so (a NUL is no valid name)."""


class Shape:
    """What the tree needs of an estate, computed once per revision: each level's parent,
    each node's children and the common multiple of the weights."""

    __slots__ = ("scale", "parent", "children", "factor")

    def __init__(self, index: EstateIndex) -> None:
        groups = index.groups
        self.scale = lcm(*(gi.lend_weight for gi in groups.values())) if groups else 1
        self.factor = {g: self.scale // gi.lend_weight for g, gi in groups.items()}
        self.parent: dict[str, str] = {}
        self.children: dict[str, list[str]] = {}
        for gi in groups.values():
            lv = gi.levels
            for i, x in enumerate(lv):
                if x in self.parent:
                    break
                up = lv[i + 1] if i + 1 < len(lv) else ROOT
                self.parent[x] = up
                self.children.setdefault(up, []).append(x)


_SHAPES: dict[str, Shape] = {}


def shape_of(index: EstateIndex) -> Shape:
    """The estate's ``Shape``, cached by revision (the same revision, the same tree)."""
    s = _SHAPES.get(index.revision)
    if s is None:
        if len(_SHAPES) >= 8:
            _SHAPES.clear()
        s = _SHAPES[index.revision] = Shape(index)
    return s


def scaled_share(shape: Shape, index: EstateIndex, state: State, x: str) -> int:
    """``share(x)`` times ``shape.scale``: an integer that orders levels as shares do."""
    b = state.used.get(x, 0) - index.groups[x].reservation
    return b * shape.factor[x] if b > 0 else 0


class FairTree(Generic[P]):
    """The candidates of a fair phase, and ``pick``: the one ``fair_pick`` would choose.

    Shares are read from the state when entries are compared, so after a placement the
    caller only says which levels' usage moved (``moved``)."""

    def __init__(self, index: EstateIndex, state: State) -> None:
        self.index = index
        self.state = state
        self.shape = shape_of(index)
        self.members: dict[str, tuple[Key, str, P]] = {}
        """Candidate name → (engine.md's key, its team, payload)."""
        self.first: dict[str, Key] = {}
        """Node → the first key of its subtree (absent: no candidate in it)."""
        self.by_key: dict[str, list[tuple[Key, str]]] = {}
        """Node → heap of (first key, child) (a team: (key, candidate name))."""
        self.by_rank: dict[str, list[tuple[int, Key, str]]] = {}
        """Envelope or root → heap of (scaled share, first key, child)."""
        self.ranked: dict[str, tuple[int, Key]] = {}
        """Child → the (share, first key) of its newest entry in its parent's rank heap,
        while that entry is there: the same entry is not pushed twice (a placement's
        refresh and ``moved`` often push the same)."""

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, name: str) -> bool:
        return name in self.members

    def add(self, name: str, key: Key, gi: GroupInfo, payload: P) -> None:
        """Adds (or replaces) candidate ``name`` of group ``gi``."""
        self.members[name] = (key, gi.name, payload)
        heapq.heappush(self.by_key.setdefault(gi.name, []), (key, name))
        self._refresh(gi.name)

    def remove(self, name: str) -> P | None:
        m = self.members.pop(name, None)
        if m is None:
            return None
        self._refresh(m[1])
        return m[2]

    def payload(self, name: str) -> P:
        return self.members[name][2]

    def moved(self, levels: tuple[str, ...]) -> None:
        """The usage of ``levels`` changed: their ranks among their siblings are new."""
        parent = self.shape.parent
        for x in levels:
            k = self.first.get(x)
            if k is not None:
                self._push_rank(parent[x], x, k)

    def pick(self) -> str:
        """The candidate ``fair.fair_pick`` chooses; the tree is not empty."""
        node = ROOT
        while True:
            h = self.by_rank.get(node)
            if h is None:  # a team: its first candidate
                return self._top_member(node)
            first = self.first
            ranked = self.ranked
            while True:
                s, k, child = h[0]
                if first.get(child) == k and self._share(child) == s:
                    break
                heapq.heappop(h)
                if ranked.get(child) == (s, k):
                    del ranked[child]
            node = child

    # ------------------------------------------------------------ inside

    def _share(self, x: str) -> int:
        return scaled_share(self.shape, self.index, self.state, x)

    def _top_member(self, team: str) -> str:
        h = self.by_key[team]
        members = self.members
        while True:
            k, name = h[0]
            m = members.get(name)
            if m is not None and m[0] == k:
                return name
            heapq.heappop(h)

    def _top(self, node: str) -> Key | None:
        """The node's first key now, dropping stale entries from its key heap."""
        h = self.by_key.get(node)
        if not h:
            return None
        if node in self.by_rank or node == ROOT:
            first = self.first
            while h and first.get(h[0][1]) != h[0][0]:
                heapq.heappop(h)
        else:
            members = self.members
            while h:
                m = members.get(h[0][1])
                if m is not None and m[0] == h[0][0] and m[1] == node:
                    break
                heapq.heappop(h)
        return h[0][0] if h else None

    def _push_rank(self, up: str, x: str, k: Key) -> None:
        s = self._share(x)
        if self.ranked.get(x) == (s, k):
            return
        self.ranked[x] = (s, k)
        heapq.heappush(self.by_rank.setdefault(up, []), (s, k, x))

    def _refresh(self, node: str) -> None:
        """Recomputes ``node``'s first key and carries a change up to the root."""
        parent = self.shape.parent
        first = self.first
        while node != ROOT:
            k = self._top(node)
            if k == first.get(node):
                return
            up = parent[node]
            if k is None:
                first.pop(node, None)
            else:
                first[node] = k
                if up != ROOT:  # the root's first key is never asked for
                    heapq.heappush(self.by_key.setdefault(up, []), (k, node))
                self._push_rank(up, node, k)
            if up not in self.by_rank:
                self.by_rank[up] = []
            node = up


class FlatTree(Generic[P]):
    """``FairTree`` for a flat estate (every group a top level): the same pick, with the
    tree's two levels written out. ``fair_pick`` with one level takes the group with the
    lowest (share, first key) and in it its first candidate, so each group keeps a heap of
    its candidates by key (its first key eagerly known: the heap's top is always current)
    and the root a lazy heap of groups by (share, first key). Fair phase 3 places tens of
    thousands of tasks in a first pass: the general tree's walk per change cost a quarter
    of it (issue 28)."""

    def __init__(self, index: EstateIndex, state: State) -> None:
        self.index = index
        self.state = state
        self.shape = shape_of(index)
        self.members: dict[str, tuple[Key, str, P]] = {}
        """Candidate name → (engine.md's key, its group, payload)."""
        self.heaps: dict[str, list[tuple[Key, str]]] = {}
        """Group → heap of (key, candidate); its top is current whenever the group has a
        candidate."""
        self.first: dict[str, Key] = {}
        self.root: list[tuple[int, Key, str]] = []
        self.ranked: dict[str, tuple[int, Key]] = {}
        """As ``FairTree.ranked``: the group's newest entry in ``root`` while it is there."""

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, name: str) -> bool:
        return name in self.members

    def add(self, name: str, key: Key, gi: GroupInfo, payload: P) -> None:
        """Adds (or replaces) candidate ``name`` of group ``gi``."""
        g = gi.name
        old = self.members.get(name)
        self.members[name] = (key, g, payload)
        h = self.heaps.get(g)
        if h is None:
            h = self.heaps[g] = []
        heapq.heappush(h, (key, name))
        f = self.first.get(g)
        if f is None or key < f:
            self.first[g] = key
            self._rank(g, key)
        elif old is not None and old[0] == f:  # the group's first moved back
            self._settle(g)

    def remove(self, name: str) -> P | None:
        m = self.members.pop(name, None)
        if m is None:
            return None
        if self.first.get(m[1]) == m[0]:
            self._settle(m[1])
        return m[2]

    def payload(self, name: str) -> P:
        return self.members[name][2]

    def moved(self, levels: tuple[str, ...]) -> None:
        """The usage of ``levels`` changed: their ranks are new."""
        first = self.first
        for x in levels:
            k = first.get(x)
            if k is not None:
                self._rank(x, k)

    def pick(self) -> str:
        """The candidate ``fair.fair_pick`` chooses; the tree is not empty."""
        root = self.root
        first = self.first
        ranked = self.ranked
        shape, index, state = self.shape, self.index, self.state
        while True:
            s, k, g = root[0]
            if first.get(g) == k and scaled_share(shape, index, state, g) == s:
                return self.heaps[g][0][1]
            heapq.heappop(root)
            if ranked.get(g) == (s, k):
                del ranked[g]

    def _settle(self, g: str) -> None:
        """Drops the stale top entries of ``g``'s heap; its first key follows."""
        h = self.heaps[g]
        members = self.members
        while h:
            k, n = h[0]
            m = members.get(n)
            if m is not None and m[0] == k:
                self.first[g] = k
                self._rank(g, k)
                return
            heapq.heappop(h)
        self.first.pop(g, None)

    def _rank(self, g: str, k: Key) -> None:
        s = scaled_share(self.shape, self.index, self.state, g)
        if self.ranked.get(g) == (s, k):
            return
        self.ranked[g] = (s, k)
        heapq.heappush(self.root, (s, k, g))
