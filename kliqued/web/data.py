"""What each dashboard page shows, for one principal: the JSON API's own views and access
rules (``kliqued.daemon.api.views``, ``auth.Access``, the events and ledger scopes), arranged for
a page. Nothing here decides who sees what a second time: each function filters exactly as
the API route it mirrors, so a page never shows a principal more than the API would.

The live parts read the daemon's state on the event loop (consistent between sequencer
cycles, as the API's views); the database parts (event log, ledger) run on the store's reader
threads.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

from compiler.compiled import CompiledEstate
from compiler.plan.diff import diff
from compiler.source import SourceMap
from klique_util.tree import policy_tree
from klique_util.units import from_milli
from kliqued.daemon.api import views
from kliqued.daemon.state import history
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.api.handlers import events as events_api
from kliqued.daemon.storage.store import Store
from kliqued.daemon.units import iso, parse_iso
from kliqued.ledger import cio as ledger_cio
from kliqued.ledger import export as ledger_export

log = logging.getLogger(__name__)

PEOPLE = ("admin", "finance", "planner", "user")


@dataclass(frozen=True, slots=True)
class Page:
    slug: str
    title: str
    roles: tuple[str, ...]
    """Who may open it: the roles of the API routes it reads."""
    about: str


PAGES = (
    Page(
        "orchestration",
        "Orchestration",
        PEOPLE,
        "Pools, their workers and use over time, and the live event log.",
    ),
    Page(
        "policy",
        "Policy",
        ("admin", "finance", "user"),
        "Each group's and department's use against reservation and limit, budgets, queues.",
    ),
    Page(
        "my-work",
        "My work",
        ("admin", "user"),
        "Your tasks: where each is, why it waits or was preempted, its logs.",
    ),
    Page(
        "usage",
        "Usage and cost",
        ("admin", "finance", "user"),
        "GPU-hours and cost by group, project, user, GPU type and pool.",
    ),
    Page(
        "audit",
        "Audit trail",
        ("admin", "finance", "user"),
        "Who started what, where it ran, why it was preempted, every estate revision.",
    ),
    Page("estate", "Estate", PEOPLE, "The running revision: its pools, profiles and policies."),
)
BY_SLUG = {pg.slug: pg for pg in PAGES}


def role(p: Principal) -> str:
    return p.name if p.kind == "role" else p.kind


def may_open(d: Daemon, p: Principal, page: Page) -> bool:
    """The page's roles; Usage and cost also needs a user to administer a group (the
    ledger's rule)."""
    if role(p) not in page.roles:
        return False
    if page.slug == "usage" and p.is_user:
        return bool(d.acc().admin_of(p.name))
    return True


# --------------------------------------------------------------------------- orchestration
WINDOWS = {"1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600, "7d": 7 * 24 * 3600}
BUCKETS = 60

POOL_USE_SQL = """
WITH b AS (SELECT unnest(generate_series(CAST(? AS BIGINT), CAST(? AS BIGINT),
                                         CAST(? AS BIGINT))) AS t),
     l AS (SELECT pool, gpus, start_at, coalesce(end_at, TIMESTAMP '9999-12-31') AS end_at
           FROM ledger
           WHERE end_at IS NULL OR end_at > make_timestamp(CAST(? AS BIGINT) * 1000))
SELECT l.pool, b.t, CAST(sum(l.gpus) AS DOUBLE)
FROM b JOIN l ON l.start_at <= make_timestamp(b.t * 1000)
             AND l.end_at > make_timestamp(b.t * 1000)
GROUP BY ALL ORDER BY 1, 2"""
"""GPUs in use per pool at each sample time of a window (ms): the ledger's placement
intervals that hold the instant."""


async def pool_use(store: Store, pools: list[str], now: int, window_s: int) -> dict[str, Any]:
    """A line per pool: GPUs in use over the window, sampled ``BUCKETS`` times."""
    step = max(1000, window_s * 1000 // BUCKETS)
    start = now - step * BUCKETS
    rows = await store.read(
        lambda cur: cur.execute(POOL_USE_SQL, [start, now, step, start]).fetchall()
    )
    times = list(range(start, now + 1, step))
    series: dict[str, dict[int, float]] = {p: {} for p in pools}
    for pool, t, used in rows:
        series.setdefault(pool, {})[t] = used
    x = [iso(t) for t in times]
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines",
                "name": pool,
                "x": x,
                "y": [vals.get(t, 0) for t in times],
                "line": {"shape": "hv"},
            }
            for pool, vals in series.items()
        ],
        "layout": {
            "title": {"text": "GPUs in use by pool"},
            "yaxis": {"title": {"text": "GPUs"}, "rangemode": "tozero"},
            "xaxis": {"title": {"text": "time (UTC)"}},
        },
    }


