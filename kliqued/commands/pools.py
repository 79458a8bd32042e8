"""``kliqued pools``: capacity and use of every pool; ``--by-level``: by level of the
organisation's tree."""

from __future__ import annotations

import argparse

from ._client import add_client_flags, client, handles_errors, num, print_json, table
from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "pools",
        help="capacity, use, borrowed GPUs and live workers per pool",
        description="Every pool with its declared capacity, the GPUs in use, those used by "
        "groups above their reservation (borrowed), those free, and its live "
        "workers (how many, with how many GPUs). A pool with no live worker "
        "takes no new work (an autoscaled pool does: its workers come with it). "
        "Where the workers' reported GPUs (count per machine, model, memory) "
        "disagree with the pool's declaration, a warning says how (marked `!`); "
        "the engine counts the declared capacity. "
        "With --by-level: who uses each pool, by level of the organisation "
        "(business unit > department > team), so a department head sees where "
        "their teams run.",
        examples="  kliqued pools\n"
        "  kliqued pools --by-level         # where each level of the tree runs\n"
        "  kliqued pools --json",
    )
    p.add_argument(
        "--by-level",
        action="store_true",
        help="per pool, the GPUs used there by each group of the organisation's "
        "tree you may see, rolled up (a department counts its teams, a "
        "business unit its departments), indented under the group above",
    )
    add_client_flags(p)
    p.set_defaults(handler=run)


@handles_errors
def run(args: argparse.Namespace) -> int:
    pools = client(args).pools()
    if args.json:
        print_json({"pools": pools})
        return 0
    if args.by_level:
        print(by_level(pools))
        return 0
    rows = [
        [
            p["name"],
            p.get("kind"),
            p.get("gpu_type"),
            num(p.get("capacity")),
            num(p.get("used")),
            num(p.get("borrowed")),
            num(p.get("free")),
            workers(p),
        ]
        for p in pools
    ]
    total = [
        sum(float(p.get(k) or 0) for p in pools) for k in ("capacity", "used", "borrowed", "free")
    ]
    live = sum((p.get("workers") or {}).get("live", 0) for p in pools)
    rows.append(["total", "", "", *(num(v) for v in total), f"{live} live"])
    print(
        table(
            ["POOL", "KIND", "GPU TYPE", "CAPACITY", "USED", "BORROWED", "FREE", "WORKERS"],
            rows,
            right=[3, 4, 5, 6],
        )
    )
    for p in pools:  # issue 15: what the workers report against what the pool declares
        for text in (p.get("capacity_truth") or {}).get("mismatches", []):
            print(f"\nwarning: {text}", end="")
    if any((p.get("capacity_truth") or {}).get("mismatches") for p in pools):
        print("\n(the engine counts the declared capacity: fix the estate's pool or the machines)")
    down = [p for p in pools if p.get("takes_work") is False]
    no_scaler = [p["name"] for p in down if p.get("autoscaled")]
    idle = [p["name"] for p in down if not p.get("autoscaled")]
    if no_scaler:
        print(
            f"\nno autoscaler running for {', '.join(no_scaler)}: no new work is placed there "
            f"until one runs (kliqued autoscale --pool NAME) or a worker registers"
        )
    if idle:
        print(
            f"\nno live worker in {', '.join(idle)}: no new work is placed there until a "
            f"worker registers (klique-worker --pool NAME)"
        )
    for line in cloud_lines(pools):
        print(line)
    shares = fair_shares(pools)
    if shares:
        print(
            f"\nfair shares (borrowed GPUs / lend_weight; idle GPUs go to the lowest "
            f"first): {shares}"
        )
    return 0


def fair_shares(pools: list[dict]) -> str:
    """With ``order: fair``: each level that uses some pool, once, with its share and
    weight (``team-a 1 (weight 2), team-b 0 (weight 1)``); empty otherwise."""
    seen: dict[str, dict] = {}
    for p in pools:
        for x in p.get("by_level") or []:
            if "share" in x:
                seen.setdefault(x["group"], x)
    return ", ".join(
        f"{g} {num(x['share'])} (weight {num(x.get('lend_weight'))})"
        for g, x in sorted(seen.items())
    )


