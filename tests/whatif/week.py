"""A week of demand for the what-if tests, made the way a daemon's export writes it
(klique_util.demand), from a seeded generator: the same file on every run.

Pool ``onprem`` has 16 GPUs; team-a and team-b each ask for about 10 GPUs on average in
working hours and team-c for about 6, so the pool is contended every day, team-c's daily
budget (45 h) runs out most days, and the nights are quiet.
"""

from __future__ import annotations

import random

from klique_util.demand import DemandRow
from klique_util.units import HOUR_MS, MINUTE_S, SECOND_MS

START_MS = 1_767_571_200_000
"""2026-01-05T00:00:00Z, a Monday."""
USERS = {"team-a": "alice", "team-b": "bob", "team-c": "carol"}
RATE = {"team-a": 5, "team-b": 5, "team-c": 3}
"""Submissions per working hour."""


def week(seed: int = 16, days: int = 7) -> list[DemandRow]:
    rng = random.Random(seed)
    rows: list[DemandRow] = []
    for day in range(days):
        for hour in range(8, 20):
            for group, rate in RATE.items():
                for _ in range(rate):
                    at = (
                        START_MS
                        + (day * 24 + hour) * HOUR_MS
                        + rng.randrange(60 * MINUTE_S) * SECOND_MS
                    )
                    big = rng.random() < 0.15
                    gpus = 4000 if big else None
                    resource = f"{group}/{'big' if big else 'one'}"
                    runtime = rng.randrange(20, 150) * MINUTE_S * SECOND_MS
                    rows.append(
                        DemandRow(
                            "",
                            at,
                            resource,
                            USERS[group],
                            None,
                            gpus,
                            runtime,
                            f"user:{USERS[group]}",
                            "finished",
                        )
                    )
    rows.sort(key=lambda r: r.submit_ms)
    return [
        DemandRow(
            f"t-{i:05d}",
            r.submit_ms,
            r.resource,
            r.user,
            r.project,
            r.gpus_milli,
            r.runtime_ms,
            r.channel,
            r.status,
        )
        for i, r in enumerate(rows, 1)
    ]
