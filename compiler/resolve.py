"""Derived facts of an estate that both the checks and the compiled output need.

Kept in one place so that what is checked is exactly what is compiled: the pools a profile
resolves to, the capacity the engine uses for a pool, every pool's full execution order.
"""

from __future__ import annotations

from .models import Pool, PoolsBy, Profile


def pool_capacity(pool: Pool) -> int:
    """Declared capacity in milli-GPUs; an autoscaled cloud pool counts its ``max``."""
    if pool.autoscale is not None and pool.capacity is None:
        return pool.autoscale.max
    return pool.capacity or 0


def matches(pool: Pool, by: PoolsBy) -> bool:
    if by.min_gpu_memory_gb is not None and (pool.gpu_memory_gb or 0) < by.min_gpu_memory_gb:
        return False
    if by.min_generation is not None and (
        pool.generation is None or pool.generation < by.min_generation
    ):
        return False
    if any(pool.labels.get(k) != v for k, v in by.labels.items()):
        return False
    if by.kinds is not None and pool.kind not in by.kinds:
        return False
    if by.gpu_types is not None and pool.gpu_type not in by.gpu_types:
        return False
    return True


def resolve_pools(profile: Profile, pools: list[Pool]) -> list[str]:
    """The profile's pool order. ``pools_by``: matching pools, newest generation first (pools
    without a generation last), ties by declaration order. ``pools``: as listed, unknown
    names dropped (they are reported separately)."""
    if profile.pools is not None:
        known = {p.name for p in pools}
        out: list[str] = []
        for name in profile.pools:
            if name in known and name not in out:
                out.append(name)
        return out
    if profile.pools_by is None:
        return []
    matching = [(i, p) for i, p in enumerate(pools) if matches(p, profile.pools_by)]
    matching.sort(key=lambda ip: (ip[1].generation is None, -(ip[1].generation or 0), ip[0]))
    return [p.name for _, p in matching]


def execution_order(pool: Pool, users_in_declaration_order: list[str]) -> list[str]:
    """Listed profiles that use the pool first, then the others in declaration order."""
    listed = [p for p in (pool.execution_order or []) if p in users_in_declaration_order]
    rest = [p for p in users_in_declaration_order if p not in listed]
    return listed + rest


def allowed(pool: Pool, labels: dict[str, str], names: list[str] | None) -> bool:
    if names is not None and pool.name not in names:
        return False
    return all(pool.labels.get(k) == v for k, v in labels.items())
