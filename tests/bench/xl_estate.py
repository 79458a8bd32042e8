"""A generated XL estate: 200 pools, 2,000 policies, 100 profiles, 10,000 compute resources.

Deterministic (no randomness), valid, with the reservations fitting, so it measures the
compiler's real path including the max-flow check. Written as YAML text over several files,
as IT would split a large estate.
"""

from __future__ import annotations

from pathlib import Path

from compiler.api import SourceFile

POOLS = 200
POLICIES = 2000
PROFILES = 100
POLICIES_PER_PROFILE = 100
KINDS = ["kubernetes", "baremetal", "hpc", "cloud"]
COUNTRIES = ["de", "fr", "nl", "se"]


def xl_files(capacity_bump: int = 0, weight_bump: int = 0) -> list[SourceFile]:
    """The XL estate as SourceFiles; the bumps make a second revision for plan benchmarks."""
    pools = ["pools:"]
    for i in range(POOLS):
        kind = KINDS[i % 4]
        cap = 256 + (capacity_bump if i % 10 == 0 else 0)
        size = (
            f"autoscale: {{max: {cap}, idle_timeout: 10m}}"
            if kind == "cloud"
            else f"capacity: {cap}"
        )
        pools.append(
            f"  - {{name: pool-{i:03d}, kind: {kind}, {size}, gpu_type: gpu-{i % 8}, "
            f"gpu_memory_gb: {40 + 40 * (i % 2)}, generation: {2020 + i % 5}, "
            f"labels: {{country: {COUNTRIES[i % 4]}}}}}"
        )
    profiles = ["profiles:"]
    for j in range(PROFILES):
        first = (j * 2) % POOLS
        pool_list = ", ".join(f"pool-{(first + k) % POOLS:03d}" for k in range(4))
        start = (j * POLICIES_PER_PROFILE) % POLICIES
        pols = ", ".join(f"team-{(start + k) % POLICIES:04d}" for k in range(POLICIES_PER_PROFILE))
        size = "{from_task: gpus, default: 1, max: 4}" if j % 5 == 0 else str([0.5, 1, 2, 4][j % 4])
        weight = 1 + (j % 3) + (weight_bump if j % 10 == 0 else 0)
        profiles.append(
            f"  - {{name: profile-{j:03d}, gpus: {size}, time_weight: {weight}, "
            f"pools: [{pool_list}], policies: [{pols}]}}"
        )
    policies = ["policies:"]
    groups = ["groups:"]
    for k in range(POLICIES):
        budget = (
            f", budget: {{hours: {1000 + k}, period: {['day', 'week', 'month'][k % 3]}}}"
            if k % 2 == 0
            else ""
        )
        policies.append(
            f"  - {{name: team-{k:04d}, group: team-{k:04d}, reservation: "
            f"{(k % 3) * 2}, limit: 16{budget}}}"
        )
        groups.append(
            f"  - {{name: team-{k:04d}, parent: dept-{k // 100:02d}, "
            f"users: [user-{k:04d}a, user-{k:04d}b], projects: [proj-{k % 7}]}}"
        )
    for d in range(POLICIES // 100):
        groups.append(f"  - {{name: dept-{d:02d}}}")
    pricing = ["pricing:"] + [
        f"  - {{gpu_type: gpu-{t}, per_gpu_hour: {1 + t * 0.5}, "
        f'effective_from: "2026-01-01T00:00:00Z"}}'
        for t in range(8)
    ]
    texts = {
        "xl/pools.yaml": pools,
        "xl/profiles.yaml": profiles,
        "xl/policies.yaml": policies,
        "xl/groups.yaml": groups,
        "xl/pricing.yaml": pricing,
    }
    return [SourceFile(name, ("\n".join(lines) + "\n").encode()) for name, lines in texts.items()]


def write_xl(directory: Path, **bumps: int) -> None:
    for f in xl_files(**bumps):
        target = directory / Path(f.path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.data)
