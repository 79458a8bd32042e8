"""The node shapes of pools (issue 15): the checks that tie a pool's declared capacity to the
machines behind it, and a profile's size to the machines it may land on.

A pool that declares no ``nodes`` is one machine as far as placement knows (engine.md counts
declared capacity), so it fits every size up to its capacity; only declared shapes are
checked. The fitting rule itself is ``klique_util.nodefit``, shared with the engine.
"""

from __future__ import annotations

from klique_util.nodefit import describe, largest_fit, shape_fits, share

from .diagnostics import Diagnostic, error, warning
from .models import Pool, Profile
from .source import SourceObject
from .units import milli_str


def _shapes(pool: Pool) -> list[tuple[int, int]]:
    return [(n.count, n.gpus) for n in pool.node_groups()]


def check_pool_nodes(pools: dict[str, SourceObject[Pool]]) -> list[Diagnostic]:
    """A node of no GPUs is an error; a declared capacity its nodes do not add up to, a
    warning (the engine counts the declared capacity; the nodes decide what fits)."""
    diags: list[Diagnostic] = []
    for obj in pools.values():
        pool: Pool = obj.model
        shapes = _shapes(pool)
        for i, (count, gpus) in enumerate(shapes):
            if gpus <= 0:
                path = ("nodes", i, "gpus") if isinstance(pool.nodes, list) else ("nodes", "gpus")
                diags.append(
                    error(
                        "invalid-value",
                        f"{obj.label}: a node of 0 GPUs",
                        obj.pos(*path),
                        "give each node's GPUs, e.g. {count: 4, gpus: 8}",
                    )
                )
        total = sum(c * g for c, g in shapes)
        declared = (
            pool.capacity
            if pool.capacity is not None
            else (pool.autoscale.max if pool.autoscale is not None else None)
        )
        if shapes and declared is not None and total != declared:
            diags.append(
                warning(
                    "nodes-capacity",
                    f"{obj.label}: declared capacity {milli_str(declared)} GPUs, but its nodes "
                    f"({describe(shapes)}) hold {milli_str(total)}",
                    obj.pos("nodes"),
                    "the engine counts the declared capacity and places only what fits a node: "
                    "make the two agree",
                )
            )
    return diags


def check_profile_nodes(
    obj: SourceObject[Profile],
    prof: Profile,
    resolved: list[str],
    pools: dict[str, SourceObject[Pool]],
) -> list[Diagnostic]:
    """A profile whose size fits no machine of any of its pools is an error (its work could
    never start); one that misses some pools, a warning naming them."""
    diags: list[Diagnostic] = []
    n = prof.nodes
    fixed = prof.gpus if isinstance(prof.gpus, int) else None
    size = fixed if fixed is not None else prof.gpus.default  # type: ignore[union-attr]
    maximum = None if fixed is not None else prof.gpus.max  # type: ignore[union-attr]
    if n > 1 and share(size, n) is None:
        diags.append(
            error(
                "profile-nodes",
                f"{obj.label}: {milli_str(size)} GPUs cannot be split evenly over {n} nodes",
                obj.pos("nodes"),
                f"choose a size that is a multiple of {n} (the GPUs per node x nodes)",
            )
        )
        return diags
    shaped = {
        p: _shapes(pools[p].model)
        for p in resolved
        if p in pools and pools[p].model.nodes is not None
    }
    if not shaped:
        return diags
    over = f" over {n} nodes" if n > 1 else ""
    misfit = [p for p, sh in shaped.items() if not shape_fits(sh, size, n)]
    where = "; ".join(f"{p}: {describe(sh)}" for p, sh in shaped.items())
    if misfit and len(misfit) == len(resolved):
        diags.append(
            error(
                "profile-fits-no-node",
                f"{obj.label} ({milli_str(size)} GPUs{over}) fits no node of its pools ({where})",
                obj.pos("gpus"),
                "lower 'gpus', spread the task with 'nodes: N', or list a pool with larger nodes",
            )
        )
    elif misfit:
        diags.append(
            warning(
                "profile-node-fit",
                f"{obj.label} ({milli_str(size)} GPUs{over}) fits no node of pool"
                f"{'s' if len(misfit) > 1 else ''} {', '.join(misfit)}: its work is placed only "
                f"on {', '.join(p for p in resolved if p not in misfit)}",
                obj.pos("gpus"),
                "remove those pools from the profile, or declare larger nodes",
            )
        )
    if maximum is not None and not misfit:
        best = max((largest_fit(sh, n) for sh in shaped.values()), default=0)
        if len(shaped) == len(resolved) and maximum > best:
            diags.append(
                warning(
                    "profile-node-fit",
                    f"{obj.label}: max {milli_str(maximum)} GPUs is above the largest task its "
                    f"pools' nodes hold ({milli_str(best)}{over}); larger tasks are refused at "
                    f"submission",
                    obj.pos("gpus", "max"),
                    f"lower max to {milli_str(best)}",
                )
            )
    return diags
