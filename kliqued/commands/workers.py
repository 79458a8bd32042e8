"""``kliqued workers rollout``: install and start workers on the hosts of an Ansible inventory
(workers/ansible/, workers/rollout.py, docs/rollout.md)."""

from __future__ import annotations

import argparse
import sys

from ._client import SEVERAL_URLS, urls
from ._common import add_command

EXAMPLES = """\
  # roll workers out to a new pool in three commands (docs/rollout.md)
  kliqued token create --worker --pool onprem-baremetal > worker.token && chmod 600 worker.token
  printf '[gpu]\\ngpu-01.example.com klique_worker_gpus=0,1,2,3\\ngpu-02.example.com\\n' > hosts.ini
  kliqued workers rollout --inventory hosts.ini --pool onprem-baremetal \\
      --url https://klique.example.com --token-file worker.token

  # a control plane of two daemons (docs/ha.md): the workers follow the leader
  kliqued workers rollout --inventory hosts.ini --pool onprem-baremetal \\
      --url https://k1.example.com,https://k2.example.com --token-file worker.token

  # what would change, without changing anything
  kliqued workers rollout --inventory hosts.ini --pool onprem-baremetal \\
      --token-file worker.token --check

  # this machine, into a directory of its own, from a given wheel
  printf 'localhost ansible_connection=local\\n' > local.ini
  kliqued workers rollout --inventory local.ini --pool dev --token-file worker.token \\
      --prefix /tmp/klique-dev --package dist/klique-0.1.0-py3-none-any.whl -e klique_worker_gpus=0,1
"""


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "workers",
        help="roll klique-worker out to hosts with Ansible",
        description="Operations on the workers of a pool.",
        examples=EXAMPLES,
    )
    sub = p.add_subparsers(dest="workers_cmd", metavar="<rollout>")
    r = sub.add_parser(
        "rollout",
        help="install, configure and start workers on an inventory's hosts",
        description="Runs workers/ansible/playbook.yml through ansible-runner: installs the "
        "worker in a virtual env on every host of the inventory, writes its token "
        "(0600) and configuration, starts it (systemd where the host has it, else "
        "a pid file) and waits until it registered with the control plane. "
        "Prints each host's tasks as they end and a summary; exits 1 if a host "
        "failed. A second run changes nothing.",
        epilog="examples:\n" + EXAMPLES,
        formatter_class=p.formatter_class,
    )
    r.add_argument(
        "--inventory",
        "-i",
        required=True,
        metavar="FILE",
        help="an Ansible inventory (INI or YAML); host variables such as "
        "klique_worker_gpus override the defaults per host",
    )
    r.add_argument("--pool", required=True, metavar="NAME", help="the pool the workers serve")
    r.add_argument(
        "--url",
        metavar="URL",
        action="append",
        help="the control plane as the hosts reach it (default: KLIQUE_URL or the "
        f"config context); {SEVERAL_URLS}",
    )
    r.add_argument(
        "--token-file",
        metavar="FILE",
        default="worker.token",
        help="the pool's worker token on this machine (kliqued token create "
        "--worker --pool NAME); default worker.token",
    )
    r.add_argument(
        "--admin-token",
        metavar="TOKEN",
        help="a token to ask the control plane whether the workers registered "
        "(default: KLIQUE_TOKEN or the config context, else the worker token)",
    )
    r.add_argument(
        "--prefix", metavar="DIR", help="where on the hosts everything goes (default /opt/klique)"
    )
    what = r.add_mutually_exclusive_group()
    what.add_argument(
        "--package",
        metavar="FILE",
        help="a wheel or sdist to install (default: a wheel of this source tree, built here)",
    )
    what.add_argument(
        "--pip-spec",
        metavar="SPEC",
        help="install with pip from an index instead, e.g. 'klique==0.1.0' "
        "(with -e klique_worker_pip_index_url=URL)",
    )
    r.add_argument(
        "--check", action="store_true", help="only say what would change (Ansible's check mode)"
    )
    r.add_argument("--limit", metavar="PATTERN", help="only these hosts of the inventory")
    r.add_argument(
        "-e",
        "--extra-var",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a role variable (workers/ansible/roles/klique_worker/defaults/main.yml); repeatable",
    )
    r.add_argument("-v", "--verbose", action="store_true", help="also print skipped tasks")
    p.set_defaults(handler=run)


def _connection(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The control plane's URLs (``"a,b"``: the workers are given all of them) and an admin
    token from the flags, else the client config."""
    url, token = urls(args.url), args.admin_token
    if url and token:
        return url, token
    try:
        from kliqued.sdk import resolve

        res = resolve(url, token, None)
        return url or urls(res.url), token or res.token
    except Exception:
        return url, token


def run(args: argparse.Namespace) -> int:
    if getattr(args, "workers_cmd", None) != "rollout":
        print("kliqued workers: give rollout (see --help)", file=sys.stderr)
        return 2
    from workers.rollout import RolloutError, rollout

    extra = {}
    for item in args.extra_var:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"kliqued workers rollout: -e {item!r}: give KEY=VALUE", file=sys.stderr)
            return 2
        extra[key.strip()] = value
    url, admin = _connection(args)
    if not url:
        print(
            "kliqued workers rollout: give --url (the control plane as the hosts reach it) "
            "or set KLIQUE_URL",
            file=sys.stderr,
        )
        return 2
    print(
        f"rolling out klique-worker for pool {args.pool} to {args.inventory} "
        f"(control plane {url}){' in check mode' if args.check else ''}",
        flush=True,
    )
    try:
        result = rollout(
            args.inventory,
            args.pool,
            url,
            args.token_file,
            prefix=args.prefix,
            check=args.check,
            package=args.package,
            pip_spec=args.pip_spec,
            admin_token=admin,
            extravars=extra,
            limit=args.limit,
            verbose=args.verbose,
            out=lambda line: print(line, flush=True),
        )
    except RolloutError as exc:
        print(f"kliqued workers rollout: {exc}", file=sys.stderr)
        return 1
    print("\nsummary:")
    for host, s in sorted(result.hosts.items()):
        print(f"  {host}: {s.line()}")
    for failure in result.failures:
        print(failure, file=sys.stderr)
    if result.ok:
        print(f"{len(result.hosts)} host(s) done, {result.changed} change(s)")
        return 0
    failed = [h for h, s in result.hosts.items() if s.failed or s.unreachable]
    print(f"failed: {', '.join(sorted(failed)) or 'the playbook'}", file=sys.stderr)
    return 1