def cloud_lines(pools: list[dict]) -> list[str]:
    """An autoscaled pool's cloud spend this month, its nodes, and why work waits for a
    node (the autoscaler's word: the spend cap, capacity, a provider error); nothing for a
    pool with no cap that has spent nothing this month and runs no node."""
    out = []
    for p in pools:
        c = p.get("cloud")
        if not c or not (
            c.get("nodes")
            or c.get("scaling")
            or c.get("spend_cap") is not None
            or c.get("spent") not in (None, "0")
        ):
            continue  # nothing spent, running or waiting, and no cap
        cap = f" of {c['spend_cap']}" if c.get("spend_cap") is not None else ""
        spot = sum(1 for n in c.get("nodes", []) if n.get("lifecycle") == "spot")
        nodes = len(c.get("nodes", []))
        out.append(
            f"\n{p['name']}: cloud spend {c['month']} {c['spent']}{cap} "
            f"{c['currency']}{' (capped: no new node)' if c.get('capped') else ''}; "
            f"{nodes} node(s), {spot} spot"
        )
        s = c.get("scaling")
        if s:
            out.append(
                f"  {s['waiting']} task(s) wait for a node since {s['since']}: {s['reason']}"
            )
    return out


def workers(p: dict) -> str:
    """``2 (8 GPUs)``, ``none``, or for an autoscaled pool ``none (autoscaled)``; ``2 (8
    GPUs, 4+4 of 8+8 declared)`` for a pool that declares its machines; a ``!`` when the
    workers disagree with the declaration (issue 15)."""
    w = p.get("workers")
    if w is None:  # a daemon before liveness
        return "-"
    truth = p.get("capacity_truth") or {}
    machines = (truth.get("declared") or {}).get("machines")
    shape = ""
    if machines and w["live"]:
        got = "+".join(str(n) for n in (truth.get("reported") or {}).get("machines", []))
        shape = f", {got} of {'+'.join(str(n) for n in machines)} declared"
    text = (
        f"{w['live']} ({w['gpus']} GPU{'' if w['gpus'] == 1 else 's'}{shape})"
        if w["live"]
        else "none"
    )
    if truth.get("mismatches"):
        text += " !"
    return text + (" (autoscaled)" if p.get("autoscaled") and not w["live"] else "")


def by_level(pools: list[dict]) -> str:
    """Per pool that some group shown uses, one row per such group (``by_level``, top
    first), indented by its depth below the shallowest group shown, with its share of the
    pool's capacity (and with ``order: fair`` its fair share and weight, lending.md); the other
    pools are named after the table."""
    rows = []
    idle = []
    fair = any("share" in x for p in pools for x in p.get("by_level") or [])
    for p in pools:
        levels = p.get("by_level") or []
        if not levels:
            idle.append(p["name"])
            continue
        top = min(x.get("depth", 0) for x in levels)
        cap = float(p.get("capacity") or 0)
        first = [p["name"], num(p.get("capacity")), num(p.get("used"))]
        for i, x in enumerate(levels):
            share = f"{float(x['used']) * 100 / cap:.0f}%" if cap else "-"
            rows.append(
                [
                    *(first if i == 0 else ["", "", ""]),
                    "  " * (x.get("depth", 0) - top) + x["group"],
                    num(x["used"]),
                    share,
                    *([num(x.get("share")), num(x.get("lend_weight"))] if fair else []),
                ]
            )
    text = (
        table(
            [
                "POOL",
                "CAPACITY",
                "USED",
                "LEVEL",
                "GPUS",
                "OF POOL",
                *(["FAIR SHARE", "WEIGHT"] if fair else []),
            ],
            rows,
            right=[1, 2, 4, 5, 6, 7],
        )
        if rows
        else "no GPUs in use by the groups you may see"
    )
    if idle and rows:
        text += f"\n\nnot used by the groups you may see: {', '.join(idle)}"
    return text
