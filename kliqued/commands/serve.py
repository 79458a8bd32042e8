"""``kliqued serve``: the control plane daemon."""

from __future__ import annotations

import argparse

from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers, "serve", help="run the control plane daemon (API, engine, ledger)",
        description="Runs the daemon: the HTTP API under /v1 (OpenAPI at /v1/openapi.json), "
                    "the compute policy engine about once per pass_interval, and the event "
                    "log and usage ledger in one DuckDB file, which only this process opens. "
                    "At the first start an admin token is printed once to stderr (or taken "
                    "from KLIQUE_ADMIN_TOKEN). SIGTERM or SIGINT stop it cleanly. Exit 1 on "
                    "an error (the database is in use, the port is taken), 2 when the estate "
                    "is invalid (its diagnostics are printed).",
        examples="  kliqued serve --estate estate --db kliqued.duckdb\n"
                 "  kliqued serve --listen 0.0.0.0:8443 --tls-cert cert.pem --tls-key key.pem\n"
                 "  KLIQUE_ADMIN_TOKEN=kq_... kliqued serve --estate estate")
    p.add_argument("--estate", metavar="DIR", default=None,
                   help="the estate directory (default: estate, or on a restart the last "
                        "estate applied, from the log)")
    p.add_argument("--db", metavar="FILE", default="kliqued.duckdb",
                   help="the DuckDB file: event log, tokens, ledger (default: %(default)s)")
    p.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:8080",
                   help="where to listen (default: %(default)s)")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain (HTTPS)")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key (HTTPS)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kliqued.daemon.server import Options, serve
    return serve(Options(args.estate, args.db, args.listen, args.tls_cert, args.tls_key))
