"""The autoscaler's loop: observe, decide (workers/autoscaler/decide.py), act.

Every ``interval`` seconds (default 10):

0. **heartbeat**: ``POST /v1/pools/{pool}/autoscaler`` with the interval: an autoscaled pool
   with no live worker takes work only while its autoscaler runs (docs/decisions.md N7);
   silent for three rounds (at least the workers' TTL), it is lost and the pool's unstarted
   work goes back to its queues.
1. **observe**: the pool's placed tasks from the control plane (``GET /v1/tasks?state=placed``
   with an admin token, filtered by ``pool`` here: the API has no pool filter), and the
   provider's nodes with the tasks each one's worker holds. A placed task no node holds is
   *waiting*. A task the API shows with a ``worker`` (once the control plane exposes the
   lease) counts as held by that worker's node too.
2. **decide**: ``decide(Observation)`` gives launches and releases.
3. **act**: a spot launch refused with CapacityUnavailable marks spot unavailable for
   ``spot_retry_s`` and the decision is made again at once, which asks for on-demand (the
   fallback); an on-demand refusal is logged and retried next round. Releases terminate
   the node (the local provider's worker drains and deregisters itself), then make sure
   its worker is deregistered at the control plane: a released node's worker leaves the
   worker list at once instead of being declared ``lost`` a TTL later (a cloud machine
   that vanished cannot say goodbye itself).

The control plane being unreachable skips a round (nothing is released on missing data).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from klique_util.units import gpus_to_milli
from kliqued.sdk import Client, KliqueError
from workers.autoscaler.decide import (
    Launch,
    NodeView,
    Observation,
    ScalePolicy,
    Terminate,
    decide,
    track_idle,
)
from workers.autoscaler.providers import CapacityUnavailable, Node, Provider
from workers.errors import ProviderError

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    waiting: int = 0
    nodes: int = 0
    launched: list[Node] = field(default_factory=list)
    terminated: list[tuple[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    skipped: str | None = None
    held: tuple[str, str] | None = None
    """(cause, reason) when placed work waits for a node this round could not add:
    ``spend_cap``, ``capacity`` (on-demand refused too) or ``error`` (the provider)."""

    def line(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        parts = [f"{self.waiting} waiting task(s), {self.nodes} node(s)"]
        if self.held is not None and self.held[0] == "spend_cap":
            parts.append(f"held: {self.held[1]}")
        parts += [
            f"launched {n.id} ({n.gpus} GPU(s), {'spot' if n.spot else 'on-demand'})"
            for n in self.launched
        ]
        parts += [f"released {nid} ({why})" for nid, why in self.terminated]
        parts += [f"refused: {r}" for r in self.refused]
        return "; ".join(parts)


class Autoscaler:
    def __init__(
        self,
        client: Client,
        provider: Provider,
        pool: str,
        policy: ScalePolicy,
        clock=time.monotonic,
        wall=time.time,
    ):
        self.client, self.provider, self.pool, self.policy = client, provider, pool, policy
        self.clock, self.wall = clock, wall
        self.idle_since: dict[str, float] = {}
        self.spot_unavailable_until = float("-inf")
        self.reported: tuple[str, str] | None = None
        """The scaling state last told to the control plane (once ``told``)."""
        self.told = False
        self.missing: set[str] = set()
        """Recorded nodes the provider did not list last round."""
        self.interval_s = 10.0
        """Its round interval, told with each heartbeat (``run`` sets it)."""

    def placed_tasks(self) -> list[dict]:
        # the control plane filters by pool (GET /v1/tasks?pool=); the check here stays for
        # one that does not know the filter yet
        return [
            t
            for t in self.client.tasks(state="placed", pool=self.pool)
            if t.get("pool") == self.pool
        ]

    def observe(self) -> tuple[Observation, dict[str, Node], int]:
        tasks = self.placed_tasks()
        nodes = self.provider.list(self.pool)
        now, wall = self.clock(), self.wall()
        by_worker = {n.worker_id: n for n in nodes if n.worker_id}
        held: dict[str, dict[str, int]] = {n.id: dict(n.running or {}) for n in nodes}
        placed = {t["id"]: gpus_to_milli(t.get("gpus") or 1) for t in tasks}
        for t in tasks:  # the control plane's word, where it gives it
            node = by_worker.get(t.get("worker") or "")
            if node is not None:
                held[node.id][t["id"]] = placed[t["id"]]
        # a task held but no longer placed (ended, requeued) frees its room once the worker
        # forgets it; until then it still takes room
        on_nodes = {tid for h in held.values() for tid in h}
        waiting = tuple(m for tid, m in placed.items() if tid not in on_nodes)
        used = {n.id: sum(held[n.id].values()) for n in nodes if n.up and not n.gone}
        self.idle_since = track_idle(self.idle_since, used, now)
        views = tuple(
            NodeView(
                n.id,
                n.gpus,
                n.spot,
                launched_at=now - max(0.0, wall - n.launched_at),
                up=n.up,
                gone=n.gone,
                used_milli=sum(held[n.id].values()),
                idle_since=self.idle_since.get(n.id),
            )
            for n in nodes
        )
        obs = Observation(now, self.policy, views, waiting, self.spot_unavailable_until)
        return obs, {n.id: n for n in nodes}, len(placed)

    def heartbeat(self) -> None:
        """Tells the control plane this autoscaler runs (a failure is logged: the next
        round tries again, well within its timeout)."""
        try:
            self.client.autoscaler_heartbeat(self.pool, self.interval_s)
        except KliqueError as exc:
            log.warning(
                "heartbeat not taken by the control plane (%s): told again next round", exc.message
            )

    def step(self) -> RoundReport:
        report = RoundReport()
        self.heartbeat()
        try:
            obs, nodes, _ = self.observe()
        except KliqueError as exc:
            report.skipped = f"the control plane: {exc.message}"
            log.warning("round skipped: %s", report.skipped)
            return report
        except ProviderError as exc:
            report.skipped = str(exc)
            log.warning("round skipped: %s", report.skipped)
            return report
        report.waiting, report.nodes = len(obs.waiting), len(nodes)
        cloud = self._cloud()
        capped = bool(cloud and cloud.get("capped"))
        actions = self._decide(obs, capped)
        if cloud is not None and capped and any(isinstance(a, Launch) for a in decide(obs)):
            # the reason stays the same all month (a changed reason is logged again)
            report.held = (
                "spend_cap",
                f"spend cap reached: {cloud['spend_cap']} "
                f"{cloud['currency']} in {cloud['month']}, no new "
                f"node this month",
            )
            log.warning(
                "%s (%s spent, %d waiting task(s))", report.held[1], cloud["spent"], report.waiting
            )
        for _ in range(3):
            retry = False
            for action in actions:
                if isinstance(action, Terminate):
                    node = nodes.pop(action.node, None)
                    if node is not None:
                        log.info("releasing node %s: %s", action.node, action.reason)
                        try:
                            self.provider.terminate(node)
                        except ProviderError as exc:
                            report.refused.append(str(exc))
                            log.error("%s: releasing it again next round", exc)
                            continue
                        self._deregister(node)
                        self.idle_since.pop(action.node, None)
                        report.terminated.append((action.node, action.reason))
                elif isinstance(action, Launch):
                    try:
                        node = self.provider.launch(self.pool, action.gpus, action.spot)
                    except CapacityUnavailable as exc:
                        report.refused.append(str(exc))
                        if action.spot:
                            log.info("spot refused (%s): on-demand instead", exc)
                            self.spot_unavailable_until = self.clock() + self.policy.spot_retry_s
                            retry = True
                            break
                        log.warning("on-demand refused (%s): retrying next round", exc)
                        report.held = ("capacity", str(exc))
                        continue
                    except ProviderError as exc:
                        report.refused.append(str(exc))
                        log.error("%s: retrying next round", exc)
                        report.held = ("error", str(exc))
                        continue
                    log.info(
                        "launched node %s: %d GPU(s), %s, for %d waiting task(s)",
                        node.id,
                        node.gpus,
                        "spot" if node.spot else "on-demand",
                        len(action.for_milli),
                    )
                    report.launched.append(node)
            if not retry:
                break
            # decide again with spot marked unavailable (and the nodes launched so far)
            obs, nodes, _ = self.observe()
            actions = [a for a in self._decide(obs, capped) if isinstance(a, Launch)]
        if cloud is not None:
            self._tell(cloud, report)
        return report

    def _decide(self, obs: Observation, capped: bool) -> list:
        """The decision, without launches once the pool's spend cap is reached."""
        actions = decide(obs)
        return [a for a in actions if not isinstance(a, Launch)] if capped else actions

    def _cloud(self) -> dict | None:
        """The pool's ``cloud`` at the control plane (spend, cap, recorded nodes), or None
        where it has none (not autoscaled there, or a control plane without it)."""
        try:
            pool = next((p for p in self.client.pools() if p.get("name") == self.pool), None)
        except KliqueError as exc:
            log.debug("no cloud view of pool %s: %s", self.pool, exc.message)
            return None
        return pool.get("cloud") if pool else None

    def _tell(self, cloud: dict, report: RoundReport) -> None:
        """Records at the control plane the nodes it does not know yet and the end of those
        released or gone, then why work waits (when that changed): cloud spend is known,
        and the wait shows in ``kliqued pools`` and the events. A recorded node the provider
        does not list is ended only when it is missing two rounds in a row (a provider's
        list may lag behind); each call failing alone is tried again next round."""
        known = {n["node"] for n in cloud.get("nodes") or []}
        ended = dict(report.terminated)
        try:
            live = {n.id: n for n in self.provider.list(self.pool) if not n.gone}
            missing = {nid for nid in known - set(live) if nid not in ended}
        except ProviderError as exc:
            log.warning("nodes not reconciled with the control plane: %s", exc)
            live, missing = {}, set()  # nothing is ended on a failed list
        live.update({n.id: n for n in report.launched})
        c = self.client
        calls: list[Callable[[], object]] = [
            partial(
                c.record_cloud_node,
                self.pool,
                nid,
                self.provider.name,
                str(n.meta.get("instance_type") or f"{self.provider.name}-{n.gpus}gpu"),
                "spot" if n.spot else "on-demand",
                n.gpus,
            )
            for nid, n in live.items()
            if nid not in known and nid not in ended
        ]
        calls += [
            partial(c.end_cloud_node, self.pool, nid, ended[nid]) for nid in known & set(ended)
        ]
        calls += [
            partial(c.end_cloud_node, self.pool, nid, "gone") for nid in missing & self.missing
        ]
        self.missing = missing - self.missing
        held = report.held if report.waiting else None
        if held != self.reported or not self.told:

            def tell_wait() -> None:
                cause, reason = held if held else (None, None)
                self.client.report_scaling(self.pool, cause, reason, report.waiting)
                self.reported, self.told = held, True

            calls.append(tell_wait)
        for call in calls:
            try:
                call()
            except KliqueError as exc:
                log.warning(
                    "the control plane did not take a node or the wait (%s): told again next round",
                    exc.message,
                )

    def _deregister(self, node: Node) -> None:
        """The released node's worker leaves the control plane's list (if its own goodbye
        did not already): its tasks, if any, go back to their queues now."""
        if not node.worker_id:
            return
        try:
            gone = self.client.deregister_worker(node.worker_id)
        except KliqueError as exc:
            log.warning(
                "node %s released, but its worker %s could not be deregistered (%s):"
                " the control plane declares it lost after its TTL",
                node.id,
                node.worker_id,
                exc.message,
            )
            return
        if gone is not None:
            log.info("deregistered worker %s of released node %s", node.worker_id, node.id)

    def run(
        self, interval_s: float = 10.0, rounds: int | None = None, stop=lambda: False, echo=None
    ) -> None:
        n = 0
        self.interval_s = interval_s
        while not stop():
            started = self.clock()
            report = self.step()
            if echo is not None and (
                report.launched or report.terminated or report.refused or report.skipped
            ):
                echo(report.line())
            n += 1
            if rounds is not None and n >= rounds:
                return
            delay = interval_s - (self.clock() - started)
            end = self.clock() + max(0.0, delay)
            while self.clock() < end and not stop():
                time.sleep(min(0.1, end - self.clock()))
