"""The organisation tree of an estate (organisation.md): envelopes, levels, shared reservations.

Kept in one place, like ``resolve.py``, so that what the checks verify is exactly what the
compiled estate carries. Every walk up the tree stops at a name it has already met, so a
cycle of parents (reported by the checks) or an unknown parent never loops or raises here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .models import Group, Policy

if TYPE_CHECKING:
    from .compiled import CompiledEstate


@dataclass(frozen=True)
class Organisation:
    """The facts of the tree that the checks, the compiled estate and the plan share."""

    ancestors: dict[str, list[str]]
    """Group → its parent, then the parent's parent, up to the top (known groups only)."""
    policy_of_group: dict[str, str]
    """Group → the name of its policy (the first one, when a group wrongly has several)."""
    envelopes: set[str]
    """Policies whose group has groups below it: their numbers apply to the subtree."""
    levels: dict[str, list[str]]
    """Policy → the policies met going up: itself, then each envelope above it."""
    nearest: dict[str, list[str]] = field(default_factory=dict)
    """Envelope → the nearest policies below it (those whose next level up is the envelope),
    in declaration order."""
    subtree: dict[str, list[str]] = field(default_factory=dict)
    """Envelope → every policy below it, at any depth, in declaration order."""
    shared: dict[str, int] = field(default_factory=dict)
    """Envelope → its shared reservation, ``reservation - sum(nearest reservations)``, never
    below 0 (an excess is an error of the checks)."""

    def is_envelope(self, policy: str) -> bool:
        return policy in self.envelopes


def _ancestors(name: str, parent_of: dict[str, str | None]) -> list[str]:
    out: list[str] = []
    cur = parent_of.get(name)
    while cur is not None and cur in parent_of and cur not in out and cur != name:
        out.append(cur)
        cur = parent_of[cur]
    return out


def organisation(policies: list[Policy], groups: list[Group]) -> Organisation:
    """The tree of ``groups`` with ``policies`` on it; policies in declaration order."""
    parent_of = {g.name: g.parent for g in groups}
    ancestors = {g.name: _ancestors(g.name, parent_of) for g in groups}
    # A group in a cycle of parents (an error of the checks) makes no envelope: which of its
    # members is "above" is undefined, and one error for the cycle is enough.
    cyclic = {
        n for n, p in parent_of.items() if p is not None and (p == n or n in ancestors.get(p, []))
    }
    has_children = {g.parent for g in groups if g.parent is not None and g.name not in cyclic}
    policy_of_group: dict[str, str] = {}
    for pol in policies:
        policy_of_group.setdefault(pol.group, pol.name)
    envelopes = {pol.name for pol in policies if pol.group in has_children}
    levels: dict[str, list[str]] = {}
    for pol in policies:
        above = [
            policy_of_group[a]
            for a in ancestors.get(pol.group, [])
            if policy_of_group.get(a) in envelopes
        ]
        levels[pol.name] = [pol.name] + [e for e in above if e != pol.name]
    nearest: dict[str, list[str]] = {e: [] for e in envelopes}
    subtree: dict[str, list[str]] = {e: [] for e in envelopes}
    for pol in policies:
        up = levels[pol.name][1:]
        if up:
            nearest[up[0]].append(pol.name)
        for e in up:
            subtree[e].append(pol.name)
    reservation = {pol.name: pol.reservation for pol in policies}
    shared = {
        e: max(0, reservation[e] - sum(reservation[p] for p in nearest[e])) for e in envelopes
    }
    return Organisation(ancestors, policy_of_group, envelopes, levels, nearest, subtree, shared)


def reservation_demands(
    org: Organisation, reservations: dict[str, int], reach: dict[str, list[str]]
) -> tuple[dict[str, int], dict[str, list[str]]]:
    """The demands of the max-flow reservation check: a team's own reservation in the pools
    its profiles reach; an envelope's *shared* reservation in any pool reachable from a
    profile of a policy in its subtree (its teams' own reservations are their demands)."""
    demand = {
        p: (org.shared.get(p, 0) if p in org.envelopes else r) for p, r in reservations.items()
    }
    where = {
        p: (
            sorted({q for below in org.subtree.get(p, []) for q in reach.get(below, [])})
            if p in org.envelopes
            else list(reach.get(p, []))
        )
        for p in reservations
    }
    return demand, where


def compiled_demands(est: "CompiledEstate") -> tuple[dict[str, int], dict[str, list[str]]]:
    """``reservation_demands`` of a compiled estate: policy → demand (an envelope's shared
    reservation) and policy → the pools that may serve it (an envelope's: every pool that
    a profile of a policy below it reaches), for the plan's headroom and shortfalls."""
    profiles = {p.name: p for p in est.profiles}
    reach: dict[str, list[str]] = {}
    for pol in est.policies:
        pools: list[str] = []
        for prof in pol.profiles:
            for q in profiles[prof].pools if prof in profiles else []:
                if q not in pools:
                    pools.append(q)
        reach[pol.name] = pools
    for pol in est.policies:
        for env in pol.levels[1:]:
            if env in reach:
                reach[env] += [q for q in reach[pol.name] if q not in reach[env]]
    demand = {
        p.name: (p.shared_reservation_milli if p.envelope else p.reservation_milli)
        for p in est.policies
    }
    return demand, reach
