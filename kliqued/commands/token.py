"""``kliqued token``: create, list, rotate and revoke API tokens (admins), through the SDK.

Connection as for every client command (``_client.add_client_flags``): --url/--token/--context,
else KLIQUE_URL and KLIQUE_TOKEN, else the config file.
"""

from __future__ import annotations

import argparse
import sys

from ._client import add_client_flags, client, handles_errors, print_json, table
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "token",
        help="create, list, rotate and revoke API tokens (admins)",
        description="Manages the daemon's tokens through its API, with an admin token. A "
        "token is shown once, when it is created or rotated (on stdout, alone, "
        "so it can be captured); only a keyed hash of it is stored.",
        examples="  kliqued token create --user alice --expires 90d\n"
        "  kliqued token create --worker --pool onprem-k8s\n"
        "  kliqued token create --role finance --name 'finance team'\n"
        "  kliqued token list\n"
        "  kliqued token rotate tk-01M8K879FR0000 --grace 1h\n"
        "  kliqued token revoke tk-01M8K879FR0000",
    )
    sub = p.add_subparsers(dest="token_cmd", metavar="<create|list|rotate|revoke>")
    c = sub.add_parser("create", help="create a token and print it once")
    who = c.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", metavar="NAME", help="a user's token")
    who.add_argument("--worker", action="store_true", help="a worker's token (give --pool)")
    who.add_argument(
        "--role",
        choices=["finance", "admin", "planner"],
        help="a role's token (planner: CI's read-only role for `kliqued plan --against`)",
    )
    c.add_argument("--pool", metavar="NAME", help="the worker's pool")
    c.add_argument("--name", help="a note, e.g. who holds it")
    c.add_argument(
        "--expires",
        metavar="DURATION",
        help="the token stops working this long from now: 90d, 12h, 2w (default: never)",
    )
    add_client_flags(c)
    ls = sub.add_parser("list", help="list tokens (never their secrets)")
    add_client_flags(ls)
    ro = sub.add_parser(
        "rotate",
        help="a new secret for a token's principal; the old one stops (at once, or after --grace)",
    )
    ro.add_argument("id", metavar="ID")
    ro.add_argument(
        "--grace",
        metavar="DURATION",
        help="how long the old token keeps working, so its holders can switch "
        "(e.g. 1h; default: it stops at once)",
    )
    ro.add_argument(
        "--expires", metavar="DURATION", help="the new token's lifetime (default: the old one's)"
    )
    add_client_flags(ro)
    r = sub.add_parser("revoke", help="revoke a token")
    r.add_argument("id", metavar="ID")
    add_client_flags(r, json_flag=False)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    cmd = getattr(args, "token_cmd", None)
    if cmd is None:
        print("kliqued token: give create, list, rotate or revoke (see --help)", file=sys.stderr)
        return 2
    if cmd == "create":
        if args.worker != bool(args.pool):
            print("kliqued token create: --worker and --pool NAME go together", file=sys.stderr)
            return 2
        res = client(args).create_token(
            args.user,
            worker=args.worker,
            pool=args.pool,
            role=args.role,
            name=args.name,
            expires_in=args.expires,
        )
        _show(args, res, f"created {res['id']} for {res['principal']}")
    elif cmd == "rotate":
        res = client(args).rotate_token(args.id, grace=args.grace, expires_in=args.expires)
        old = f"{args.id} keeps working for {args.grace}" if args.grace else f"{args.id} is revoked"
        _show(args, res, f"rotated: {res['id']} for {res['principal']} ({old})")
    elif cmd == "list":
        tokens = client(args).tokens()
        if args.json:
            print_json({"tokens": tokens})
        else:
            print(
                table(
                    ["ID", "PRINCIPAL", "NAME", "CREATED", "CREATED BY", "EXPIRES", "REVOKED"],
                    [
                        [
                            t["id"],
                            t["principal"],
                            t["name"] or "",
                            t["created_at"],
                            t["created_by"] or "",
                            t.get("expires_at") or "never",
                            t["revoked_at"] or "",
                        ]
                        for t in tokens
                    ],
                )
            )
    else:
        client(args).revoke_token(args.id)
        print(f"revoked {args.id}", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace, res: dict, what: str) -> None:
    """The new token alone on stdout (to be captured), what happened on stderr."""
    if args.json:
        print_json(res)
        return
    until = f", expires {res['expires_at']}" if res.get("expires_at") else ""
    print(f"{what}{until}; the token, shown once:", file=sys.stderr)
    print(res["token"])
