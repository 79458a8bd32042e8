"""``kliqued serve``: open the database, rebuild the state, apply the estate, serve, stop.

Start: open the DuckDB file (a second daemon on the same file fails here, on DuckDB's lock);
replay the event log; compile ``--estate`` and refuse to start on an invalid estate; log an
``estate_applied`` event when its revision differs from the last applied one; make sure an
admin token exists; then serve. Stop (SIGTERM, SIGINT): stop accepting, let requests in flight
finish (their changes are committed), checkpoint the file, exit 0.
"""

from __future__ import annotations

import asyncio
import errno
import dataclasses
import functools
import gc
import logging
import os
import signal
import ssl
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from aiohttp import web

from compiler.compiled import CompiledEstate
from klique_util.filemodes import private_dir, private_umask, tighten
from kliqued.ledger import ops as ledger_ops
from kliqued.ledger import writer as ledger

from kliqued.daemon.api.app import Context, Installer, make_app
from kliqued.daemon.clock import Clock
from kliqued.daemon.api.metrics import Metrics
from kliqued.daemon.session_origin import OriginError, SessionOrigin, parse_domain
from kliqued.daemon.api.session_site import make_session_app
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.state.core import WorkerSettings
from kliqued.daemon.errors import BadOption, DaemonError, Deposed, StoreAway
from kliqued.daemon.storage.storefault import disk_full, first_line
from kliqued.daemon.state.gitops import DirSource, Follower, GitSource, Snapshot
from kliqued.daemon.logs import DEFAULT_CAP, LogStore
from kliqued.daemon import strength
from kliqued.daemon.storage import keyfile
from kliqued.daemon.listener import Limits, ListenSite, body_timeout_middleware, connection_cap
from kliqued.daemon.listener import listen_backlog
from kliqued.daemon.listener import plain_http_warning, raise_nofile
from kliqued.daemon import logsetup
from kliqued.daemon.state.alerts import Dispatcher
from kliqued.daemon.state.clockwatch import CLOCK_OFFSET_ENV, make_clock, watch_clock  # noqa: F401 (tests)
from kliqued.daemon.state.loop import Sequencer
from kliqued.daemon.state.replay import ReplayError, rebuild
from kliqued.daemon.storage.compaction import Compactor
from kliqued.daemon.state.snapshot import Snapshotter
from kliqued.daemon.state.unattended import Unattended
from kliqued.daemon.storage.store import DEFAULT_MEMORY, Batch, Store

if TYPE_CHECKING:
    from kliqued.daemon.ha.lease import Lease

log = logging.getLogger(__name__)

EXIT_OK, EXIT_ERROR, EXIT_INVALID_ESTATE = 0, 1, 2