def pools(d: Daemon, p: Principal) -> list[dict[str, Any]]:
    """``GET /v1/pools`` (any token), each with its workers for an admin (``GET
    /v1/workers`` is an admin's)."""
    out = views.pools(d, truth=d.acc().fixes_pools(p))
    if p.is_admin:
        by_pool: dict[str, list[dict[str, Any]]] = {}
        for w in sorted(d.workers.values(), key=lambda w: w.id):
            by_pool.setdefault(w.pool, []).append(views.worker(d, w))
        for row in out:
            row["worker_list"] = by_pool.get(row["name"], [])
    return out


DATA = (
    "CASE WHEN kind = 'estate_applied' THEN json_object('source', "
    "json_extract_string(data, '$.source'), 'commit', json_extract_string(data, '$.commit')) "
    "ELSE data END"
)
"""An event's data, without the compiled estate an ``estate_applied`` carries (megabytes for
an XL estate; the views drop it anyway)."""
EVENT_SQL = (
    f"SELECT seq, at_ms, kind, task, actor, revision, {DATA} FROM events{{where}} "
    "ORDER BY seq DESC LIMIT ? OFFSET ?"
)


async def events(
    d: Daemon,
    store: Store,
    p: Principal,
    limit: int = 30,
    search: str | None = None,
    kind: str | None = None,
    actor: str | None = None,
    task: str | None = None,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """The newest events ``p`` may read (``GET /v1/events``'s scope), newest first, each with
    a line of text, from the ``offset``-th; ``search`` matches a task id, actor, kind or any
    text of the event; ``kind``, ``actor`` and ``task`` are exact."""
    if role(p) not in ("admin", "finance", "user"):
        return []
    where, params = events_api.scope(d, p)
    for column, value in (("kind", kind), ("actor", actor), ("task", task)):
        if value:
            where = [*where, f"{column} = ?"]
            params = [*params, value]
    if search:
        like = f"%{search}%"
        where = [
            *where,
            "(task ILIKE ? OR actor ILIKE ? OR kind ILIKE ? OR usr ILIKE ? "
            "OR grp ILIKE ? OR (kind <> 'estate_applied' AND data ILIKE ?))",
        ]
        params = [*params, like, like, like, like, like, like]
    sql = EVENT_SQL.format(where=" WHERE " + " AND ".join(where) if where else "")

    def run(cur: Any) -> list[dict[str, Any]]:
        out = []
        for r in cur.execute(sql, [*params, limit, offset]).fetchall():
            out.append(
                {
                    "seq": r[0],
                    "at_ms": r[1],
                    "kind": r[2],
                    "task": r[3],
                    "actor": r[4],
                    "revision": r[5],
                    "data": json.loads(r[6]) if r[6] else {},
                }
            )
        return out

    rows = await store.read(run)
    return [dict(views.event(r), text=event_text(r)) for r in rows]


def event_text(r: dict[str, Any]) -> str:
    """One line saying what happened, as the audit trail reads it."""
    k, data = r["kind"], r["data"] if isinstance(r["data"], dict) else {}
    if k == "submitted":
        return f"submitted to {data.get('resource')} by {data.get('user')}" + (
            f" (project {data['project']})" if data.get("project") else ""
        )
    if k == "placed":
        return f"placed on pool {data.get('pool')}" + (
            f" ({data['phase']})" if data.get("phase") else ""
        )
    if k == "preempted":
        return f"preempted on pool {data.get('pool') or '?'}: {data.get('text')}"
    if k == "cancelled":
        return f"cancelled: {data.get('text') or 'by request'}"
    if k == "ended":
        why = data.get("reason") or data.get("kind")
        code = data.get("exit_code")
        return f"ended: {why}" + (f", exit code {code}" if code is not None else "")
    if k == "leased":
        return f"leased to worker {data.get('worker')} (epoch {data.get('epoch')})"
    if k == "started":
        return f"started on worker {data.get('worker')}"
    if k == "estate_applied":
        return f"estate revision {r.get('revision')} applied from {data.get('source')}"
    if k == "estate_refused":
        errs = data.get("errors") or []
        return f"{refused_what(data)} refused: {len(errs)} error(s)" + (
            f"; first: {errs[0]}" if errs else ""
        )
    if k in ("worker_registered", "worker_lost", "worker_deregistered"):
        who = data.get("worker_id") or data.get("worker")
        return f"{k.replace('_', ' ')}: {who} (pool {data.get('pool')})"
    if k in ("alert", "waiting_alert"):
        return str(data.get("text") or k)
    if k == "alert_delivery":
        return delivery_text(data)
    return k.replace("_", " ")


# --------------------------------------------------------------------------- policy
MAX_ROWS = 200
"""Rows of a long table on one page (an XL estate has 2,000 policies); a filter narrows."""
MAX_CHARTS = 6
"""Burn-down charts on one page: the budgets closest to running out."""


def matches(q: str | None, *names: str | None) -> bool:
    return not q or any(n is not None and q.lower() in n.lower() for n in names)


def policies(d: Daemon, p: Principal, q: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """``GET /v1/policies`` for ``p`` (finance: all; a user: their groups' and the groups
    they administer, departments included) whose policy or group name holds ``q``, each
    with whether it is a department's envelope and its levels (the compiled estate's); the
    first ``MAX_ROWS``, departments first, in the organisation's tree order with each one's
    ``depth`` (``klique_util.tree``, as ``kliqued budget``), and how many matched. The ``MAX_CHARTS`` budgets
    with the least left get a burn-down chart."""
    idx, acc, now = d.idx(), d.acc(), d.clock.now()
    compiled = {c.name: c for c in idx.estate.policies}
    envelope = {c.name for c in idx.estate.policies if c.envelope}
    names = sorted(
        (
            n
            for n, g in idx.group_of_policy.items()
            if (p.is_finance or acc.sees_group(p, g)) and matches(q, n, g)
        ),
        key=lambda n: (n not in envelope, n),
    )
    out = []
    for name in names[:MAX_ROWS]:
        row = views.policy(d, name, now, alerts_for=p)
        c = compiled.get(name)
        row["envelope"] = bool(c is not None and c.envelope)
        row["levels"] = list(c.levels) if c is not None else [name]
        row["below"] = list(c.below) if c is not None else []
        row["used_pct"] = _pct(row["used"], row["limit"])
        row["chart"] = None
        out.append(row)
    # the organisation's tree, as ``kliqued budget`` prints it: a department above its teams
    shown = {r["name"] for r in out}
    out = [
        dict(r, depth=depth, parent=next((x for x in r["levels"][1:] if x in shown), None))
        for depth, r in policy_tree(out)
    ]
    budgets = sorted(
        (r for r in out if r["budget"] is not None),
        key=lambda r: (r["budget"]["left_hours"] / (r["budget"]["hours"] or 1), r["name"]),
    )
    for r in budgets[:MAX_CHARTS]:
        r["chart"] = burn_down(r["name"], r["budget"], now)
    return out, len(names)


def _pct(part: float, whole: float) -> int:
    return 0 if not whole else max(0, min(100, round(100 * part / whole)))


def burn_down(name: str, b: dict[str, Any], now: int) -> dict[str, Any]:
    """Budget hours left over the period: the period start at full budget to now, then the
    projection at the current burn rate to the run-out (or the period's end)."""
    hours, left, rate = b["hours"], b["left_hours"], b["burn_rate"] or 0
    start, end = b["period_start"], b["resets_at"]
    runout = b.get("runout_at")
    proj_end = runout if runout and runout < end else end
    if runout and runout < end:
        proj_left = 0.0
    else:
        hours_to_end = max(0, parse_iso(end) - now) / 3_600_000
        proj_left = max(0.0, left - rate * hours_to_end)
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "left (used so far)",
                "x": [start, iso(now)],
                "y": [hours, left],
            },
            {
                "type": "scatter",
                "mode": "lines",
                "name": "projected at the current burn rate",
                "x": [iso(now), proj_end],
                "y": [left, proj_left],
                "line": {"dash": "dash"},
            },
        ],
        "layout": {
            "title": {"text": f"{name}: budget hours left ({b['period']})"},
            "yaxis": {"title": {"text": "hours"}, "rangemode": "tozero"},
        },
    }


