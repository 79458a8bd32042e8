"""Prometheus metrics (issue 13): what ``GET /metrics`` exposes (docs/metrics.md lists them).

Two kinds, so that metrics add no work to the engine's hot path:
- **counters and the pass histogram** are incremented where the thing happens: the pass
  duration in the sequencer around ``run_pass``, submissions and preemptions as the State
  takes their events in (``count``: one look at each event's kind), so a scrape's counters
  agree with its gauges;
- **gauges** (pools, queues, budgets, workers, the estate) are computed at scrape time by
  ``StateCollector`` from the daemon's state through the same read paths as the API
  (``views``); a scrape runs on the event loop between sequencer cycles, so it sees one
  consistent state.
Each daemon has its own ``CollectorRegistry`` (not prometheus_client's global one), so
several daemons in one process (tests) do not collide.

Every daemon, a standby too, also says what it is (``RoleCollector``: leader or not, the
lease's epoch it saw, a standby's replica lag) and how its process does (prometheus_client's
``ProcessCollector``): Prometheus scrapes each daemon of a control plane and must see each
one's own health. A standby's registry (``Metrics(..., state=False)``) has only those: the
state's gauges are the leader's, and a standby repeating them would double every sum taken
across the daemons (docs/ha.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from klique_util.units import HOUR_S, SECOND_MS, from_milli
from kliqued.engine import budget_status

from kliqued.daemon.api import treeviews, views
from kliqued.daemon.events import Event

if TYPE_CHECKING:
    from kliqued.daemon.state.daemon import Daemon

PASS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds: a steady pass takes milliseconds, a pass over the XL state up to about a
second."""

WORKER_STATES = ("alive", "silent", "lost")

disable_created_metrics()
"""No ``*_created`` series beside each counter and histogram: in the 0.0.4 text format they
are gauges of their own that dashboards never use (prometheus_client's switch is
process-wide; the daemon has no other metrics)."""


def _g(milli: int) -> float:
    return from_milli(milli)


@dataclass(frozen=True)
class Role:
    """A daemon's part in its control plane, as its ``/metrics`` says it."""

    leader: bool
    """Leads: holds the lease, or is the one daemon of a DuckDB file."""
    epoch: int | None = None
    """The lease's epoch this daemon last saw (its own while it leads); None without a
    lease (a DuckDB file) or before the first look."""
    replica_lag: int | None = None
    """A standby's: events in the log its state for reads has not applied, at its last
    look; None on a leader, and on a standby before its state is loaded."""


LEADER = Role(True)
"""A daemon without a lease (a DuckDB file): the leader by construction."""


class RoleCollector(Collector):
    """``klique_leader``, ``klique_lease_epoch``, ``klique_replica_lag_events``: the same
    families on every daemon, with a sample where the value is known."""

    def __init__(self, role: Callable[[], Role]) -> None:
        self.role = role

    def collect(self) -> Iterator[Metric]:
        r = self.role()
        leader = GaugeMetricFamily(
            "klique_leader",
            "1 on the daemon that leads (holds the "
            "lease, or the one daemon of a DuckDB file), 0 on a standby",
        )
        leader.add_metric([], 1 if r.leader else 0)
        yield leader
        epoch = GaugeMetricFamily(
            "klique_lease_epoch",
            "The lease's epoch this daemon last "
            "saw, its own while it leads (none with a DuckDB file)",
        )
        if r.epoch is not None:
            epoch.add_metric([], r.epoch)
        yield epoch
        lag = GaugeMetricFamily(
            "klique_replica_lag_events",
            "A standby: events in the log "
            "its state for reads has not applied, at its last look (none "
            "on the leader)",
        )
        if r.replica_lag is not None:
            lag.add_metric([], r.replica_lag)
        yield lag


class ClockCollector(Collector):
    """``klique_clock_steps_total`` (by direction) and ``klique_clock_offset_seconds``: steps
    of the wall clock the daemon saw, and how far its own time is from the wall clock
    (clock.py: it closes that slowly, never by a jump)."""

    def __init__(self, daemon: "Daemon") -> None:
        self.d = daemon

    def collect(self) -> Iterator[Metric]:
        clock = self.d.clock
        steps = CounterMetricFamily(
            "klique_clock_steps",
            "Steps of the wall clock seen since the daemon started (more than 2 s at once)",
            labels=["direction"],
        )
        for direction, n in sorted(clock.steps.items()):
            steps.add_metric([direction], n)
        yield steps
        offset = GaugeMetricFamily(
            "klique_clock_offset_seconds",
            "The wall clock minus the daemon's time (monotonic, slewed toward the wall clock)",
        )
        offset.add_metric([], clock.offset_ms / SECOND_MS)
        yield offset


