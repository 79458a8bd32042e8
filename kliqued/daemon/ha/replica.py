"""A standby's reads: the state replayed from the log, then kept up with it (docs/ha.md).

A standby (standby.py) that has the token key loads the log into a ``Daemon`` of its own
(the start's replay, ``replay.rebuild``) and then, every ``standby.FOLLOW_S``, applies the events
logged since through the same reducers, and takes the tokens table again. It serves the
read operations in :data:`READS` from that state with the leader's own handlers and checks
(the same application, ``app.make_app``); everything else, and every read until the state
is loaded, goes to the leader (standby.py). Nothing here writes: the Sequencer it holds for
the handlers' sake never runs.

Reads left out: what lives only in the leader's memory or files (workers' liveness, task
logs, sessions' tunnels, the state's metrics: a standby's ``/metrics`` says only its own
health, standby.py) and the ledger (each daemon's own file until the ledger
moves to PostgreSQL).
"""

from __future__ import annotations

import json
import logging
from typing import Iterator, Sequence, cast

from aiohttp import web

from kliqued.daemon.state import reducers
from kliqued.daemon.storage import keyfile
from kliqued.daemon.api.app import Installer, make_app, route_of
from kliqued.daemon.auth import TokenBook, TokenRecord
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.events import Event
from kliqued.daemon.ids import TokenHasher
from kliqued.daemon.logs import LogStore
from kliqued.daemon.storage.pglog import PgLog
from kliqued.daemon.state.loop import Sequencer
from kliqued.daemon.state.replay import rebuild
from kliqued.daemon.api.metrics import Metrics
from kliqued.daemon.api.request import Context
from kliqued.daemon.storage.store import Store

log = logging.getLogger(__name__)

READS = frozenset(
    {
        "/v1/tasks",
        "/v1/tasks/{id}",
        "/v1/resources",
        "/v1/resources/{policy}/{profile}/queue",
        "/v1/policies",
        "/v1/policies/{name}",
        "/v1/pools",
        "/v1/estate",
        "/v1/engine",
        "/v1/whoami",
        "/v1/events",
        "/v1/schedules",
        "/v1/schedules/{id}",
        "/v1/pipelines",
        "/v1/pipelines/{id}",
        "/v1/openapi.json",
    }
)
"""The GET operations a standby answers itself (their canonical paths). Not the plan's live
counts (``/v1/plan/state``): they include the workers' reports and the ledger's usage, which
only the leader has, so ``kliqued plan --against STANDBY,LEADER`` is the leader's plan."""


class Replica:
    """The standby's state and the application that reads it."""

    def __init__(
        self,
        store: Store,
        local_db: str,
        log_cap: int,
        server_url: str,
        require_workers: bool,
        installers: Sequence[Installer] = (),
    ) -> None:
        self.store = store
        self.installers = installers
        """Adapters' routes (the dashboard's) its application serves, as the leader's."""
        self.local_db = local_db
        self._log: PgLog | None = None
        """A connection of its own to the log (the store's is its writer thread's)."""
        self.d = Daemon()
        self.d.require_workers = require_workers
        self.ready = False
        """Loaded and following: only then are reads served here."""
        self.loaded = False
        """The log replayed and the tokens read: the standby can check a token (its own
        ``/metrics``), even if following stopped since."""
        self.log_seq: int | None = None
        """The log's last sequence number at the last look (``fetch``)."""
        self.ctx = Context(
            self.d,
            Sequencer(self.d, store, metrics=Metrics(self.d)),
            store,
            1.0,
            LogStore.beside(local_db, log_cap),
            server_url=server_url,
        )

    def app(self) -> web.Application:
        return make_app(self.ctx, self.installers)

    def serves(self, request: web.Request) -> bool:
        """Whether this request is a read answered here (else it goes to the leader)."""
        if not (self.ready and self.d.ready) or request.method not in ("GET", "HEAD"):
            return False
        route = route_of(request)
        return (
            route is not None
            and route.path in READS
            and self.knows_token(request.headers.get("Authorization"))
        )

    def knows_token(self, header: str | None) -> bool:
        """Whether the request's bearer token is in this state's copy of the tokens table.
        A token made on the leader since the last follow (``standby.FOLLOW_S``) is not yet:
        its request goes to the leader, which knows it, rather than failing here with
        ``unknown token`` (a client given ``STANDBY,LEADER`` that makes a token and uses it
        at once). No header, or not a bearer one, stays here: the handler's 401 says how
        to send one."""
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return True
        return self.d.tokens.hash(token.strip()) in self.d.tokens.by_hash

    # ------------------------------------------------------------------ loading
    def _reader(self) -> PgLog:
        if self._log is None or self._log.conn.closed:
            url = getattr(self.store.log, "url")
            self._log = PgLog(url)
        return self._log

    def load(self) -> bool:
        """The log replayed (in a thread, on the replica's own connection). False, and
        reads stay the leader's, without the token key."""
        path = keyfile.key_path(self.local_db)
        if not path.exists():
            return False
        self.d.tokens.hasher = TokenHasher(keyfile.load(path, must_exist=True))
        stats = rebuild(self.d, cast(Store, _Reads(self._reader())))
        log.info(
            "standing by: %d events replayed (%d tasks) for the reads served here",
            stats.events,
            stats.tasks,
        )
        self.loaded = True
        return True

    def fetch(self) -> tuple[list[tuple], list[tuple]]:
        """The events after the state's last and every token (in a thread); the log's last
        sequence number first, for :attr:`lag`."""
        self.look()
        reader = self._reader()
        return list(reader.read_events(after=self.d.seq)), reader.read_tokens()

    def look(self) -> None:
        """Reads the log's last sequence number (in a thread): the lag's other end, also
        once the state stopped following (an event it could not apply)."""
        self.log_seq = self._reader().last_seq()

    @property
    def lag(self) -> int | None:
        """Events in the log, at the last look, that the state has not applied: about 0
        while it follows, growing when it cannot keep up; None before the first look."""
        if self.log_seq is None or not self.loaded:
            return None
        return max(0, self.log_seq - self.d.seq)

    def apply(self, rows: list[tuple], tokens: list[tuple]) -> None:
        """The fetched events through the reducers, as the replay applies them, and the
        tokens as they are now (on the event loop's thread, between requests)."""
        d = self.d
        for seq, at, kind, task, actor, revision, grp, usr, data_text in rows:
            if seq <= d.seq:
                continue
            d.clock.at_least(at)
            data = json.loads(data_text) if data_text else {}
            reducers.apply(d, Event(kind, task, actor, revision, grp, usr, data), at)
            d.seq = seq
        book = TokenBook(d.tokens.hasher)
        for row in tokens:
            book.add(TokenRecord(*row))
        d.tokens = book

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


class _Reads:
    """What ``replay.rebuild`` reads of a Store, from the replica's own connection."""

    def __init__(self, log_: PgLog) -> None:
        self.log = log_

    def read_events(self, chunk: int = 20_000) -> Iterator[tuple]:
        return self.log.read_events(0, chunk)

    def read_tokens(self) -> list[tuple]:
        return self.log.read_tokens()
