"""Do the reservations fit? A max-flow check over policies and pools.

Every policy's reservation must be placeable at once in the pools its profiles reach. That
holds exactly when the maximum flow source → policy (reservation) → reachable pool → sink
(capacity) saturates every policy (Hall's condition for every subset of policies at once).
When it does not, the residual graph names a small set of policies whose reservations exceed
the capacity of every pool they can reach, which is what IT must change.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class Shortfall:
    policies: tuple[str, ...]
    pools: tuple[str, ...]
    reserved_milli: int
    capacity_milli: int

    @property
    def short_milli(self) -> int:
        return self.reserved_milli - self.capacity_milli


class _Edge:
    """A residual edge: its head, remaining capacity, and the edge the other way."""

    __slots__ = ("to", "cap", "rev")

    def __init__(self, to: int, cap: float) -> None:
        self.to = to
        self.cap = cap
        self.rev: _Edge = self

    @property
    def flow(self) -> float:
        """What has been pushed through: the capacity gained by the reverse edge."""
        return self.rev.cap


class _Dinic:
    def __init__(self, n: int) -> None:
        self.n = n
        self.graph: list[list[_Edge]] = [[] for _ in range(n)]

    def add(self, u: int, v: int, cap: float) -> _Edge:
        fwd, rev = _Edge(v, cap), _Edge(u, 0)
        fwd.rev, rev.rev = rev, fwd
        self.graph[u].append(fwd)
        self.graph[v].append(rev)
        return fwd

    def maxflow(self, s: int, t: int) -> float:
        flow = 0.0
        while True:
            level = [-1] * self.n
            level[s] = 0
            q = deque([s])
            while q:
                u = q.popleft()
                for e in self.graph[u]:
                    if e.cap > 0 and level[e.to] < 0:
                        level[e.to] = level[u] + 1
                        q.append(e.to)
            if level[t] < 0:
                return flow
            it = [0] * self.n

            def dfs(u: int, f: float) -> float:
                if u == t:
                    return f
                edges = self.graph[u]
                while it[u] < len(edges):
                    e = edges[it[u]]
                    if e.cap > 0 and level[e.to] == level[u] + 1:
                        d = dfs(e.to, min(f, e.cap))
                        if d > 0:
                            e.cap -= d
                            e.rev.cap += d
                            return d
                    it[u] += 1
                return 0

            while True:
                pushed = dfs(s, INF)
                if pushed <= 0:
                    break
                flow += pushed


def check_reservations(
    reservations: dict[str, int], reach: dict[str, list[str]], capacity: dict[str, int]
) -> list[Shortfall]:
    """The sets of policies whose reservations cannot all be met, smallest first.

    ``reservations``: policy → milli-GPUs reserved (> 0 only matters); ``reach``: policy →
    pools its profiles can use; ``capacity``: pool → declared milli-GPUs.
    """
    policies = sorted(p for p, r in reservations.items() if r > 0)
    if not policies:
        return []
    pools = sorted({pool for p in policies for pool in reach.get(p, []) if pool in capacity})
    pidx = {p: 1 + i for i, p in enumerate(policies)}
    qidx = {q: 1 + len(policies) + i for i, q in enumerate(pools)}
    sink = 1 + len(policies) + len(pools)
    g = _Dinic(sink + 1)
    src_edges = {p: g.add(0, pidx[p], reservations[p]) for p in policies}
    flows: dict[tuple[str, str], _Edge] = {}
    for p in policies:
        for q in sorted(set(reach.get(p, []))):
            if q in qidx:
                flows[(p, q)] = g.add(pidx[p], qidx[q], INF)
    for q in pools:
        g.add(qidx[q], sink, capacity[q])
    g.maxflow(0, sink)

    # Residual adjacency for the explanation: policy → its pools; pool → policies whose flow
    # into it could be rerouted (flow > 0).
    into_pool: dict[str, list[str]] = {q: [] for q in pools}
    for (p, q), edge in flows.items():
        if edge.flow > 0:
            into_pool[q].append(p)
    found: dict[frozenset[str], Shortfall] = {}
    for p in policies:
        if src_edges[p].cap <= 0:
            continue  # saturated: this policy's reservation fits
        seen_p, seen_q = {p}, set()
        q_ = deque([p])
        while q_:
            cur = q_.popleft()
            for q in reach.get(cur, []):
                if q in qidx and q not in seen_q:
                    seen_q.add(q)
                    for other in into_pool[q]:
                        if other not in seen_p:
                            seen_p.add(other)
                            q_.append(other)
        key = frozenset(seen_p)
        if key not in found:
            found[key] = Shortfall(
                tuple(sorted(seen_p)),
                tuple(sorted(seen_q)),
                sum(reservations[x] for x in seen_p),
                sum(capacity[x] for x in seen_q),
            )
    shortfalls = sorted(found.values(), key=lambda s: (len(s.policies) + len(s.pools), s.policies))
    # A larger set is reported too only when it is short by more than the smaller sets inside
    # it: then fixing the smaller ones alone would not be enough.
    kept: list[Shortfall] = []
    for s in shortfalls:
        inside = [m for m in kept if set(m.policies) <= set(s.policies)]
        if not inside or s.short_milli > sum(m.short_milli for m in inside):
            kept.append(s)
    return kept


@dataclass(frozen=True)
class Headroom:
    pools: tuple[str, ...]
    policies: tuple[str, ...]
    capacity_milli: int
    reserved_milli: int

    @property
    def headroom_milli(self) -> int:
        return self.capacity_milli - self.reserved_milli


def headroom_by_pool_set(
    reservations: dict[str, int], reach: dict[str, list[str]], capacity: dict[str, int]
) -> list[Headroom]:
    """For each distinct set of pools that some policy reaches: its capacity, and the
    reservations of every policy that can only be served inside it. This is the Hall slack
    that ``kliqued plan`` shows before and after a change."""
    sets = {
        tuple(sorted(set(q for q in reach.get(p, []) if q in capacity)))
        for p, r in reservations.items()
        if r > 0
    }
    out = []
    for pool_set in sorted(sets):
        if not pool_set:
            continue
        members = tuple(
            sorted(
                p
                for p, r in reservations.items()
                if r > 0 and set(q for q in reach.get(p, []) if q in capacity) <= set(pool_set)
            )
        )
        out.append(
            Headroom(
                pool_set,
                members,
                sum(capacity[q] for q in pool_set),
                sum(reservations[p] for p in members),
            )
        )
    return out