class StateCollector(Collector):
    """The gauges, read from the daemon's state at each scrape."""

    def __init__(self, daemon: "Daemon") -> None:
        self.d = daemon

    def collect(self) -> Iterator[Metric]:
        d = self.d
        yield CounterMetricFamily(
            "klique_events_committed",
            "Events in the durable event log (its last sequence number): counts across restarts",
            value=d.seq,
        )
        ready = GaugeMetricFamily("klique_ready", "1 once the daemon has an estate and state")
        ready.add_metric([], 1 if d.ready else 0)
        yield ready
        held = GaugeMetricFamily(
            "klique_task_records",
            "Task records in memory: tasks not "
            "yet ended and the latest ended ones (--keep-ended); older "
            "ones are in the task history (docs/ha.md)",
        )
        held.add_metric([], len(d.records))
        yield held
        if not d.ready:
            return
        yield from self._estate()
        yield from self._pools()
        yield from self._queues()
        yield from self._policies()
        yield from self._lending()
        yield from self._workers()

    def _estate(self) -> Iterator[Metric]:
        d, st = self.d, self.d.st()
        info = GaugeMetricFamily(
            "klique_estate_info",
            "The running estate revision (1)",
            labels=["revision", "commit", "source"],
        )
        info.add_metric([d.estate.revision, d.estate.commit or "", d.estate.source or ""], 1)
        yield info
        applied = GaugeMetricFamily(
            "klique_estate_applied_timestamp_seconds", "When the running revision was applied"
        )
        if d.estate.applied_at is not None:
            applied.add_metric([], d.estate.applied_at / SECOND_MS)
        yield applied
        refused = GaugeMetricFamily(
            "klique_estate_refused",
            "1 while the last revision offered (GitOps reload) was refused",
            labels=["revision"],
        )
        r = views.refused(d.estate.refused)
        if r is not None:
            refused.add_metric([str(r.get("revision") or "")], 1)
        yield refused
        enabled = GaugeMetricFamily("klique_engine_enabled", "1 while the engine places work")
        enabled.add_metric([], 1 if st.enabled else 0)
        yield enabled
        last = GaugeMetricFamily(
            "klique_last_pass_timestamp_seconds", "When the last engine pass ran"
        )
        if d.last_pass_at is not None:
            last.add_metric([], d.last_pass_at / SECOND_MS)
        yield last

    def _pools(self) -> Iterator[Metric]:
        labels = ["pool", "kind", "gpu_type"]
        fams = {
            k: GaugeMetricFamily(f"klique_pool_{k}_gpus", text, labels=labels)
            for k, text in (
                ("capacity", "GPUs the pool has"),
                ("used", "GPUs placed on the pool"),
                (
                    "borrowed",
                    "GPUs on the pool held by groups above their reservation (reclaimable)",
                ),
                ("free", "GPUs not placed"),
            )
        }
        takes = GaugeMetricFamily(
            "klique_pool_takes_work",
            "1 while the pool takes placements (a live worker, or autoscaled)",
            labels=labels,
        )
        spend = GaugeMetricFamily(
            "klique_cloud_spend",
            "An autoscaled pool's cloud spend this UTC month, running nodes up to now (cloud.py)",
            labels=["pool", "currency"],
        )
        cap = GaugeMetricFamily(
            "klique_cloud_spend_cap",
            "An autoscaled pool's monthly spend cap (pools with one)",
            labels=["pool", "currency"],
        )
        nodes = GaugeMetricFamily(
            "klique_cloud_nodes",
            "An autoscaled pool's running nodes by lifecycle",
            labels=["pool", "lifecycle"],
        )
        waits = GaugeMetricFamily(
            "klique_cloud_waiting_tasks",
            "Placed tasks that wait for a node the autoscaler cannot add, by cause",
            labels=["pool", "cause"],
        )
        reported = GaugeMetricFamily(
            "klique_pool_reported_gpus",
            "GPUs the pool's live workers report (the engine counts the declared capacity)",
            labels=labels,
        )
        mismatch = GaugeMetricFamily(
            "klique_pool_capacity_mismatch",
            "How many ways the pool's live workers disagree with what it declares (0: they agree)",
            labels=labels,
        )
        for p in views.pools(self.d):
            key = [p["name"], p["kind"], p["gpu_type"] or ""]
            for k, fam in fams.items():
                fam.add_metric(key, float(p[k]))
            takes.add_metric(key, 1 if p["takes_work"] else 0)
            c = p.get("cloud")
            if c is not None:
                spend.add_metric([p["name"], c["currency"]], float(c["spent"]))
                if c["spend_cap"] is not None:
                    cap.add_metric([p["name"], c["currency"]], float(c["spend_cap"]))
                for life in ("spot", "on-demand"):
                    nodes.add_metric(
                        [p["name"], life], sum(1 for n in c["nodes"] if n["lifecycle"] == life)
                    )
                s = c["scaling"]
                for cause in ("spend_cap", "capacity", "error"):
                    waits.add_metric(
                        [p["name"], cause],
                        s["waiting"] if s is not None and s["cause"] == cause else 0,
                    )
            truth = p["capacity_truth"]
            reported.add_metric(key, float(truth["reported"]["gpus"]))
            mismatch.add_metric(key, float(len(truth["mismatches"])))
        yield from fams.values()
        yield from (takes, spend, cap, nodes, waits, reported, mismatch)

    def _queues(self) -> Iterator[Metric]:
        d = self.d
        idx, st, now = d.idx(), d.st(), d.clock.now()
        labels = ["resource", "group"]
        depth = GaugeMetricFamily(
            "klique_queue_depth", "Tasks queued on the compute resource", labels=labels
        )
        oldest = GaugeMetricFamily(
            "klique_queue_oldest_wait_seconds",
            "How long the task queued longest (since its submission) has waited; 0 when none waits",
            labels=labels,
        )
        placed = GaugeMetricFamily(
            "klique_resource_placed_tasks", "Tasks placed from the compute resource", labels=labels
        )
        for name, cr in idx.resources.items():
            key = [name, cr.group]
            q = st.queues.get(name)
            t = q.oldest() if q is not None and q.live else None
            depth.add_metric(key, q.live if q is not None else 0)
            oldest.add_metric(key, max(0, now - t.submitted_at) / SECOND_MS if t else 0)
            placed.add_metric(key, d.placed_count.get(name, 0))
        yield depth
        yield oldest
        yield placed

    def _policies(self) -> Iterator[Metric]:
        d = self.d
        idx, st, now = d.idx(), d.st(), d.clock.now()
        labels = ["policy", "group"]
        gauges = {
            k: GaugeMetricFamily(f"klique_policy_{k}_gpus", text, labels=labels)
            for k, text in (
                ("used", "GPUs the policy's group holds"),
                ("reservation", "GPUs reserved for the group"),
                ("limit", "The most GPUs the group may hold"),
            )
        }
        blabels = ["policy", "group", "period"]
        budget = {
            k: GaugeMetricFamily(f"klique_budget_{k}", text, labels=blabels)
            for k, text in (
                ("seconds", "The budget of the period (budget seconds: budget hours x 3600)"),
                ("used_seconds", "Budget seconds used in the current period"),
                (
                    "left_seconds",
                    "Budget seconds left in the current period (negative once overrun)",
                ),
                ("burn_rate", "Budget used per unit of time at the current placements"),
                ("resets_timestamp_seconds", "When the period ends"),
            )
        }
        for name, g in idx.group_of_policy.items():
            gi = idx.groups[g]
            gauges["used"].add_metric([name, g], _g(st.used.get(g, 0)))
            gauges["reservation"].add_metric([name, g], _g(gi.reservation))
            gauges["limit"].add_metric([name, g], _g(gi.limit))
            b = budget_status(idx, st, name, now)
            if b is None or gi.budget is None:
                continue
            key = [name, g, b.period]
            # Prometheus' base unit is the second (promtool refuses hours); the dashboard
            # and the CLI keep hours
            budget["seconds"].add_metric(key, from_milli(gi.budget.hours_milli) * HOUR_S)
            budget["used_seconds"].add_metric(key, b.used_hours * HOUR_S)
            budget["left_seconds"].add_metric(key, b.left_hours * HOUR_S)
            budget["burn_rate"].add_metric(key, b.burn_rate)
            budget["resets_timestamp_seconds"].add_metric(key, b.resets_at / SECOND_MS)
        yield from gauges.values()
        yield from budget.values()

    def _lending(self) -> Iterator[Metric]:
        """lending.md "What the product shows": each level's fair share and weight (under
        ``order: fair`` only: samples of nothing else would mislead), and the GPU-seconds
        its tasks' preemptions lost (always: every preemption records it)."""
        d = self.d
        idx, st = d.idx(), d.st()
        labels = ["policy", "group"]
        share = GaugeMetricFamily(
            "klique_lending_share",
            "With order: fair: the level's "
            "borrowed GPUs / lend_weight (the ratio idle GPUs are "
            "shared by, lowest first)",
            labels=labels,
        )
        weight = GaugeMetricFamily(
            "klique_lend_weight", "With order: fair: the level's lend_weight", labels=labels
        )
        lost = CounterMetricFamily(
            "klique_lost_gpu_seconds",
            "GPU-seconds of work lost by "
            "the preemptions of the level's tasks (its subtree's, for "
            "a department), since its last checkpoint or placement",
            labels=labels,
        )
        for name, g in idx.group_of_policy.items():
            fair = treeviews.fair_share(d, g)
            if fair:
                share.add_metric([name, g], fair["share"])
                weight.add_metric([name, g], fair["lend_weight"])
            lost.add_metric([name, g], st.lost_units.get(g, 0) / (1000 * SECOND_MS))
        yield from (share, weight, lost)

    def _workers(self) -> Iterator[Metric]:
        d = self.d
        counts = {(p.name, s): 0 for p in d.idx().estate.pools for s in WORKER_STATES}
        for w in d.workers.values():
            key = (w.pool, views.worker_state(d, w))
            counts[key] = counts.get(key, 0) + 1
        fam = GaugeMetricFamily(
            "klique_workers",
            "Registered workers by pool and state "
            "(alive: heard from within the TTL; silent: not lately; "
            "lost: declared lost)",
            labels=["pool", "state"],
        )
        for (pool, state), n in sorted(counts.items()):
            fam.add_metric([pool, state], n)
        yield fam


