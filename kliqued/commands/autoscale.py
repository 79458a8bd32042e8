"""``kliqued autoscale``: the cloud autoscaler of one pool (docs/autoscaling.md)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from klique_util.units import MILLI

from ._client import add_client_flags, client, handles_errors
from ._common import DEFAULT_ESTATE, add_command

EXAMPLES = """\
  # scale the pool aws-eu-burst with the built-in local provider (worker processes on this
  # machine), with an admin token, every 10 s
  export KLIQUE_URL=http://127.0.0.1:8080 KLIQUE_TOKEN=kq_...admin...
  kliqued token create --worker --pool aws-eu-burst > burst.token && chmod 600 burst.token
  kliqued autoscale --pool aws-eu-burst --provider local --worker-token-file burst.token

  # one round only, printing what it did; spot refused by the local provider's config
  echo 'spot_capacity: 0' > local.yaml
  kliqued autoscale --pool aws-eu-burst --provider-config local.yaml \\
      --worker-token-file burst.token --once

  # overrides of the estate's autoscale settings (tests, demos)
  kliqued autoscale --pool aws-eu-burst --worker-token-file burst.token \\
      --max 4 --idle-timeout 2s --interval 1s
"""


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "autoscale",
        help="scale a cloud pool with its placed work (a loop)",
        description="Adds nodes to a `kind: cloud` pool with `autoscale` when placed work waits "
        "there (spot first, on-demand when spot is refused, up to autoscale.max "
        "GPUs) and releases a node that ran nothing for autoscale.idle_timeout. "
        "Reads the pool's settings from the estate and its placed tasks from the "
        "control plane (an admin token); nodes come from a provider. Runs until "
        "SIGTERM/Ctrl-C, or one round with --once. docs/autoscaling.md.",
        examples=EXAMPLES,
    )
    p.add_argument("--pool", required=True, metavar="NAME", help="the cloud pool to scale")
    p.add_argument(
        "--provider",
        default="local",
        choices=["local", "ec2"],
        help="where nodes come from (default: local, klique-worker processes on "
        "this machine; ec2: EC2 instances, docs/autoscaling.md)",
    )
    p.add_argument(
        "--provider-config",
        metavar="FILE",
        help="the provider's settings, YAML or JSON (local: root, url, token_file, "
        "spot_capacity, on_demand_capacity, worker_args; ec2: region, "
        "image_id, instance_types, token_ssm_parameter, ...)",
    )
    p.add_argument(
        "--worker-token-file",
        metavar="FILE",
        help="the pool's worker token, for the workers the local provider starts",
    )
    p.add_argument(
        "--estate",
        default=DEFAULT_ESTATE,
        metavar="DIR",
        help=f"the estate with the pool's autoscale settings (default: {DEFAULT_ESTATE})",
    )
    p.add_argument("--max", type=int, metavar="GPUS", help="override autoscale.max")
    p.add_argument(
        "--idle-timeout", metavar="DURATION", help="override autoscale.idle_timeout (e.g. 10m, 2s)"
    )
    p.add_argument(
        "--spot-first",
        dest="spot_first",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="override autoscale.spot_first",
    )
    p.add_argument(
        "--node-gpus",
        type=int,
        metavar="N",
        help="GPUs of one node (default: the pool's settings.node_gpus, else 1)",
    )
    p.add_argument(
        "--spot-retry",
        default="5m",
        metavar="DURATION",
        help="after spot was refused, ask for on-demand for this long (default: 5m)",
    )
    p.add_argument(
        "--launch-timeout",
        default="5m",
        metavar="DURATION",
        help="release a node whose worker is not up after this long (default: 5m)",
    )
    p.add_argument(
        "--interval", default="10s", metavar="DURATION", help="time between rounds (default: 10s)"
    )
    p.add_argument("--once", action="store_true", help="run one round and exit")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_client_flags(p, json_flag=False)
    p.set_defaults(handler=run)


def _load_config(path: str | None) -> dict:
    if not path:
        return {}
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".json"):
        data = json.loads(text)
    else:
        from ruamel.yaml import YAML

        data = YAML(typ="safe").load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the provider config must be a mapping")
    return data


def policy_for(args: argparse.Namespace):
    """The pool's ScalePolicy from the estate, with the command line's overrides, and the
    estate's revision (a cloud provider tags its nodes with it)."""
    from compiler.api import compile_dir
    from workers.autoscaler.decide import ScalePolicy
    from workers.cli import duration

    res = compile_dir(args.estate)
    if res.estate is None:
        raise ValueError(
            f"the estate {args.estate} does not compile (kliqued validate {args.estate})"
        )
    pool = next((p for p in res.estate.pools if p.name == args.pool), None)
    if pool is None:
        raise ValueError(f"no pool {args.pool!r} in the estate {args.estate}")
    if pool.kind != "cloud" or pool.autoscale is None:
        raise ValueError(
            f"pool {args.pool} is a {pool.kind} pool without autoscale: only "
            "`kind: cloud` pools with `autoscale` are scaled"
        )
    a = pool.autoscale
    node_gpus = args.node_gpus or int(pool.settings.get("node_gpus", 1))
    return res.estate.revision, ScalePolicy(
        max_milli=args.max * MILLI if args.max is not None else a.max_milli,
        idle_timeout_s=(
            duration(args.idle_timeout) if args.idle_timeout else float(a.idle_timeout_s)
        ),
        spot_first=a.spot_first if args.spot_first is None else args.spot_first,
        node_gpus=node_gpus,
        spot_retry_s=duration(args.spot_retry),
        launch_timeout_s=duration(args.launch_timeout),
    )


@handles_errors
def run(args: argparse.Namespace) -> int:
    from workers.autoscaler import Autoscaler, make_provider
    from workers.cli import duration

    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        revision, policy = policy_for(args)
        api = client(args)
        # the nodes' workers get every daemon's URL and follow the leader (docs/ha.md), not
        # only the one this client happens to use now
        provider = make_provider(
            args.provider,
            _load_config(args.provider_config),
            url=",".join(api.urls),
            token_file=args.worker_token_file,
            revision=revision,
        )
        interval = duration(args.interval)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        print(f"kliqued autoscale: {exc}", file=sys.stderr)
        return 2
    scaler = Autoscaler(api, provider, args.pool, policy)
    print(
        f"autoscaling {args.pool}: max {policy.max_gpus} GPU(s), nodes of "
        f"{policy.node_gpus}, idle timeout {policy.idle_timeout_s:g}s, "
        f"{'spot first' if policy.spot_first else 'on-demand only'}, provider "
        f"{args.provider}",
        file=sys.stderr,
    )
    if args.once:
        print(scaler.step().line())
        return 0
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    scaler.run(interval, stop=lambda: bool(stopping), echo=lambda line: print(line, flush=True))
    print("autoscaler stopped; its nodes keep running (a new run takes them back)", file=sys.stderr)
    return 0
