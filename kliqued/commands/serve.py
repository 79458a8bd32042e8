"""``kliqued serve``: the control plane daemon."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from klique_util.units import SECOND_MS, UNIT_SECONDS

from ._common import add_command, positive_int

if TYPE_CHECKING:
    from kliqued.daemon.server import Options

_UNITS = {"ms": 1 / SECOND_MS, **UNIT_SECONDS}


def duration(text: str) -> float:
    """`30s`, `2m`, `500ms`, or plain seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 2m or 500ms")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(KiB|MiB|GiB|K|M|G)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 64MiB")
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get((m.group(2) or " ")[0], 1)
    return int(m.group(1)) * mult


def _memory(text: str) -> str:
    """A memory size (``512MiB``, ``2G``) as DuckDB's ``memory_limit`` takes it."""
    n = size(text)
    if n < 64 * 1024**2:
        raise argparse.ArgumentTypeError(f"{text!r} is below 64MiB: DuckDB needs more to run")
    return f"{n}B"


def _whole(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0 or more)")
    return int(text)


def _retention(text: str) -> float:
    """A duration, 0, or ``off`` (-1)."""
    word = text.strip().lower()
    if word == "off":
        return -1.0
    return 0.0 if re.fullmatch(r"0+(ms|s|m|h|d)?", word) else duration(text)


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "serve",
        help="run the control plane daemon (API, engine, ledger)",
        description="Runs the daemon: the HTTP API under /v1 (OpenAPI at /v1/openapi.json), "
        "the compute policy engine about once per pass_interval, the worker "
        "protocol, and the event log and usage ledger in one DuckDB file, which "
        "only this process opens (or the log, tokens and ledger in PostgreSQL: --db "
        "postgresql://..., docs/ha.md). It follows the estate: --estate DIR is watched "
        "and --git REPO polled, and every valid new revision is applied between "
        "two passes (an invalid one is refused and shown by GET /v1/estate; the "
        "running one stays). At the first start an admin token is printed once to "
        "stderr (or taken from KLIQUE_ADMIN_TOKEN). SIGTERM or SIGINT stop it "
        "cleanly. Exit 1 on an error (the database is in use, the port is taken), "
        "2 when the estate is invalid at start (its diagnostics are printed).",
        examples="  kliqued serve --estate estate --db kliqued.duckdb\n"
        "  kliqued serve --estate estate --db postgresql://kliqued@db1/klique "
        "--ledger-db /var/lib/kliqued/ledger.duckdb\n"
        "  kliqued serve --git /srv/estate-repo --branch main --estate-path estate "
        "--poll 30s\n"
        "  kliqued serve --listen 0.0.0.0:8443 --tls-cert cert.pem --tls-key key.pem\n"
        "  KLIQUE_ADMIN_TOKEN=kq_... kliqued serve --estate estate",
    )
    src = p.add_argument_group("the estate")
    src.add_argument(
        "--estate",
        metavar="DIR",
        default=None,
        help="the estate directory, watched for changes (default: estate, or on "
        "a restart the last estate applied, from the log)",
    )
    src.add_argument(
        "--no-watch",
        dest="watch",
        action="store_false",
        help="apply --estate at start only; do not follow its changes",
    )
    src.add_argument(
        "--git",
        metavar="REPO",
        default=None,
        help="follow a git repository instead of a directory: the estate is read "
        "from the branch's commits (fetched when it has a remote)",
    )
    src.add_argument(
        "--branch",
        metavar="NAME",
        default="main",
        help="the branch --git follows (default: %(default)s)",
    )
    src.add_argument(
        "--estate-path",
        metavar="PATH",
        default="estate",
        help="the estate's directory inside the repository (default: %(default)s)",
    )
    src.add_argument(
        "--poll",
        metavar="DURATION",
        type=duration,
        default=30.0,
        help="how often --git polls the branch (default: 30s)",
    )
    p.add_argument(
        "--db",
        metavar="FILE|URL",
        default="kliqued.duckdb",
        help="the DuckDB file: event log, tokens, ledger; task logs go in "
        "FILE.logs/ (default: %(default)s). Or a PostgreSQL URL "
        "(postgresql://user@host/dbname): the event log and tokens are kept "
        "there, and the ledger too, with a copy in --ledger-db (docs/ha.md)",
    )
    p.add_argument(
        "--ledger-db",
        metavar="FILE",
        default="kliqued-ledger.duckdb",
        help="with --db postgresql://...: the local DuckDB file with a copy of the "
        "events and of the ledger for the reads that still run on DuckDB "
        "(statements, dashboards, group admins', the audit log); "
        "the token key and task logs go beside it (default: %(default)s)",
    )
    p.add_argument(
        "--ledger-replica",
        metavar="URL",
        default=None,
        help="with --db postgresql://...: a streaming replica of it where "
        "finance's reads run (ledger SQL, the exports, the feed), so a "
        "heavy query never touches the writer (default: --db itself); as "
        "--ledger-role either way",
    )
    p.add_argument(
        "--ledger-role",
        metavar="ROLE",
        default="klique_finance",
        help="with --db postgresql://...: the read-only PostgreSQL role finance's "
        "ledger SQL logs in as: SELECT on the ledger's tables and views only "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--db-memory",
        metavar="SIZE",
        type=_memory,
        default="2GiB",
        help="the most memory the DuckDB file's database may use, a finance "
        "query's included: a query that needs more is refused as too-large "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:8080",
        help="where to listen (default: %(default)s)",
    )
    ss = p.add_argument_group("sessions (docs/channels.md#sessions)")
    ss.add_argument(
        "--sessions-listen",
        metavar="HOST:PORT",
        default=None,
        help="where the sessions' listener listens: sessions' apps are served "
        "there only, on an origin other than the API's and the dashboard's "
        "(default: the --listen host and the next port, e.g. 8081 beside "
        "8080; the API gives each session's URL)",
    )
    ss.add_argument(
        "--sessions-domain",
        metavar="DOMAIN",
        default=None,
        help="serve each session on a host of its own, <id>.DOMAIN (a wildcard "
        "DNS name and certificate pointing at --sessions-listen, directly or "
        "through a proxy): sessions are then separate origins from one "
        "another too. DOMAIN may carry a scheme and port, e.g. "
        "http://sessions.test:8081 (default scheme https)",
    )
    ha = p.add_argument_group("several daemons on one PostgreSQL database (docs/ha.md)")
    ha.add_argument(
        "--advertise-url",
        metavar="URL",
        default=None,
        help="this daemon's URL as clients reach it: the standbys redirect "
        "there while it leads (default: http(s)://the --listen address)",
    )
    ha.add_argument(
        "--lease-ttl",
        metavar="DURATION",
        type=duration,
        default=5.0,
        help="a leader that has not renewed its lease for this long is replaced "
        "by a standby; renewed every TTL/5, and at least every second "
        "(default: 5s)",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain (HTTPS)")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key (HTTPS)")
    c = p.add_argument_group("connections")
    c.add_argument(
        "--header-timeout",
        metavar="DURATION",
        type=duration,
        default=10.0,
        help="a request's headers must arrive within this of the connection's "
        "opening or of the request's first byte, else the connection is "
        "closed (default: 10s)",
    )
    c.add_argument(
        "--idle-timeout",
        metavar="DURATION",
        type=duration,
        default=60.0,
        help="a keep-alive connection idle this long is closed (default: 60s)",
    )
    c.add_argument(
        "--body-timeout",
        metavar="DURATION",
        type=duration,
        default=30.0,
        help="a request's body must arrive within this of its headers, else 408 (default: 30s)",
    )
    c.add_argument(
        "--max-connections",
        metavar="N",
        type=positive_int,
        default=10_000,
        help="open connections at most; more get 503 at once. Kept below the "
        "open-files limit, which is raised to its hard limit at start "
        "(default: %(default)s)",
    )
    w = p.add_argument_group("workers")
    w.add_argument(
        "--worker-ttl",
        metavar="DURATION",
        type=duration,
        default=15.0,
        help="a worker silent this long is lost and its tasks requeued (default: 15s)",
    )
    w.add_argument(
        "--poll-wait",
        metavar="DURATION",
        type=duration,
        default=30.0,
        help="longest wait of a worker's lease request (default: 30s)",
    )
    w.add_argument(
        "--stop-grace",
        metavar="DURATION",
        type=duration,
        default=30.0,
        help="time a stopped task gets between SIGTERM and SIGKILL (default: 30s)",
    )
    w.add_argument(
        "--gang-timeout",
        metavar="DURATION",
        type=duration,
        default=120.0,
        help="a placed multi-node task whose nodes' workers do not all take it "
        "within this goes back to its queue with the reason (default: 2m)",
    )
    w.add_argument(
        "--log-cap",
        metavar="SIZE",
        type=size,
        default=64 * 1024 * 1024,
        help="the most log kept per task, all attempts (default: 64MiB)",
    )
    w.add_argument(
        "--place-without-workers",
        dest="require_workers",
        action="store_false",
        help="place work on pools that have no live worker (by default such a "
        "pool takes no new work and says so; an autoscaled pool always "
        "does): for work that something other than klique-worker runs",
    )
    st = p.add_argument_group("state (docs/ha.md, bounded state)")
    st.add_argument(
        "--keep-ended",
        metavar="N",
        type=_whole,
        default=10_000,
        help="ended tasks kept in memory, the most recently ended; older ones are "
        "read from the task history in the database when asked for "
        "(default: %(default)s)",
    )
    st.add_argument(
        "--snapshot-every",
        metavar="N",
        type=_whole,
        default=100_000,
        help="take a snapshot of the state every N events (and at a clean stop), "
        "so that a restart replays only the log after it; 0: never "
        "(default: %(default)s)",
    )
    st.add_argument(
        "--compact-after",
        metavar="DURATION|off",
        type=_retention,
        default=30 * 86400.0,
        help="after each snapshot, the workers' lease events (leased, started, "
        "stopped, unleased) of tasks ended longer ago than this leave the log; "
        "every decision and request stays (docs/decisions.md, log "
        "compaction). off: keep them all (default: 30d)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kliqued.daemon.server import serve

    if args.git and args.estate:
        print("kliqued serve: give --estate DIR or --git REPO, not both")
        return 1
    return serve(options(args))


def options(args: argparse.Namespace) -> "Options":
    """The daemon's options from the command's arguments, the dashboard installed: also
    what the tests' in-process daemon runs (tests/harness/inproc.py), so that it is the
    daemon this command starts."""
    from kliqued.daemon.listener import Limits
    from kliqued.daemon.server import Options
    from kliqued.web.routes import install as dashboard  # injected: the daemon imports no web

    return Options(
        args.estate,
        args.db,
        args.listen,
        args.tls_cert,
        args.tls_key,
        watch=args.watch,
        git=args.git,
        branch=args.branch,
        estate_path=args.estate_path,
        poll_s=args.poll,
        worker_ttl_s=args.worker_ttl,
        poll_wait_s=args.poll_wait,
        grace_s=args.stop_grace,
        gang_timeout_s=args.gang_timeout,
        log_cap=args.log_cap,
        db_memory=args.db_memory,
        limits=Limits(
            args.header_timeout, args.idle_timeout, args.body_timeout, args.max_connections
        ),
        require_workers=args.require_workers,
        ledger_db=args.ledger_db,
        advertise_url=args.advertise_url,
        lease_ttl_s=args.lease_ttl,
        ledger_replica=args.ledger_replica,
        ledger_role=args.ledger_role,
        keep_ended=args.keep_ended,
        snapshot_every=args.snapshot_every,
        compact_after_s=args.compact_after,
        sessions_listen=args.sessions_listen,
        sessions_domain=args.sessions_domain,
        installers=(dashboard,),
    )
