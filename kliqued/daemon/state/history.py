"""Ended tasks leave memory: their records move to the ``task_history`` table.

Memory grew by about 1 KB per ended task forever (docs/ha.md, issue 18 part 3). The daemon
now keeps in memory what the engine and the live views need: every task not yet ended, and
the ``keep_ended`` most recently ended ones (what workers' late reports, a pipeline's next
step and the pages a user has open ask about). An older ended task is *evicted*: its record,
serialized whole (every field the API shows, its leases too), is written to
``task_history`` in the sequencer's batch transaction, and only once that commit is durable
does the record leave memory. A task still holding a lease its worker has not given back (a
stop in progress) stays until it does.

Reads of an evicted task (``GET /v1/tasks/{id}``, listings with ``state=ended``, cancel of an
ended task, its log, the audit filter by task, a retried Idempotency-Key) rebuild the same
``TaskRecord`` from its row, so every view is the one the API gave while it was in memory.

The table lives in the DuckDB file beside the ledger and the events (with a PostgreSQL log:
in ``--ledger-db``, beside the events' copy the audit reads), without a primary key: DuckDB
keeps an ART index in memory, which at 10 million rows would cost what eviction saves. Task
ids grow with time, so a lookup by id prunes row groups by their min/max.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, Iterable, Protocol

import duckdb

from klique_util.keyfilter import KeyFilter

from kliqued.daemon.leases import ACTIVE, STOPPING, Lease
from kliqued.daemon.records import TaskRecord
from kliqued.daemon.state.channel_state import PipelineBook

if TYPE_CHECKING:
    from kliqued.daemon.storage.store import Store

KEEP_ENDED = 10_000
"""Ended tasks kept in memory by default (``kliqued serve --keep-ended``): about 10 MB."""

EVICT_PER_CYCLE = 5_000
"""At most this many records leave memory per sequencer cycle (a long replay's backlog is
spread over a few cycles rather than one long commit)."""

RECALLED = 1_000
"""Evicted records read back lately, kept for the calls that follow (a worker's retried
report and log upload, a user's page polling a task)."""

KEY_GRACE_MS = 10 * 60 * 1000
"""An evicted task's Idempotency-Key stays in memory this long more: a submission checked
against the history just before the eviction still finds it when prepared."""

COLUMNS = (
    "id",
    "usr",
    "grp",
    "resource",
    "pool",
    "actor",
    "idem_key",
    "submitted_at_ms",
    "ended_at_ms",
    "doc",
)


_STAGE = "task_history_stage"


class Holder(Protocol):
    """What the history needs of the daemon's live state (``core.DaemonState`` is one): the
    live state holds this module's ``Eviction`` and ``Recalled``, so this module names the
    few members it reads rather than importing the class (no import cycle: issue 27)."""

    @property
    def records(self) -> dict[str, TaskRecord]: ...

    @property
    def idem(self) -> dict[tuple[str, str], str]: ...

    @property
    def eviction(self) -> Eviction: ...

    @property
    def recalled(self) -> Recalled: ...

    @property
    def pipelines(self) -> PipelineBook: ...

    def find(self, task_id: str) -> TaskRecord | None: ...

    def ids_dropped(self, n: int) -> None: ...


# ---------------------------------------------------------------------- (de)serialization
def _lease_doc(lease: Lease) -> dict[str, Any]:
    return {k: getattr(lease, k) for k in Lease.__slots__ if k != "leased_mono"}


def _lease_of(doc: dict[str, Any]) -> Lease:
    lease = Lease.__new__(Lease)
    for k in Lease.__slots__:
        setattr(lease, k, doc.get(k, 0.0 if k == "leased_mono" else None))
    return lease


def to_row(rec: TaskRecord) -> tuple:
    """The record as a ``task_history`` row: the indexed columns, then every field."""
    doc: dict[str, Any] = {}
    for k in TaskRecord.__slots__:
        v = getattr(rec, k)
        if k == "leases" and v is not None:
            v = [_lease_doc(x) for x in v]
        doc[k] = v
    return (
        rec.id,
        rec.user,
        rec.group,
        rec.resource,
        rec.pool,
        rec.actor,
        rec.idempotency_key,
        rec.submitted_at,
        rec.ended_at,
        json.dumps(doc, separators=(",", ":")),
    )


def from_doc(text: str) -> TaskRecord:
    """The ``TaskRecord`` a row was written from (fields added since: their defaults)."""
    doc = json.loads(text)
    rec = TaskRecord(
        doc["id"],
        doc["resource"],
        doc["policy"],
        doc["profile"],
        doc["group"],
        doc["user"],
        doc["actor"],
        doc.get("project"),
        doc.get("labels") or {},
        doc.get("command"),
        doc.get("payload"),
        doc.get("gpus_milli"),
        doc["submitted_at"],
        doc.get("revision") or "",
        doc.get("idempotency_key"),
        doc.get("channel") or "api",
    )
    for k in TaskRecord.__slots__:
        if k in doc:
            setattr(rec, k, doc[k])
    if rec.leases is not None:
        rec.leases = [_lease_of(x) for x in rec.leases]
    if rec.last_preemption is not None:
        rec.last_preemption = tuple(rec.last_preemption)  # type: ignore[assignment]
    return rec


# ---------------------------------------------------------------------- writes
def write(conn: duckdb.DuckDBPyConnection, rows: list[tuple], dedupe: bool = True) -> int:
    """Inserts ``rows`` (in the caller's transaction). ``dedupe``: skipping ids already in
    the table (a replay evicts again what the log says ended, and the row written the first
    time stays), by a staging table and an anti-join, not a key (see the module's
    docstring); the live path knows its records are not there (:func:`mark_stored`) and
    appends."""
    if not rows:
        return 0
    # A write before this one in the transaction may have left a result unread (a count's
    # fetchone in the ledger's writer); DuckDB's appender refuses to start until it is run
    # to its end. With PostgreSQL the file thread applies several batches in one
    # transaction, so a batch's ledger closes come right before the next one's history.
    conn.complete()
    if not dedupe:
        app = conn.appender("task_history")
        try:
            app.append_rows(rows)
            app.flush()
        except BaseException:
            app.clear()
            raise
        return len(rows)
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} AS SELECT * FROM task_history LIMIT 0")
    app = conn.appender(_STAGE)
    try:
        app.append_rows(rows)
        app.flush()
    except BaseException:
        app.clear()
        raise
    lo = min(r[0] for r in rows)
    hi = max(r[0] for r in rows)
    conn.execute(
        f"INSERT INTO task_history SELECT s.* FROM {_STAGE} s WHERE s.id NOT IN "
        f"(SELECT id FROM task_history WHERE id BETWEEN ? AND ?)",
        [lo, hi],
    )
    conn.execute(f"DELETE FROM {_STAGE}")
    return len(rows)