@dataclass
class Options:
    estate: str | None
    db: str
    listen: str
    tls_cert: str | None = None
    tls_key: str | None = None
    watch: bool = True
    """Watch ``--estate`` and apply each valid change (GitOps reload)."""
    git: str | None = None
    branch: str = "main"
    estate_path: str = "estate"
    poll_s: float = 30.0
    worker_ttl_s: float = 15.0
    poll_wait_s: float = 30.0
    grace_s: float = 30.0
    gang_timeout_s: float = 120.0
    """A placed gang not taken by all its members by then goes back to its queue."""
    log_cap: int = DEFAULT_CAP
    db_memory: str = DEFAULT_MEMORY
    """The DuckDB file's ``memory_limit`` (kliqued/daemon/storage/store.py)."""
    limits: Limits = Limits()
    """Connection timeouts and the connection cap (kliqued/daemon/listener.py)."""
    require_workers: bool = True
    """A pool takes placements only while it has a live worker (or autoscales)."""
    ledger_db: str = "kliqued-ledger.duckdb"
    """With ``db`` a PostgreSQL URL: the local DuckDB file beside it, with a copy of the
    events and of the ledger for the reads that still run on DuckDB (docs/ha.md); the token
    key and the task logs go beside it."""
    advertise_url: str | None = None
    """With ``db`` a PostgreSQL URL: the URL other daemons' standbys redirect clients to
    while this one leads (default: the listen address's)."""
    lease_ttl_s: float = 5.0
    """With ``db`` a PostgreSQL URL: a leader not heard of for this long is replaced."""
    ledger_replica: str | None = None
    """With ``db`` a PostgreSQL URL: where finance's SQL runs (a streaming replica of
    ``db``); None: on ``db`` itself. Either way as ``ledger_role``."""
    ledger_role: str = "klique_finance"
    """The read-only PostgreSQL role finance's SQL logs in as (``pgreader``)."""
    keep_ended: int = 10_000
    """Ended tasks kept in memory (history.py); older ones are read from the history."""
    snapshot_every: int = 100_000
    """Events between two snapshots (snapshot.py); 0: none."""
    compact_after_s: float = 30 * 86400.0
    """Log compaction's retention after a task ends (compaction.py); negative: off."""
    sessions_listen: str | None = None
    """Where the sessions' listener listens (session_site.py): never the API's origin.
    None: the ``listen`` host and the next port (8081 beside 8080): the same at every
    start, so a session's URL outlives a restart of the daemon."""
    sessions_domain: str | None = None
    """``--sessions-domain``: each session at ``<id>.<domain>``, routed by Host."""
    installers: tuple[Installer, ...] = ()
    """Adapters' routes added to the API's application, the leader's and a standby's: the
    dashboard's, given by ``kliqued serve``'s command (kliqued/commands/serve.py), since the
    daemon never imports ``kliqued.web`` (docs/decisions.md, issue 27)."""

    @property
    def local_db(self) -> str:
        """The DuckDB file this daemon opens: ``db`` itself, or ``ledger_db`` beside a
        PostgreSQL log."""
        return self.ledger_db if is_url(self.db) else self.db


@dataclass
class Serving:
    """A daemon serving in this process (:class:`Embedded`): what its host needs to reach it
    and to stop it. ``stop`` is the daemon's own stop (what SIGTERM sets), set through
    :meth:`request_stop` from any thread."""

    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event
    url: str
    daemon: Daemon
    ctx: Context

    def request_stop(self) -> None:
        """As SIGTERM: stop accepting, finish requests in flight, checkpoint; thread-safe."""
        self.loop.call_soon_threadsafe(self.stop.set)


@dataclass
class Embedded:
    """``serve`` run inside another program's process, on a thread of its own (the tests'
    in-process harness, tests/harness/inproc.py): the same start, replay, estate, token, app
    and stop as ``kliqued serve``, with what belongs to the process given here instead.

    Why a seam rather than a second composition: the tests that need no process boundary
    must still test the daemon an operator runs, so the one composition root builds it. What
    differs is only what a process owns and a host process must keep: signals (a thread
    cannot take them: :meth:`Serving.request_stop` instead), the umask, the root logger,
    the collector's tuning (``gc.freeze``), and the environment (the admin token, the
    clock)."""

    admin_token: str | None = None
    """Instead of ``KLIQUE_ADMIN_TOKEN``: the process's environment is the host's."""
    clock: Callable[[], Clock] | None = None
    """Instead of ``make_clock``: a clock the host steps."""
    mono: Callable[[], float] | None = None
    """Instead of ``time.monotonic`` for the daemon's TTLs (workers', autoscalers')."""
    serving: Callable[[Serving], None] = lambda serving: None
    """Called on the daemon's thread once it listens, with its handle."""


def _admin_token(embedded: Embedded | None) -> str | None:
    if embedded is not None:
        return embedded.admin_token
    return os.environ.get("KLIQUE_ADMIN_TOKEN")