def queues(
    d: Daemon, p: Principal, per_queue: int = 20, most: int = 20, q_text: str | None = None
) -> tuple[list[dict[str, Any]], int]:
    """``GET /v1/resources/{cr}/queue`` of each compute resource ``p`` may read (admins: all,
    users: their groups' and admin groups'; finance reads no queue) whose name holds
    ``q_text``: the ``most`` longest non-empty queues, the first ``per_queue`` entries of
    each with place in line and reason, and how many queues are non-empty."""
    if not (p.is_admin or p.is_user):
        return [], 0
    idx, acc, st = d.idx(), d.acc(), d.st()
    waiting = []
    for name, q in st.queues.items():
        if not q.live or not matches(q_text, name):
            continue
        cr = idx.resources.get(name)
        if cr is not None and acc.sees_group(p, cr.group):
            waiting.append((-q.live, name, q))
    waiting.sort(key=lambda x: x[:2])
    out = []
    for _, name, q in waiting[:most]:
        entries = []
        for pos, t in enumerate(q, 1):
            if pos > per_queue:
                break
            rec = d.records[t.id]
            r = d.reason(rec)  # one by one: at most 400, not every queue's
            entries.append(
                {
                    "id": t.id,
                    "user": t.user,
                    "position": pos,
                    "gpus": from_milli(t.size),
                    "reason": r.text if r else "",
                    "submitted_at": iso(t.submitted_at),
                    "visible": acc.sees_task(p, rec.user, rec.group),
                }
            )
        out.append({"resource": name, "queued": q.live, "entries": entries})
    return out, len(waiting)


