"""``kliqued login``: sign the CLI (and the SDK, ``kliqued mcp``) in through the
organisation's identity provider, with the device authorization grant; the short-lived Klique
token lands in a context of the config file and renews itself (kliqued/sdk/login.py)."""

from __future__ import annotations

import argparse
import sys

from kliqued.sdk import login as sdk_login
from kliqued.sdk.config import config_path

from ._client import handles_errors, urls
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "login",
        help="sign in through your organisation's identity provider",
        description="Signs you in through the identity provider the control plane trusts "
        "(settings.identity): it prints a URL and a code to open in any browser, then "
        "stores a short-lived Klique token in a context of the config file (0600), which "
        "every later command renews through the provider before it ends. What you may "
        "do still comes from the estate.",
        examples="  kliqued login --url https://klique.example.org\n"
        "  kliqued login --url https://klique.example.org --context corp --provider corp\n"
        "  kliqued login --context corp --role admin   # act as a role the estate gives you",
    )
    p.add_argument("--url", action="append", help="the control plane (default: the context's)")
    p.add_argument(
        "--context",
        metavar="NAME",
        help="the context to write (default: the current context, else 'default')",
    )
    p.add_argument("--provider", metavar="NAME", help="which provider, when there are several")
    p.add_argument(
        "--role",
        choices=["admin", "finance", "planner"],
        help="act as this role (settings.identity.roles must list you)",
    )
    p.set_defaults(handler=run)


def _prompt(uri: str, code: str, complete: str | None) -> None:
    print(f"To sign in, open {complete or uri}", file=sys.stderr)
    print(f"and check that it shows the code {code}.", file=sys.stderr, flush=True)


@handles_errors
def run(args: argparse.Namespace) -> int:
    path = config_path()
    data = sdk_login._load(path)
    name = args.context or (data.get("current-context") if isinstance(data, dict) else None)
    name = str(name or "default")
    ctx = (
        next(
            (
                c
                for c in (data.get("contexts") or [])
                if isinstance(c, dict) and c.get("name") == name
            ),
            {},
        )
        if isinstance(data, dict)
        else {}
    )
    url = urls(args.url) or (
        ",".join(ctx["url"]) if isinstance(ctx.get("url"), list) else ctx.get("url")
    )
    if not url:
        print(f"kliqued login: give --url (context {name!r} has none)", file=sys.stderr)
        return 2
    first = str(url).split(",")[0]
    ca = ctx.get("ca-file")
    prov, answer, klique = sdk_login.device_login(
        first, args.provider, args.role, _prompt, str(ca) if ca else None
    )
    sdk_login.store(path, name, str(url), prov, answer, klique, args.role)
    print(
        f"signed in as {klique['principal']} through {prov['name']} (context {name!r} in "
        f"{path}; the token renews itself, this one until {klique['expires_at']})",
        file=sys.stderr,
    )
    return 0
