"""Autoscalers' liveness (issue 25, item 8; docs/decisions.md N7).

An autoscaled pool with no live worker takes work only while its autoscaler runs: the
autoscaler launches the nodes that start what is placed there. The autoscaler says it runs
by ``POST /v1/pools/{pool}/autoscaler`` every round (an admin call, as its others); one
silent for longer than its timeout is lost, and the engine is told
(``State.set_autoscaler_live``): the pool takes no new work and its unstarted work goes back
to its queues at once. Like workers' heartbeats (G5) this is not logged: after a restart an
autoscaled pool holding placed work gets one timeout for its autoscaler to come back.

Here the record the live state keeps per autoscaled pool and its timeout; the heartbeat and
the loss, prepared for the sequencer, are the fleet room's (``fleet/autoscalers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


MAX_INTERVAL_S = 3600.0
ROUNDS_MISSED = 3
"""An autoscaler is lost after this many of its rounds with no heartbeat (at least the
workers' TTL)."""


@dataclass
class AutoscalerInfo:
    pool: str
    last_seen: float
    """monotonic seconds of its last heartbeat"""
    interval_s: float = 0.0
    """its round interval, as it said"""
    lost: bool = False


def timeout_s(ttl_s: float, interval_s: float) -> float:
    """How long an autoscaler may stay silent: the workers' TTL, or three of its rounds if
    that is longer (an autoscaler heartbeats once a round, by default every 10 s)."""
    return max(ttl_s, ROUNDS_MISSED * interval_s)