# --------------------------------------------------------------------------- my work
class TaskIndex:
    """Task ids by user and by group, newest last, kept by reading the daemon's id list from
    where it was left (ids are only ever appended, and a task's user and group never change):
    a developer's page finds their tasks without scanning the 100,000 others."""

    def __init__(self) -> None:
        self.seen = 0
        self.version = 0
        self.by_user: dict[str, list[str]] = {}
        self.by_group: dict[str, list[str]] = {}

    def catch_up(self, d: Daemon) -> None:
        if d.ids_version != self.version:  # ended tasks left memory: ``ids`` was compacted
            self.__init__()  # type: ignore[misc]
            self.version = d.ids_version
        ids, records = d.ids, d.records
        for tid in ids[self.seen :]:
            rec = records.get(tid)
            if rec is None:
                continue
            self.by_user.setdefault(rec.user, []).append(tid)
            self.by_group.setdefault(rec.group, []).append(tid)
        self.seen = len(ids)

    def newest(self, d: Daemon, user: str, groups: frozenset[str]) -> list[str]:
        """The ids of ``user``'s tasks and of ``groups``' tasks, newest first."""
        self.catch_up(d)
        mine = set(self.by_user.get(user, ()))
        for g in groups:
            mine.update(self.by_group.get(g, ()))
        return sorted(mine, reverse=True)