class Metrics:
    """One daemon's metrics: its registry, the counters the sequencer increments, the state
    collector (``state``: a leader's), its role and its process."""

    def __init__(
        self, daemon: "Daemon", role: Callable[[], Role] | None = None, state: bool = True
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.role: Callable[[], Role] = role or (lambda: LEADER)
        """What ``klique_leader`` and its neighbours read at each scrape; the server sets a
        leader's from its lease."""
        self.registry.register(RoleCollector(lambda: self.role()))
        ProcessCollector(registry=self.registry)  # process_*: CPU, memory, open files
        self.registry.register(ClockCollector(daemon))  # every daemon's own clock
        own = self.registry if state else None  # a standby's are kept out of its answer
        self.pass_seconds = Histogram(
            "klique_pass_duration_seconds",
            "Duration of an engine pass",
            buckets=PASS_BUCKETS,
            registry=own,
        )
        self.submissions = Counter(
            "klique_submissions",
            "Tasks submitted (committed) since the daemon started",
            ["resource"],
            registry=own,
        )
        self.preemptions = Counter(
            "klique_preemptions",
            "Preemptions since the daemon started, by reason (reclaim, "
            "lost, returned, ...) and pool",
            ["reason", "pool"],
            registry=own,
        )
        self.store_unavailable = Gauge(
            "klique_store_unavailable",
            "1 while the event log cannot be written (disk full, "
            "PostgreSQL unreachable): writes are refused, reads answer; by kind",
            ["kind"],
            registry=self.registry,
        )
        self.store_outages = Counter(
            "klique_store_outages",
            "Times the event log became unwritable since the daemon "
            "started, by kind (disk-full, unreachable)",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("disk-full", "unreachable"):
            self.store_unavailable.labels(kind).set(0)
        if state:
            self.registry.register(StateCollector(daemon))

    def store_away(self, kind: str) -> None:
        """The sequencer found the store away (loop.py): the gauge up, one more outage."""
        self.store_unavailable.labels(kind).set(1)
        self.store_outages.labels(kind).inc()

    def store_back(self) -> None:
        for kind in ("disk-full", "unreachable"):
            self.store_unavailable.labels(kind).set(0)

    def count(self, events: Iterable[Event]) -> None:
        """Counts what matters of events as the State takes them in: a pass's at once (the
        State changed when it ran), a request's once committed (it is applied after)."""
        for ev in events:
            if ev.kind == "submitted":
                self.submissions.labels(str(ev.data.get("resource") or "")).inc()
            elif ev.kind == "preempted":
                self.preemptions.labels(
                    str(ev.data.get("kind") or ""), str(ev.data.get("pool") or "")
                ).inc()

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)