def write_records(
    conn: duckdb.DuckDBPyConnection, recs: list[TaskRecord], dedupe: bool = True
) -> int:
    """:func:`write` of ``recs``, serialized here, on the store's writer thread: an
    evicted record no longer changes (ended, every lease given back), and the event loop
    keeps serving meanwhile."""
    return write(conn, [to_row(r) for r in recs], dedupe)


def mark_stored(d: Holder, store: Store) -> int:
    """After a start: which ended records in memory have their row already (evicted before
    a crash, replayed since), so that the live path only appends rows it knows are new
    (an anti-join per commit would read the whole table). Returns how many."""
    ids = list(d.eviction.ended)
    found: set[str] = set()
    for i in range(0, len(ids), 1000):
        part = ids[i : i + 1000]
        found.update(
            r[0]
            for r in store.read_sync(
                lambda cur: cur.execute(
                    f"SELECT id FROM task_history WHERE id IN ({', '.join('?' * len(part))})", part
                ).fetchall()
            )
        )
    d.eviction.stored = found
    return len(found)


# ---------------------------------------------------------------------- reads
def get(cur: duckdb.DuckDBPyConnection, task_id: str) -> TaskRecord | None:
    row = cur.execute("SELECT doc FROM task_history WHERE id = ? LIMIT 1", [task_id]).fetchone()
    return from_doc(row[0]) if row else None