def tasks(
    d: Daemon, p: Principal, index: TaskIndex, limit: int = 100, state: str | None = None
) -> list[dict[str, Any]]:
    """The newest tasks ``p`` may see (``GET /v1/tasks``: a user's own and their admin
    groups' (``Access.sees_task``), an admin's all), newest first. Waiting reasons one by one:
    at most ``limit`` of them, where every reason at once costs a walk of every queue."""
    if p.is_admin:
        ids: Any = reversed(d.ids)
    elif p.is_user:
        ids = index.newest(d, p.name, d.acc().admin_of(p.name))
    else:
        return []
    out = []
    for tid in ids:
        rec = d.records.get(tid)
        if rec is None:
            continue  # evicted (history.py): ``tasks_with_history`` adds it
        if state is not None and views.state(rec) != state:
            continue
        out.append(views.task(d, rec))
        if len(out) == limit:
            break
    return out


async def tasks_with_history(
    d: Daemon,
    store: Store,
    p: Principal,
    index: TaskIndex,
    limit: int = 100,
    state: str | None = None,
) -> list[dict[str, Any]]:
    """:func:`tasks`, with the ended tasks that left memory (history.py) merged in: the
    newest ``limit`` of both."""
    out = tasks(d, p, index, limit, state)
    if state not in (None, "ended") or not (p.is_admin or p.is_user):
        return out
    mine = d.acc().admin_of(p.name) if p.is_user else frozenset()
    stored = await store.read(
        lambda cur: history.page(
            cur,
            None,
            limit,
            visible_user=p.name if p.is_user else None,
            visible_groups=mine,
            newest=True,
        )
    )
    seen = {t["id"] for t in out}
    out += [views.task(d, r) for r in stored if r.id not in seen and r.id not in d.records]
    out.sort(key=lambda t: t["id"], reverse=True)
    return out[:limit]


def delivery_text(data: dict[str, Any]) -> str:
    """One delivery attempt of an alert, with its channel and outcome (the audit trail
    showed a bare ``alert delivery``): ``alert #12 to ops-email: delivered (attempt 1)``,
    ``... : retry (attempt 2): connection refused``."""
    status = str(data.get("status") or "attempted").replace("_", " ")
    text = f"alert #{data.get('alert')} to {data.get('channel') or 'a channel'}: {status}" + (
        f" (attempt {data['attempt']})" if data.get("attempt") else ""
    )
    return text + (f": {data['error']}" if data.get("error") else "")


def refused_what(data: dict[str, Any]) -> str:
    """What a refused estate was, in words: an estate that does not compile has no
    revision (its hash is the compiled estate's), so its commit and where it came from
    name it (``estate at commit 1a2b3c4d5e6f from git:main``), never ``revision None``."""
    if data.get("revision"):
        return f"estate revision {data['revision']}"
    commit = str(data.get("commit") or "")[:12]
    source = data.get("source")
    return (
        "estate"
        + (f" at commit {commit}" if commit else "")
        + (f" from {source}" if source else "")
    )


# --------------------------------------------------------------------------- usage
async def usage(
    store: Store, groups: list[str] | None, start: int, end: int, by: str
) -> list[dict[str, Any]]:
    """GPU-hours and cost per value of ``by`` over the ledger rows the CSV export writes for
    the same range and scope."""
    rows = await store.read(lambda cur: ledger_export.summary(cur, start, end, by, groups))
    return [{"value": v, "gpu_hours": h, "cost": c, "currency": cur_} for v, h, c, cur_ in rows]


def usage_chart(rows: list[dict[str, Any]], by: str) -> dict[str, Any]:
    return {
        "data": [
            {
                "type": "bar",
                "name": "GPU-hours",
                "x": [r["value"] if r["value"] is not None else "(none)" for r in rows],
                "y": [float(r["gpu_hours"]) for r in rows],
            }
        ],
        "layout": {
            "title": {"text": f"GPU-hours by {by.replace('_', ' ')}"},
            "yaxis": {"title": {"text": "GPU-hours"}},
        },
    }


