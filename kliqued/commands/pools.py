"""``kliqued pools``: capacity and use of every pool."""

from __future__ import annotations

import argparse

from ._client import add_client_flags, client, handles_errors, num, print_json, table
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers, "pools", help="capacity, use and borrowed GPUs per pool",
        description="Every pool with its declared capacity, the GPUs in use, those used by "
                    "groups above their reservation (borrowed) and those free.",
        examples="  kliqued pools\n"
                 "  kliqued pools --json")
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    pools = client(args).pools()
    if args.json:
        print_json({"pools": pools})
        return 0
    rows = [[p["name"], p.get("kind"), p.get("gpu_type"), num(p.get("capacity")),
             num(p.get("used")), num(p.get("borrowed")), num(p.get("free"))] for p in pools]
    total = [sum(float(p.get(k) or 0) for p in pools)
             for k in ("capacity", "used", "borrowed", "free")]
    rows.append(["total", "", "", *(num(v) for v in total)])
    print(table(["POOL", "KIND", "GPU TYPE", "CAPACITY", "USED", "BORROWED", "FREE"], rows,
                right=[3, 4, 5, 6]))
    return 0