def by_key(cur: duckdb.DuckDBPyConnection, actor: str, key: str) -> TaskRecord | None:
    row = cur.execute(
        "SELECT doc FROM task_history WHERE actor = ? AND idem_key = ? LIMIT 1", [actor, key]
    ).fetchone()
    return from_doc(row[0]) if row else None


def page(
    cur: duckdb.DuckDBPyConnection,
    after: str | None,
    limit: int,
    *,
    resource: str | None = None,
    user: str | None = None,
    groups: Iterable[str] | None = None,
    pool: str | None = None,
    visible_user: str | None = None,
    visible_groups: Iterable[str] | None = None,
    submitted_from: int | None = None,
    newest: bool = False,
) -> list[TaskRecord]:
    """Up to ``limit`` evicted tasks in id order after ``after`` (``newest``: newest first,
    before ``after``), with the listing's filters; ``visible_user``/``visible_groups``: a
    user's own tasks and their groups'."""
    where: list[str] = []
    params: list[Any] = []
    if after is not None:
        where.append("id < ?" if newest else "id > ?")
        params.append(after)
    for col, val in (("resource", resource), ("usr", user), ("pool", pool)):
        if val is not None:
            where.append(f"{col} = ?")
            params.append(val)
    if groups is not None:
        gs = list(groups) or [""]
        where.append(f"grp IN ({', '.join('?' * len(gs))})")
        params.extend(gs)
    if visible_user is not None:
        vg = list(visible_groups or ()) or [""]
        where.append(f"(usr = ? OR grp IN ({', '.join('?' * len(vg))}))")
        params.extend([visible_user, *vg])
    if submitted_from is not None:
        where.append("submitted_at_ms >= ?")
        params.append(submitted_from)
    sql = (
        f"SELECT doc FROM task_history{' WHERE ' + ' AND '.join(where) if where else ''}"
        f" ORDER BY id{' DESC' if newest else ''} LIMIT ?"
    )
    return [from_doc(r[0]) for r in cur.execute(sql, [*params, limit]).fetchall()]


# ---------------------------------------------------------------------- what leaves memory
def pipeline_steps(d: Holder) -> set[str]:
    """The latest task of each step of the running pipelines: how it ended (its outputs)
    decides the pipeline's next step, read from memory by the unattended loop."""
    return {run.tasks[-1] for pr in d.pipelines.running() for run in pr.steps.values() if run.tasks}