ESTATE_PARTS = ("estate_use", "idle")
"""The CIO figures the usage page shows (kliqued/web/templates/live/usage.html)."""

FIGURES_FRESH_MS = 60_000
"""How old the usage page's CIO figures may be: they are the month's sums (capacity, idle,
lending derived from every interval of the month), costly on a large ledger, and a minute
moves them by a minute's use. They move with time even when the ledger does not (the
month's capacity and the open intervals count up to now), so age alone decides (issue 32:
the page showed a 14-minute-old all-zero snapshot on first view)."""


FRESH_WAIT_S = 3.0
"""How long a page opened waits for new figures before it shows the held ones with their
age (the live refresh brings the new ones once computed): an XL estate's month takes a
second or more to derive, and a page must not hang on it."""


@dataclass
class Figures:
    at_ms: int
    figures: dict[str, Any]


Key = tuple[str, "tuple[str, ...] | None"]


class FiguresCache:
    """The usage page's CIO figures per month and ledger scope. A page opened (``fresh``)
    gets figures at most :data:`FIGURES_FRESH_MS` old, waiting for them (up to
    :data:`FRESH_WAIT_S`) if the held ones are older: what a person reads first is current. The page's live refresh (every second,
    per open browser) is stale while revalidating: older figures are still answered while
    one computation in the background replaces them; only a month and scope never computed
    waits. Each refresh would otherwise derive a month's lending (issue 13's 300 ms target;
    docs/benchmarks.md). :meth:`warm` computes the whole estate's current month at start."""

    def __init__(self) -> None:
        self._held: dict[Key, Figures] = {}
        self._running: dict[Key, asyncio.Task[dict[str, Any]]] = {}

    async def get(
        self,
        store: Store,
        groups: list[str] | None,
        month: dt.date,
        now_ms: int,
        fresh: bool = False,
    ) -> dict[str, Any]:
        """The figures of ``month`` in ``groups``' scope; ``fresh`` (a page opened, not its
        live refresh): never older than :data:`FIGURES_FRESH_MS`."""
        first = dt.date(month.year, month.month, 1)
        key: Key = (first.isoformat(), None if groups is None else tuple(sorted(groups)))
        held = self._held.get(key)
        if held is not None and now_ms - held.at_ms < FIGURES_FRESH_MS:
            return held.figures
        task = self._refresh(key, store, groups, first, now_ms)
        if held is None:
            return await asyncio.shield(task)
        if fresh:
            try:
                return await asyncio.wait_for(asyncio.shield(task), FRESH_WAIT_S)
            except asyncio.TimeoutError:  # an XL month: the held ones, their age shown
                pass
        return held.figures

    def warm(self, store: Store, month: dt.date, now_ms: int) -> None:
        """Starts computing the whole estate's figures for ``month`` (what finance and the
        CIO open first), without waiting."""
        first = dt.date(month.year, month.month, 1)
        self._refresh((first.isoformat(), None), store, None, first, now_ms)

    def close(self) -> None:
        """Stops the computations still running (the daemon stops)."""
        for task in list(self._running.values()):
            task.cancel()

    def _refresh(
        self, key: Key, store: Store, groups: list[str] | None, first: dt.date, now_ms: int
    ) -> asyncio.Task[dict[str, Any]]:
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(self._compute(key, store, groups, first, now_ms))
            self._running[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        return task

    def _done(self, key: Key, task: asyncio.Task[dict[str, Any]]) -> None:
        self._running.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning(
                "the usage page's CIO figures for %s could not be computed: %s",
                key[0],
                task.exception(),
            )

    async def _compute(
        self, key: Key, store: Store, groups: list[str] | None, first: dt.date, now_ms: int
    ) -> dict[str, Any]:
        figures = await estate_use(store, groups, first)
        figures["as_of"] = iso(now_ms)
        if len(self._held) > 256:  # scopes and months a daemon's lifetime sees: keep few
            self._held.clear()
        self._held[key] = Figures(now_ms, figures)
        return figures


async def estate_use(store: Store, groups: list[str] | None, month: dt.date) -> dict[str, Any]:
    """The CIO's figures the usage page shows for the month of ``month`` (``GET
    /v1/ledger/cio``'s :data:`ESTATE_PARTS`): use of the estate per pool and who pays for
    idle capacity, in the caller's ledger scope."""
    first = dt.date(month.year, month.month, 1)
    return await store.read(lambda cur: ledger_cio.figures(cur, first, groups, parts=ESTATE_PARTS))


def cloud(d: Daemon) -> list[dict[str, Any]]:
    """Cloud capacity in use: the cloud pools of ``GET /v1/pools``."""
    return [r for r in views.pools(d) if r["kind"] == "cloud"]


# --------------------------------------------------------------------------- estate
def estate(d: Daemon) -> dict[str, Any]:
    """``GET /v1/estate`` and the running revision's pools, profiles and policies."""
    e = d.idx().estate
    return {
        "info": views.estate(d),
        "pools": e.pools,
        "profiles": e.profiles,
        "policies": e.policies,
        "groups": e.groups,
        "settings": e.settings,
    }


async def revisions(store: Store, limit: int = 10) -> list[dict[str, Any]]:
    """The newest estate revisions applied or refused (the estate's own events)."""

    def run(cur: Any) -> list[dict[str, Any]]:
        rows = cur.execute(
            f"SELECT seq, at_ms, kind, task, actor, revision, {DATA} FROM events "
            "WHERE kind IN ('estate_applied', 'estate_refused') ORDER BY seq DESC LIMIT ?",
            [limit],
        ).fetchall()
        return [
            {
                "seq": r[0],
                "at_ms": r[1],
                "kind": r[2],
                "task": r[3],
                "actor": r[4],
                "revision": r[5],
                "data": json.loads(r[6]) if r[6] else {},
            }
            for r in rows
        ]

    rows = await store.read(run)
    return [dict(views.event(r), text=event_text(r)) for r in rows]


LAST_PLAN: dict[tuple[str, str], list[dict[str, Any]]] = {}
"""The last plan by (previous revision, running revision): computed once per pair."""


async def last_plan(d: Daemon, store: Store) -> dict[str, Any] | None:
    """What the running revision changed: ``kliqued plan``'s changes between the revision
    applied before it and it, from the compiled estates in the event log (no sources, so no
    file positions); None before a second revision was applied."""
    current = d.estate.revision

    def previous(cur: Any) -> tuple[str, int] | None:
        row = cur.execute(
            "SELECT revision, seq FROM events WHERE kind = 'estate_applied' "
            "AND revision <> ? ORDER BY seq DESC LIMIT 1",
            [current],
        ).fetchone()
        return None if row is None else (row[0], row[1])

    prev = await store.read(previous)
    if prev is None:
        return None
    key = (prev[0], current)
    if key not in LAST_PLAN:

        def load(cur: Any) -> Any:
            return cur.execute("SELECT data FROM events WHERE seq = ?", [prev[1]]).fetchone()[0]

        before = CompiledEstate.model_validate(json.loads(await store.read(load))["estate"])
        LAST_PLAN.clear()  # one pair is ever shown: the newest
        LAST_PLAN[key] = plan_rows(before, d.idx().estate)
    return {"base": prev[0], "head": current, "changes": LAST_PLAN[key]}


def plan_rows(before: CompiledEstate, after: CompiledEstate) -> list[dict[str, Any]]:
    """The Estate page's rows of ``kliqued plan``'s changes from ``before`` to ``after``:
    pure, so the page shows exactly what the plan's diff finds (no sources: no places)."""
    return [
        {
            "kind": c.kind,
            "name": c.name,
            "action": c.action,
            "old_name": c.old_name,
            "attrs": [
                {"path": ".".join(a.path), "op": a.op, "before": a.before, "after": a.after}
                for a in c.attrs
            ],
        }
        for c in diff(before, after, SourceMap(), SourceMap())
    ]