def is_url(db: str) -> bool:
    """``--db`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return db.startswith(("postgresql://", "postgres://"))


def open_store(opts: Options) -> Store:
    """The Store for ``--db``: a DuckDB file alone, or PostgreSQL for the events and tokens
    beside the local DuckDB file (psycopg is imported only then)."""
    if not is_url(opts.db):
        return Store(opts.db, memory_limit=opts.db_memory)
    from kliqued.daemon.storage.pglog import PgLog
    from kliqued.daemon.storage.pgreader import Readers
    from kliqued.daemon.storage.querypool import QueryPool

    log_ = PgLog(opts.db)
    try:
        store = Store(opts.ledger_db, log_, memory_limit=opts.db_memory)
    except BaseException:
        log_.close()
        raise
    store.finance_queries = QueryPool(
        None, handles=Readers(opts.ledger_replica or opts.db, opts.ledger_role)
    )
    return store


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadOption(f"--listen must be HOST:PORT, e.g. 127.0.0.1:8080; found {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _sessions_where(
    opts: Options, host: str
) -> tuple[str, int, tuple[str, str, int | None] | None]:
    """The sessions' listener's host and port, and ``--sessions-domain`` parsed (scheme,
    domain, port) or None; BadOption or OriginError naming the flag."""
    if opts.sessions_listen is None:
        _, port = parse_listen(opts.listen)
        s_host, s_port = host, (port + 1 if 0 < port < 65535 else 0)
    else:
        try:
            s_host, s_port = parse_listen(opts.sessions_listen)
        except BadOption:
            raise BadOption(
                "--sessions-listen must be HOST:PORT, e.g. 127.0.0.1:8081; found "
                f"{opts.sessions_listen!r}"
            ) from None
    domain = parse_domain(opts.sessions_domain) if opts.sessions_domain else None
    return s_host, s_port, domain


def _session_origin(opts: Options, host: str, port: int) -> SessionOrigin:
    """How sessions' URLs read, once their listener is bound (``port``: the real one)."""
    _, _, domain = _sessions_where(opts, host)
    scheme = "https" if opts.tls_cert else "http"
    if opts.advertise_url:  # the host clients reach, not a wildcard listen address
        host = opts.advertise_url.split("://", 1)[1].rstrip("/").rsplit(":", 1)[0].strip("[]")
    base = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}"
    if domain is None:
        return SessionOrigin(base)
    return SessionOrigin(base, domain=domain[1], scheme=domain[0], port=domain[2])


def _banner(token: str, url: str) -> str:
    line = "=" * 78
    return (
        f"\n{line}\n"
        f"FIRST ADMIN TOKEN: shown once, now. Store it in a password manager.\n\n"
        f"    {token}\n\n"
        f"Use it:\n"
        f"    export KLIQUE_URL={url}\n"
        f"    export KLIQUE_TOKEN={token}\n"
        f"    kliqued token create --user alice       # a token for a user\n"
        f'    curl -H "Authorization: Bearer $KLIQUE_TOKEN" {url}/v1/whoami\n'
        f"(Set KLIQUE_ADMIN_TOKEN before the first start to choose it instead.)\n"
        f"{line}\n"
    )


