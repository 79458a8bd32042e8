"""Gangs on a pool's workers (issue 15 part 2): a placed task over ``N`` nodes runs on ``N``
workers at once, all or nothing.

- A worker whose executor runs work on its own machine (process, container) takes one
  **member**: a lease for its node's share of the GPUs. A worker that can fit a member
  *offers* itself (in memory, while its long poll waits); once ``N`` distinct live workers
  have offered, the ``N`` leases are made in one commit (consecutive epochs, ranks in offer
  order, rank 0's worker the master) and delivered to each worker's poll. Until then no
  member has a lease, so none starts before all are taken.
- A worker whose executor spreads work over nodes itself (Slurm, Kubernetes) takes the whole
  gang as one lease carrying ``nodes`` (``sbatch --nodes``, an indexed Job).
- A gang that does not get its ``N`` members within the gang timeout goes back to its queue
  with the reason (``preempted``, kind ``gang``): it is not left placed without workers.

What a member's failure or loss does (the whole gang requeued) is in fleet.py, where every
report is prepared. Offers and undelivered leases are not logged: after a restart the
workers offer again, and a lease its worker never heard of is withdrawn as any other.
"""

from __future__ import annotations

from typing import Any

from klique_util.units import from_milli

from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.leases import Lease, WorkerInfo
from kliqued.daemon.records import TaskRecord

SPREADING = frozenset({"slurm", "kubernetes"})
"""Executors that place a gang over nodes themselves: they take it as one lease."""

DEFAULT_MASTER_PORT = 29500
"""torchrun's default; a pool's ``settings: {master_port: N}`` replaces it."""

GANG = "gang"
"""Preemption kind of a gang sent back to its queue for want of members (not a loss)."""


def nodes_of(d: Daemon, rec: TaskRecord) -> int:
    """How many nodes the task spans (its profile's ``nodes``; 1 for most work)."""
    t = d.st().tasks.get(rec.id)
    return t.nodes if t is not None else 1


def spreads(w: WorkerInfo) -> bool:
    return (w.executor or "process") in SPREADING


def share(rec: TaskRecord, nodes: int) -> int:
    return (rec.size or 0) // max(1, nodes)


def master_port(d: Daemon, pool: str) -> int:
    for p in d.idx().estate.pools:
        if p.name == pool:
            raw = p.settings.get("master_port")
            if raw is not None and str(raw).isdigit() and 0 < int(raw) < 65536:
                return int(raw)
    return DEFAULT_MASTER_PORT


def _placement(rec: TaskRecord) -> int:
    """Which placement of the task offers belong to (a requeued gang starts over)."""
    return rec.intervals


def offers(d: Daemon, rec: TaskRecord) -> dict[str, float]:
    """The live workers that offered to take a member of ``rec``'s current placement, with
    when (monotonic), oldest first."""
    entry = d.gang_offers.get(rec.id)
    if entry is None or entry[0] != _placement(rec):
        return {}
    out = {}
    for wid, at in sorted(entry[1].items(), key=lambda kv: kv[1]):
        w = d.workers.get(wid)
        if w is not None and not w.lost and w.pool == rec.pool:
            out[wid] = at
    return out


def offered(d: Daemon, rec: TaskRecord, wid: str) -> bool:
    return wid in offers(d, rec)


def offer(d: Daemon, rec: TaskRecord, wid: str, mono: float) -> None:
    entry = d.gang_offers.get(rec.id)
    if entry is None or entry[0] != _placement(rec):
        entry = d.gang_offers[rec.id] = (_placement(rec), {})
    entry[1].setdefault(wid, mono)


def withdraw_offers(d: Daemon, wid: str, keep: set[str]) -> None:
    """``wid`` no longer fits the gangs it offered for, but those in ``keep``."""
    for tid, (_, members) in list(d.gang_offers.items()):
        if tid not in keep:
            members.pop(wid, None)


def members(d: Daemon, rec: TaskRecord, wid: str, nodes: int) -> list[str] | None:
    """The ``nodes`` workers to lease the gang to once ``wid`` joins: the oldest offers,
    ``wid`` among them; None while there are not enough."""
    got = list(offers(d, rec))
    if wid not in got:
        got.append(wid)
    if len(got) < nodes:
        return None
    chosen = got[: nodes - 1]
    return chosen + [wid] if wid not in chosen else got[:nodes]


def rendezvous_env(lease: Lease) -> dict[str, str]:
    """What torchrun and DeepSpeed read (one process per node: the task's command; run
    torchrun inside it with ``--nnodes $WORLD_SIZE --node_rank $NODE_RANK``)."""
    if lease.world <= 1:
        return {}
    return {
        "MASTER_ADDR": lease.master_addr or "localhost",
        "MASTER_PORT": str(lease.master_port or DEFAULT_MASTER_PORT),
        "WORLD_SIZE": str(lease.world),
        "RANK": str(lease.rank),
        "NODE_RANK": str(lease.rank),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "KLIQUE_GANG_NODES": str(lease.world),
        "KLIQUE_GPUS_PER_NODE": f"{from_milli(lease.size):g}",
    }


def timeout_text(d: Daemon, rec: TaskRecord, timeout_s: float) -> str:
    nodes = nodes_of(d, rec)
    got = len(offers(d, rec))
    return (
        f"gang of {nodes} nodes: only {got} of {nodes} workers of pool {rec.pool} could "
        f"take a member ({from_milli(share(rec, nodes)):g} GPUs free on each) within "
        f"{timeout_s:g}s"
    )


_GANGS: tuple[object, bool] | None = None
"""The last index looked at and whether it has a gang profile (one index per estate)."""


def has_gangs(d: Daemon) -> bool:
    """Whether any compute resource of the running estate spans several nodes. A task's
    ``nodes`` is its resource's (set at submission and again at each estate change), so
    without such a resource no task is a gang."""
    global _GANGS
    idx = d.idx()
    if _GANGS is None or _GANGS[0] is not idx:
        _GANGS = (idx, any(info.nodes > 1 for info in idx.resources.values()))
    return _GANGS[1]


def overdue(d: Daemon, timeout_s: float, now_ms: int) -> list[str]:
    """Placed gangs whose members were not all taken within ``timeout_s``: each goes back
    to its queue (``preempted``, kind ``gang``). It runs on the event loop every watch step:
    an estate without gangs is not scanned (12,608 placed tasks waiting for a lease took
    tens of ms a step, every second)."""
    out: list[str] = []
    if not d.unleased or not has_gangs(d):
        return out
    for pool, waiting in d.unleased.items():
        workers = [w for w in d.workers.values() if w.pool == pool and not w.lost]
        if workers and all(spreads(w) for w in workers):
            continue  # one lease to a spreading worker: the start timeout applies
        for tid in waiting:
            rec = d.records.get(tid)
            if rec is None or rec.state != "placed" or rec.pool != pool:
                continue
            if nodes_of(d, rec) <= 1:
                continue
            since = max(rec.placed_at or 0, rec.unleased_at or 0)
            if now_ms - since >= timeout_s * 1000:
                out.append(tid)
    return out


def lease_extra(lease: Lease) -> dict[str, Any]:
    """The lease answer's gang fields: a member's rank and world, or a spread gang's
    ``nodes``."""
    if lease.world > 1:
        return {"rank": lease.rank, "world": lease.world, "nodes": lease.world}
    if lease.nodes > 1:
        return {"nodes": lease.nodes}
    return {}
