"""Cloud nodes, their spend and the spend cap (docs/autoscaling.md, "Cloud spend").

The autoscaler (workers/autoscaler/loop.py) tells the control plane what it does, with an
admin token: a node it started (``POST /v1/pools/{pool}/nodes``), a node it released
(``DELETE /v1/pools/{pool}/nodes/{node}``) and, when placed work waits for a node it cannot
add, why (``POST /v1/pools/{pool}/scaling``). The control plane keeps the truth about money:

- each node is an interval in the ledger (``cloud_nodes``, written in the same transaction as
  its ``cloud_node_started``/``cloud_node_ended`` event), priced at its start from the estate:
  ``autoscale.node_prices`` for its instance type and lifecycle, else its GPUs x the price of
  the pool's gpu_type then in force;
- the month's spend of a pool (UTC calendar month; a running node counts up to now) is kept
  here, rebuilt by replay from the same events, and shown by ``GET /v1/pools``;
  ``capped`` is true once it reaches ``autoscale.spend_cap``: the autoscaler adds no node
  then, and says so (``scaling``); the first such report of a month raises the
  ``spend_cap_reached`` alert (alerts.py).

Why here and not in the autoscaler: the spend is read by finance from the ledger and must be
the same number the cap is checked against; a restarted autoscaler must not forget it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from compiler.compiled import CompiledEstate, CPool

from kliqued.daemon.units import iso


LIFECYCLES = ("spot", "on-demand")
HOUR_MS = 3_600_000
MICRO = Decimal("0.000001")

CAUSES = ("spend_cap", "capacity", "error")
"""Why placed work waits for a node: the spend cap, the provider's capacity (spot and
on-demand refused), a provider error (configuration, permissions)."""


@dataclass
class CloudNode:
    node: str
    pool: str
    provider: str
    instance_type: str
    lifecycle: str
    gpus: int
    per_hour: str  # decimal text, settings.currency, fixed at the start
    currency: str
    start_ms: int
    end_ms: int | None = None
    end_reason: str | None = None

    def cost_micro(self, since_ms: int, until_ms: int) -> int:
        """The cost of its time within [since, until) in millionths, rounded half up (as the
        ledger's ``cloud_node_usage`` rounds each node-month)."""
        a = max(self.start_ms, since_ms)
        b = min(self.end_ms if self.end_ms is not None else until_ms, until_ms)
        if b <= a:
            return 0
        micro = int(Decimal(self.per_hour) * 1_000_000)
        return ((b - a) * micro + HOUR_MS // 2) // HOUR_MS

    def view(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "provider": self.provider,
            "instance_type": self.instance_type,
            "lifecycle": self.lifecycle,
            "gpus": self.gpus,
            "per_hour": self.per_hour,
            "since": iso(self.start_ms),
            "ended_at": iso(self.end_ms),
            "end_reason": self.end_reason,
        }


@dataclass
class Scaling:
    cause: str | None
    reason: str | None
    waiting: int
    at_ms: int


def month_start(ms: int) -> int:
    t = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return int(datetime(t.year, t.month, 1, tzinfo=timezone.utc).timestamp() * 1000)


def month_label(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m")


def price_of(
    estate: CompiledEstate, pool: CPool, instance_type: str, lifecycle: str, gpus: int, at_ms: int
) -> str:
    """A node's price an hour: its instance type's ``node_prices`` entry (spot if it is spot
    and the entry has one), else GPUs x the gpu_type's price in force at ``at_ms``, else 0."""
    a = pool.autoscale
    for n in a.node_prices if a is not None else ():
        if n.instance_type == instance_type:
            price = n.spot if lifecycle == "spot" and n.spot is not None else n.on_demand
            return _text(Decimal(price))
    at = datetime.fromtimestamp(at_ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    prices = sorted(
        (p for p in estate.pricing if p.gpu_type == pool.gpu_type and p.effective_from <= at),
        key=lambda p: p.effective_from,
    )
    if not prices:
        return "0"
    return _text(Decimal(prices[-1].per_gpu_hour) * gpus)


def _text(amount: Decimal) -> str:
    """An amount as the ledger stores it (DECIMAL(18,6)): rounded half up to the
    millionth, as text without trailing zeros."""
    return format(amount.quantize(MICRO, ROUND_HALF_UP).normalize(), "f")


class CloudBook:
    """The cloud nodes and scaling reports of every pool, as the events say."""

    def __init__(self) -> None:
        self.nodes: dict[str, CloudNode] = {}
        self.scaling: dict[str, Scaling] = {}
        self.capped_alerts: set[tuple[str, str]] = set()
        """(pool, "YYYY-MM") whose spend_cap_reached alert was raised."""

    # reducers ------------------------------------------------------------------------------
    def on_started(self, data: dict[str, Any], at: int) -> CloudNode:
        n = CloudNode(
            data["node"],
            data["pool"],
            data["provider"],
            data["instance_type"],
            data["lifecycle"],
            int(data["gpus"]),
            str(data["per_hour"]),
            data.get("currency") or "",
            at,
        )
        self.forget_before(month_start(at))
        self.nodes[n.node] = n
        return n

    def on_ended(self, node: str, at: int, reason: str | None) -> CloudNode | None:
        n = self.nodes.get(node)
        if n is not None and n.end_ms is None:
            n.end_ms, n.end_reason = max(at, n.start_ms), reason
        return n

    def on_scaling(self, pool: str, data: dict[str, Any], at: int) -> None:
        if data.get("cause") is None:
            self.scaling.pop(pool, None)
        else:
            self.scaling[pool] = Scaling(
                data.get("cause"), data.get("reason"), int(data.get("waiting") or 0), at
            )

    def on_capped(self, pool: str, month: str) -> None:
        self.capped_alerts.add((pool, month))

    # reading -------------------------------------------------------------------------------
    def spent_micro(self, pool: str, now: int) -> int:
        since = month_start(now)
        return sum(n.cost_micro(since, now) for n in self.nodes.values() if n.pool == pool)

    def open_nodes(self, pool: str) -> list[CloudNode]:
        return [n for n in self.nodes.values() if n.pool == pool and n.end_ms is None]

    def forget_before(self, ms: int) -> None:
        """Drops nodes that ended before ``ms`` (a month's spend needs this month's only)."""
        for k in [k for k, n in self.nodes.items() if n.end_ms is not None and n.end_ms < ms]:
            del self.nodes[k]


def cap_micro(pool: CPool) -> int | None:
    a = pool.autoscale
    if a is None or a.spend_cap is None:
        return None
    return int(Decimal(a.spend_cap) * 1_000_000)


def _money(micro: int) -> str:
    return format((Decimal(micro) * MICRO).quantize(MICRO).normalize(), "f")