class Eviction:
    """Which ended records leave memory, in the order they ended: beyond ``keep`` of them,
    those no worker still holds (a lease active or stopping)."""

    def __init__(self, keep: int = KEEP_ENDED) -> None:
        self.keep = keep
        self.ended: deque[str] = deque()
        """Ended tasks in memory, oldest end first."""
        self.keys: deque[tuple[int, tuple[str, str], str]] = deque()
        """(drop at ms, idempotency key, task) of evicted tasks."""
        self.stored: set[str] = set()
        """Ended records in memory whose row is written already (:func:`mark_stored`)."""
        self.evicted_keys = KeyFilter()
        """The Idempotency-Keys of every evicted task (``actor`` NUL ``key``), so that a
        new key is known absent from the history without reading it (:meth:`may_hold`)."""

    def may_hold(self, actor: str, key: str) -> bool:
        """Whether an evicted task may have been sent with this key (a retry to read back
        from the history); False is certain."""
        return f"{actor}\0{key}" in self.evicted_keys

    def unstored(self, recs: list[TaskRecord]) -> list[TaskRecord]:
        """Those of ``recs`` whose row is still to write."""
        return [r for r in recs if r.id not in self.stored] if self.stored else recs

    def note_ended(self, task_id: str) -> None:
        self.ended.append(task_id)

    def due(self, d: Holder, most: int = EVICT_PER_CYCLE) -> list[TaskRecord]:
        """The records to evict now (they stay in memory until :meth:`drop`)."""
        out: list[TaskRecord] = []
        held: list[str] = []
        records = d.records
        pinned: set[str] | None = None
        while len(self.ended) > self.keep and len(out) < most:
            tid = self.ended.popleft()
            rec = records.get(tid)
            if rec is None or rec.state != "ended":
                continue
            if pinned is None:
                pinned = pipeline_steps(d)
            if (
                rec.leases
                and any(x.status in (ACTIVE, STOPPING) for x in rec.leases)
                or tid in pinned
            ):
                held.append(tid)  # looked at again once more tasks have ended
                continue
            out.append(rec)
        self.ended.extend(held)
        return out

    def drop(self, d: Holder, recs: list[TaskRecord], now: int) -> None:
        """The records' rows are durable: out of memory with them."""
        for rec in recs:
            if d.records.get(rec.id) is rec:
                del d.records[rec.id]
                # found by ``Daemon.find`` a while yet: a request checked against the record
                # just before (a retried report, a cancel) is prepared against the same
                d.recalled.put(rec)
            self.stored.discard(rec.id)
            if rec.idempotency_key is not None:
                self.evicted_keys.add(f"{rec.actor}\0{rec.idempotency_key}")
                self.keys.append((now + KEY_GRACE_MS, (rec.actor, rec.idempotency_key), rec.id))
        d.ids_dropped(len(recs))
        while self.keys and self.keys[0][0] <= now:
            _, key, tid = self.keys.popleft()
            if d.idem.get(key) == tid and tid not in d.records:
                del d.idem[key]

    def restore(self, d: Holder, recs: list[TaskRecord]) -> None:
        """A commit failed: they stay in memory, to be evicted again later."""
        self.ended.extendleft(r.id for r in reversed(recs))


class Recalled:
    """Evicted records read back from the table, the most recent :data:`RECALLED` of them:
    the synchronous code after a handler's :func:`recall` (views, the sequencer's prepares)
    finds them through ``Daemon.find`` as it found them in memory."""

    def __init__(self, most: int = RECALLED) -> None:
        self.most = most
        self._recs: OrderedDict[str, TaskRecord] = OrderedDict()

    def get(self, task_id: str) -> TaskRecord | None:
        rec = self._recs.get(task_id)
        if rec is not None:
            self._recs.move_to_end(task_id)
        return rec

    def put(self, rec: TaskRecord) -> None:
        self._recs[rec.id] = rec
        self._recs.move_to_end(rec.id)
        while len(self._recs) > self.most:
            self._recs.popitem(last=False)


async def recall(store: Store, d: Holder, task_id: str) -> TaskRecord | None:
    """Task ``task_id`` from memory, or read back from ``task_history`` (then kept in
    ``d.recalled``); None when there is no such task. A record leaves memory only once its
    row is committed, so a miss in memory finds the row."""
    rec = d.find(task_id)
    if rec is not None or not task_id:
        return rec
    rec = await store.read(lambda cur: get(cur, task_id))
    if rec is not None:
        d.recalled.put(rec)
    return rec


async def recall_all(store: Store, d: Holder, task_ids: Iterable[str]) -> dict[str, TaskRecord]:
    """Tasks ``task_ids`` from memory, the evicted ones read back from ``task_history`` in one
    query (a schedule's runs, a pipeline's steps: a list of them must not cost a read each);
    tasks with no record are left out. Not kept in ``d.recalled``: a list of schedules may
    name more tasks than it holds."""
    out: dict[str, TaskRecord] = {}
    missing: list[str] = []
    for tid in dict.fromkeys(task_ids):
        rec = d.find(tid)
        if rec is not None:
            out[tid] = rec
        elif tid:
            missing.append(tid)
    if missing:

        def read(cur: duckdb.DuckDBPyConnection) -> list[TaskRecord]:
            rows = cur.execute(
                "SELECT DISTINCT ON (id) doc FROM task_history WHERE list_contains(?, id)",
                [missing],
            ).fetchall()
            return [from_doc(r[0]) for r in rows]

        for rec in await store.read(read):
            out[rec.id] = rec
    return out