def serve(opts: Options, embedded: Embedded | None = None) -> int:
    """``kliqued serve`` until stopped; its exit code. ``embedded``: run inside a host
    process (:class:`Embedded`), a DuckDB file only."""
    if embedded is None:
        logsetup.setup()
        private_umask()  # the database, its WAL and the task logs: 0600, their directories 0700
    elif is_url(opts.db):
        raise ValueError("an embedded daemon runs on a DuckDB file, not PostgreSQL")
    nofile = raise_nofile()
    try:
        host, port = parse_listen(opts.listen)
    except BadOption as exc:
        print(f"kliqued serve: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if opts.advertise_url is not None and not (
        opts.advertise_url.startswith(("http://", "https://"))
        and len(opts.advertise_url.split("://", 1)[1].strip("/")) > 0
    ):
        print(
            f"kliqued serve: --advertise-url must be http://HOST:PORT or https://HOST:PORT; "
            f"found {opts.advertise_url!r}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        _sessions_where(opts, host)
    except (BadOption, OriginError) as exc:
        print(f"kliqued serve: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if not opts.lease_ttl_s > 0:
        print("kliqued serve: --lease-ttl must be more than 0", file=sys.stderr)
        return EXIT_ERROR
    if bool(opts.tls_cert) != bool(opts.tls_key):
        print("kliqued serve: give both --tls-cert and --tls-key, or neither", file=sys.stderr)
        return EXIT_ERROR
    env_token = _admin_token(embedded)
    weak = strength.weakness(env_token) if env_token else None
    if weak is not None:
        print(
            f"kliqued serve: KLIQUE_ADMIN_TOKEN is too weak to be an admin token: {weak}; "
            f"{strength.advice()}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        store = open_store(opts)
    except DaemonError as exc:  # the file is locked, PostgreSQL unreachable
        print(f"kliqued serve: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        for path in (opts.local_db, f"{opts.local_db}.wal"):  # made 0644 by an earlier version
            tighten(path)
        try:
            store.ensure_schema(lead=not is_url(opts.db))
        except DaemonError as exc:  # PostgreSQL's schema is newer; the files do not match
            print(f"kliqued serve: error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        if is_url(opts.db):
            from kliqued.daemon.storage import pgreader

            pg = store.log
            warning = store.on_writer(lambda: pgreader.grant(getattr(pg, "conn"), opts.ledger_role))
            if warning:
                log.warning("%s", warning)
        if not is_url(opts.db):
            return _lead(opts, store, host, port, nofile, embedded=embedded)
        return _lead_when_elected(opts, store, host, port, nofile)
    except Exception as exc:
        if not (disk_full(exc) or isinstance(exc, StoreAway) and exc.status == 507):
            raise
        # a start that must write (the schema, the estate, the first token) on a full disk
        print(
            f"kliqued serve: error: the disk under {opts.local_db} is full ({first_line(exc)}"
            f"): free space there, then start kliqued again",
            file=sys.stderr,
        )
        return EXIT_ERROR
    finally:
        try:
            store.close()
        except Exception:  # already closed, or the process is going down anyway
            pass


def _lead_when_elected(opts: Options, store: Store, host: str, port: int, nofile: int) -> int:
    """Several ``kliqued serve`` on one PostgreSQL database (lease.py): stand by until the
    lease is ours, lead (replay, serve) until stopped or deposed; deposed, stand by again."""
    from kliqued.daemon.ha.lease import Lease, LeaseSettings
    from kliqued.daemon.storage.pglog import PgLog
    from kliqued.daemon.ha.replica import Replica
    from kliqued.daemon.ha.standby import stand_by

    assert isinstance(store.log, PgLog)
    advertise = opts.advertise_url or _url(opts, host, port)
    lease = Lease(opts.db, advertise, LeaseSettings.for_ttl(opts.lease_ttl_s))
    lease.before_takeover = store.recover
    limits = dataclasses.replace(
        opts.limits, max_connections=connection_cap(opts.limits.max_connections, nofile)
    )
    try:
        while True:
            replica = Replica(
                store,
                opts.local_db,
                opts.log_cap,
                _url(opts, host, port),
                opts.require_workers,
                opts.installers,
            )  # the standby's reads
            try:
                elected = asyncio.run(
                    stand_by(
                        lease,
                        host,
                        port,
                        limits,
                        _ssl_context(opts),
                        listen_backlog(nofile),
                        store.catch_up,
                        functools.partial(keyfile.missing, opts.local_db, store),
                        replica,
                    )
                )
            finally:
                replica.close()
            if not elected:
                log.info("stopped while standing by")
                return EXIT_OK
            store.log.fence = lease.epoch
            lease.start_renewing()
            try:
                store.take_lead()
            except DaemonError as exc:  # the ledger file is not this database's
                print(f"kliqued serve: error: {exc}", file=sys.stderr)
                return EXIT_ERROR
            del replica  # its state: the leader's is rebuilt by _lead's replay
            code = _lead(opts, store, host, port, nofile, lease)
            lease.on_lost = None
            if code != EXIT_DEPOSED:
                return code
            lease.stop_renewing()  # the fence keeps the old epoch: it matches no batch now
            lease.epoch = None
            gc.unfreeze()  # the dropped state was frozen out of the collector (_run)
            gc.collect()
            log.warning(
                "deposed: standing by (the state is rebuilt from the log if this "
                "daemon leads again)"
            )
    finally:
        lease.release()
        lease.close()


EXIT_DEPOSED = -1
"""``_lead``'s answer when another daemon took the lease: stand by, do not exit."""


def _url(opts: Options, host: str, port: int) -> str:
    scheme = "https" if opts.tls_cert else "http"
    return f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}"


def _ssl_context(opts: Options) -> ssl.SSLContext | None:
    if not opts.tls_cert:
        return None
    ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ssl_ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    return ssl_ctx


def _lead(
    opts: Options,
    store: Store,
    host: str,
    port: int,
    nofile: int,
    lease: "Lease | None" = None,
    embedded: Embedded | None = None,
) -> int:
    """Rebuild the state from the log, apply the estate, serve until stopped (or, with a
    lease, deposed: EXIT_DEPOSED)."""
    for gid, committed in store.recovered:
        log.warning(
            "a batch left prepared in %s by an older kliqued (stopped between the "
            "two phases of its commit) was %s (%s)",
            store.log.label,
            "committed" if committed else "rolled back",
            gid,
        )
    store.recovered.clear()
    if store.caught_up:
        log.warning(
            "%d events logged in %s were missing from %s (a new file, a stop "
            "before the file had them, or another daemon's lead): copied",
            store.caught_up,
            store.log.label,
            opts.local_db,
        )
        store.caught_up = 0
    if store.seeded:
        log.info(
            "ledger: %d intervals copied from %s into %s's empty ledger",
            store.seeded,
            opts.local_db,
            store.log.label,
        )
        store.seeded = 0
    if store.seeded_file:
        log.info(
            "ledger: %d intervals copied from %s into %s",
            store.seeded_file,
            store.log.label,
            opts.local_db,
        )
        store.seeded_file = 0

    d = Daemon()
    d.require_workers = opts.require_workers  # before replay: it decides availability
    d.eviction.keep = opts.keep_ended
    # before replay: the log's times continue on it
    d.clock = make_clock() if embedded is None or embedded.clock is None else embedded.clock()
    if embedded is not None and embedded.mono is not None:
        d.mono = embedded.mono
    try:
        d.tokens.hasher, migrated = keyfile.open_hasher(opts.local_db, store)
    except keyfile.KeyFileError as exc:
        print(f"kliqued serve: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if migrated:
        log.info(
            "%d token hash(es) moved under the token key %s",
            migrated,
            keyfile.key_path(opts.local_db),
        )
    try:
        stats = rebuild(d, store)
    except ReplayError as exc:
        print(f"kliqued serve: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    log.info(
        "started: %s, replayed %d events (%d tasks) in %.2f s%s",
        store.log.label,
        stats.events,
        stats.tasks,
        stats.seconds,
        f" after the snapshot at event {stats.snapshot}" if stats.snapshot else "",
    )
    if d.state is not None:  # rows from before the ledger kept paths: the paths of now
        filled = _fill_group_paths(store, d.idx().estate)
        if filled:
            log.info("ledger: %d intervals given the group paths of %s", filled, d.estate.revision)
    d.worker_settings = WorkerSettings(
        opts.worker_ttl_s, opts.poll_wait_s, opts.grace_s, opts.gang_timeout_s
    )
    compiled: CompiledEstate | None = None
    source = None
    follow: DirSource | GitSource | None = None
    snap: Snapshot | None = None
    if opts.git is not None:
        from compiler.plan.gitsource import GitSourceError

        try:
            follow = GitSource(opts.git, opts.branch, opts.estate_path, opts.poll_s)
            snap = follow.read()
        except GitSourceError as exc:
            print(f"kliqued serve: error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        except Exception as exc:  # git itself failed (fetch, permissions)
            print(f"kliqued serve: error: cannot read {opts.git}: {exc}", file=sys.stderr)
            return EXIT_ERROR
        source = snap.label
    elif opts.estate is not None or d.state is None:
        source = opts.estate or "estate"
        src = DirSource(source)
        snap = src.read()
        if opts.watch:
            follow = src
    if snap is not None:
        result = snap.result
        if result.estate is None:
            for diag in result.diagnostics:
                print(diag.render(), file=sys.stderr)
            if d.state is None or opts.git is None:
                print(
                    f"kliqued serve: the estate in {source} is not valid "
                    f"({len(result.errors)} errors): not starting",
                    file=sys.stderr,
                )
                return EXIT_INVALID_ESTATE
            # GitOps: the branch is broken right now; run the last applied revision and
            # report the refusal (the follower's first check).
            snap = None
        else:
            compiled = result.estate
    cap = connection_cap(opts.limits.max_connections, nofile)
    if cap < opts.limits.max_connections:
        log.info("at most %d connections (the open-files limit is %d)", cap, nofile)
    limits = dataclasses.replace(opts.limits, max_connections=cap)
    return asyncio.run(
        _run(
            opts,
            store,
            d,
            compiled,
            source,
            host,
            port,
            follow,
            snap,
            limits,
            listen_backlog(nofile),
            lease,
            embedded,
        )
    )


def _fill_group_paths(store: Store, compiled: CompiledEstate) -> int:
    """At start: the ledger rows from before it recorded group paths get the paths of the
    estate in force (``writer.fill_group_paths``), and the monthly aggregate rebuilt from
    them, or neither; returns how many rows. A database from before the ledger recorded
    capacity gets the running revision's from now on (``capacity.record_estate``: a no-op
    when it has it). One transaction, on every ledger the store keeps (``ledger.ops``)."""
    row = store.conn.execute(
        "SELECT count(*) FROM ledger WHERE group_path IS NULL "
        'AND "group" IN (SELECT unnest(?::VARCHAR[]))',
        [[g.name for g in compiled.groups]],
    ).fetchone()
    missing = row[0] if row else 0
    store.commit_sync(
        Batch(
            ops=[
                ledger_ops.FillGroupPaths(ledger.group_paths(compiled)),
                ledger_ops.RecordEstate(compiled, int(time.time() * 1000)),
            ]
        )
    )
    return int(missing)


async def _run(
    opts: Options,
    store: Store,
    d: Daemon,
    compiled: CompiledEstate | None,
    source: str | None,
    host: str,
    port: int,
    follow: DirSource | GitSource | None = None,
    snap: Snapshot | None = None,
    limits: Limits = Limits(),
    backlog: int = 1024,
    lease: "Lease | None" = None,
    embedded: Embedded | None = None,
) -> int:
    interval = (compiled or d.idx().estate).settings.pass_interval_s or 1
    if d.ready:  # a restart: tasks no worker took get their start timeout again from now
        d.st().restart_start_timers(d.clock.now())
        if d.require_workers:  # and autoscalers one timeout to heartbeat again
            from kliqued.daemon.fleet.autoscalers import restart_grace

            restart_grace(d, d.clock.now())
    metrics = Metrics(d)
    if lease is not None:  # /metrics says whether this daemon leads, on every daemon
        from kliqued.daemon.ha.standby import role

        metrics.role = functools.partial(role, lease)
    seq = Sequencer(d, store, float(interval), metrics=metrics)
    snaps = Snapshotter(d, store, opts.snapshot_every)
    snaps.on_taken = Compactor(
        store, -1 if opts.compact_after_s < 0 else int(opts.compact_after_s * 1000)
    )
    seq.between = snaps.maybe
    runner_task = asyncio.create_task(seq.run())
    seq.request_pass(0)  # after a replay, the first pass looks at everything at once
    exit_code = EXIT_OK
    stop = asyncio.Event()

    def fatal(exc: BaseException) -> None:
        nonlocal exit_code
        exit_code = EXIT_DEPOSED if isinstance(exc, Deposed) else EXIT_ERROR
        stop.set()

    seq.on_fatal = fatal
    running_loop = asyncio.get_running_loop()

    # the local file's thread failed to apply a batch (PostgreSQL has it): stop as the
    # sequencer's failed commit does; the restart brings the file up to date
    def follow_failed(exc: BaseException) -> None:
        running_loop.call_soon_threadsafe(fatal, exc)

    store.on_follow_failed = follow_failed

    def deposed() -> None:
        nonlocal exit_code
        exit_code = EXIT_DEPOSED
        stop.set()

    if lease is not None:  # the renewal thread found the lease taken
        running = asyncio.get_running_loop()

        def lost() -> None:
            running.call_soon_threadsafe(deposed)

        lease.on_lost = lost
        if lease.lost.is_set():
            deposed()

    commit = snap.commit if snap is not None else None
    if compiled is not None and (
        compiled.revision != d.estate.revision or commit != d.estate.commit and commit is not None
    ):
        await seq.submit(
            lambda now, ov: d.prepare_estate(compiled, source, "kliqued", now, ov, commit),
            barrier=True,
        )
        e = compiled
        log.info(
            "estate applied: %s from %s (%d pools, %d profiles, %d policies, %d compute resources)",
            e.revision,
            source,
            len(e.pools),
            len(e.profiles),
            len(e.policies),
            len(e.compute_resources),
        )
    else:
        log.info("estate: %s (unchanged)", d.estate.revision)

    # A long-lived heap (every task, queue and record) makes the collector's full passes
    # long pauses; what was rebuilt at start is frozen out of them, and collections made
    # rarer (measured: p99 latency under load).
    if embedded is None:  # the host's heap and its collector are the host's
        gc.freeze()
        gc.set_threshold(20_000, 20, 50)

    url = _url(opts, host, port)
    env_token = _admin_token(embedded)
    if env_token:
        rec = d.tokens.by_hash.get(d.tokens.hash(env_token))
        if rec is None:
            await seq.submit(
                lambda now, ov: d.prepare_token(
                    None, "role:admin", "KLIQUE_ADMIN_TOKEN", now, ov, secret=env_token
                )
            )
        elif rec.refusal(d.clock.now()) is not None:
            log.warning("KLIQUE_ADMIN_TOKEN is not restored: %s", rec.refusal(d.clock.now()))
    elif not d.tokens.by_id:
        _, token = await seq.submit(
            lambda now, ov: d.prepare_token(None, "role:admin", "first admin", now, ov)
        )
        sys.stderr.write(_banner(token, url))
        sys.stderr.flush()

    ssl_ctx = _ssl_context(opts)
    logs = LogStore.beside(opts.local_db, opts.log_cap)
    private_dir(logs.root)
    ctx = Context(d, seq, store, float(interval), logs, server_url=url, lease=lease)
    d.on_work = ctx.wake
    for w in d.workers.values():  # after a restart every known worker gets a full TTL
        w.last_seen = d.mono()
    app = make_app(ctx, opts.installers)
    app.middlewares.append(body_timeout_middleware(limits.body_timeout_s))  # after auth
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    await runner.setup()
    site = ListenSite(runner, host, port, limits=limits, ssl_context=ssl_ctx, backlog=backlog)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port, exc.strerror or exc)
        await runner.cleanup()
        await seq.stop()
        await runner_task
        return EXIT_ERROR
    s_host, s_port, _ = _sessions_where(opts, host)
    session_runner = web.AppRunner(
        make_session_app(ctx), access_log=None, handle_signals=False, shutdown_timeout=5.0
    )
    await session_runner.setup()
    session_site = ListenSite(
        session_runner, s_host, s_port, limits=limits, ssl_context=ssl_ctx, backlog=backlog
    )
    try:
        try:
            await session_site.start()
        except OSError as exc:
            if opts.sessions_listen is not None or exc.errno != errno.EADDRINUSE or not s_port:
                raise
            # the default (the API's port + 1) is taken: any free port is as good an origin
            # of its own, and the API gives each session's URL; an explicit one is fatal
            log.warning(
                "the sessions' default port %s:%d is in use (%s): serving sessions on a "
                "free port instead (--sessions-listen HOST:PORT fixes one)",
                s_host,
                s_port,
                exc.strerror or exc,
            )
            session_site = ListenSite(
                session_runner, s_host, 0, limits=limits, ssl_context=ssl_ctx, backlog=backlog
            )
            await session_site.start()
    except OSError as exc:
        log.error(
            "cannot listen for sessions on %s:%d: %s (choose another port with "
            "--sessions-listen HOST:PORT)",
            s_host,
            s_port,
            exc.strerror or exc,
        )
        await session_runner.cleanup()
        await runner.cleanup()
        await seq.stop()
        await runner_task
        return EXIT_ERROR
    bound = session_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    ctx.session_origin = _session_origin(opts, s_host, bound)
    log.info("sessions served at %s", ctx.session_origin.url("t-ID"))
    loop = asyncio.get_running_loop()
    if embedded is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    else:  # a thread takes no signals: the host stops it through the handle
        embedded.serving(Serving(loop, stop, url, d, ctx))
    if lease is not None:
        from kliqued.daemon.ha.standby import stop_asked

        if stop_asked():  # asked while this daemon was taking over: stop now
            stop.set()
    log.info(
        "serving on %s (pid %d, %d tasks, engine %s)",
        url,
        os.getpid(),
        len(d.records),
        "enabled" if d.st().enabled else "disabled",
    )
    warning = plain_http_warning(host, ssl_ctx is not None)
    if warning:
        log.warning(warning)
    background = [
        asyncio.create_task(_watch_workers(d, seq, stop)),
        asyncio.create_task(watch_clock(d, seq, stop)),
        asyncio.create_task(Unattended(d, seq).run(stop)),
    ]
    dispatcher = Dispatcher(d, seq, store)
    seq.on_commit = dispatcher.offer
    resent = await dispatcher.load(d.clock.now())
    if resent:
        log.info("alerts: %d raised in the last day looked at for delivery", resent)
    background.append(asyncio.create_task(dispatcher.run()))
    background.append(asyncio.create_task(dispatcher.watch_waits()))
    follower = None
    if follow is not None:
        follower = Follower(follow, d, seq, snap.key if snap is not None else None)
        if snap is None:
            await follower.check()
        background.append(asyncio.create_task(follower.run()))
    await stop.wait()
    log.info("stopping: no new connections; finishing requests in flight")
    ctx.closing.set()
    ctx.wake_all()
    await ctx.tunnels.close_all()  # the sessions' workers connect again to the next daemon
    if follower is not None:
        follower.stop.set()
    for t in background:
        t.cancel()
    await asyncio.gather(*background, return_exceptions=True)
    await session_runner.cleanup()
    await runner.cleanup()
    await seq.stop()
    await runner_task
    await snaps.wait()
    if exit_code == EXIT_OK:
        snaps.final()
    logsetup.report_held_back()
    log.info("stopped: %d events in the log", d.seq)
    return exit_code


async def _watch_workers(d: Daemon, seq: Sequencer, stop: asyncio.Event) -> None:
    """Declares lost every worker silent for longer than its TTL (its tasks go back to the
    front of their queues, or fail the third time)."""
    from kliqued.daemon.fleet import gang
    from kliqued.daemon.fleet import autoscalers
    from kliqued.daemon.fleet.workers import prepare_gang_timeout, prepare_worker_lost

    ttl = d.worker_settings.ttl_s
    step = max(0.05, min(1.0, ttl / 4))
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), step)
            return
        except asyncio.TimeoutError:
            pass
        now = d.mono()
        for w in list(d.workers.values()):
            if w.lost or now - w.last_seen <= ttl:
                continue
            log.warning(
                "worker %s (pool %s) lost: no heartbeat for %.1f s; its %d task(s) "
                "go back to their queues",
                w.id,
                w.pool,
                now - w.last_seen,
                len(w.leases),
            )
            try:
                await seq.submit(functools.partial(prepare_worker_lost, d, w.id))
            except StoreAway:  # the store is away: looked at again next round
                break
            except Exception as exc:  # shutting down
                log.debug("worker lost not recorded: %s", exc)
                return
        for pool in autoscalers.overdue(d, now):
            log.warning(
                "autoscaler of pool %s lost: no heartbeat for %.1f s; the pool takes "
                "no work while it has no live worker, and its unstarted tasks go "
                "back to their queues",
                pool,
                now - d.autoscalers[pool].last_seen,
            )
            try:
                await seq.submit(functools.partial(autoscalers.prepare_lost, d, pool))
            except StoreAway:  # the store is away: looked at again next round
                break
            except Exception as exc:  # shutting down
                log.debug("autoscaler lost not applied: %s", exc)
                return
        if d.ready:
            for tid in gang.overdue(d, d.worker_settings.gang_timeout_s, d.clock.now()):
                try:
                    await seq.submit(functools.partial(prepare_gang_timeout, d, tid))
                except StoreAway:
                    break
                except Exception as exc:  # shutting down
                    log.debug("gang timeout not recorded: %s", exc)
                    return
