"""The organisation's tree of policies, as people read it: a department's policy (an
envelope) above its teams', indented. One rule for ``kliqued budget`` and the dashboard's
Policy page (issue 32: the page was a flat table with a Level column where the CLI showed
the tree), on the API's policy views (``name``, ``levels``: the policy and the envelopes
above it, nearest first; ``path``: its group's path)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence, TypeVar

P = TypeVar("P", bound=Mapping[str, Any])


def policy_tree(policies: Sequence[P]) -> list[tuple[int, P]]:
    """The policies in tree order, each with its indentation: a policy under the nearest
    envelope above it that is in the list (``levels``), siblings in the organisation's order
    (by their groups' paths, so the teams of a department without a policy stay together).
    A policy whose envelopes are not in the list (not yours to see, or none) starts a tree
    of its own."""
    names = {p["name"] for p in policies}
    children: dict[str | None, list[P]] = {}
    for p in policies:
        up = next((x for x in (p.get("levels") or [])[1:] if x in names), None)
        children.setdefault(up, []).append(p)
    out: list[tuple[int, P]] = []

    def walk(parent: str | None, depth: int) -> None:
        for p in sorted(
            children.get(parent, []),
            key=lambda x: ((x.get("path") or x["name"]).split("/"), x["name"]),
        ):
            out.append((depth, p))
            walk(p["name"], depth + 1)

    walk(None, 0)
    return out
