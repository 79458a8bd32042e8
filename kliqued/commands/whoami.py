"""``kliqued whoami``: who the token is, and what that lets it do."""

from __future__ import annotations

import argparse

from ._client import add_client_flags, client, handles_errors, print_json
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "whoami",
        help="who your token is: principal, groups, admin of, role",
        description="The principal the server sees for your token (user:NAME, role:finance, "
        "role:admin, worker:POOL), the groups whose compute resources you may "
        "submit to, the groups you administer (their children included), and "
        "your role. `kliqued resources` lists what you may submit to.",
        examples="  kliqued whoami\n  kliqued whoami --json",
    )
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    k = client(args)
    w = k.whoami()
    if args.json:
        print_json(w)
        return 0
    role = ", ".join(w.get("roles") or []) or (
        "user" if w.get("kind") == "user" else w.get("kind") or "-"
    )
    print(
        "\n".join(
            [
                f"principal {w.get('principal')}  (server {k.url})",
                f"groups    {', '.join(w.get('groups') or []) or '-'}",
                f"admin of  {', '.join(w.get('admin_of') or []) or '-'}",
                f"role      {role}",
            ]
        )
    )
    return 0
