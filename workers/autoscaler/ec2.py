"""The EC2 provider: a pool's nodes are EC2 instances, found again by their tags.

- **launch(pool, gpus, spot)** picks the first of the configured instance types with at
  least ``gpus`` GPUs that is below its own maximum (``max``: instances of that type in the
  pool at once, counted from the instances EC2 reports), and asks ``RunInstances`` for one
  instance, spot (``InstanceMarketOptions``, one-time, terminate on interruption) or
  on-demand. A capacity answer (``CAPACITY_ERRORS``: InsufficientInstanceCapacity,
  MaxSpotInstanceCountExceeded, SpotMaxPriceTooLow, ...) moves on to the next eligible type;
  when every type is refused or at its maximum the launch raises ``CapacityUnavailable``,
  which the loop turns into the on-demand fallback (after spot) or a wait with the reason.
  Any other AWS error (a bad AMI, no permission) raises ``ProviderError``: a configuration
  to fix, never a capacity question.
- **Tags** (instance and volumes), for finding the nodes and for cost attribution in AWS's
  own bills: ``klique:pool``, ``klique:revision`` (the estate revision that asked for it),
  ``klique:managed-by = klique-autoscaler``, ``klique:lifecycle``, ``Name``, plus the
  configured ``tags``.
- **User-data**: ``userdata.render``; the worker is named ``ec2-<instance id>``.
- **list(pool)**: the pool's instances by tag, pending or running (``up`` once running);
  stopping, stopped, shutting-down or terminated by someone else as ``gone`` (a reclaimed
  spot instance), which the loop releases at once; those it terminated itself left out.
- **terminate(node)**: ``TerminateInstances``; an instance already gone is fine.

**Emulation** (``emulate_workers``): an EC2 emulator (moto) runs no user-data, so the
provider starts, for each instance it launches, the worker the user-data would start, as a
local ``klique-worker`` process (``LocalProvider.start_worker``) with the same worker id, and
stops it with the instance. The EC2 calls are the real ones either way. Tests and demos only.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from workers.autoscaler import userdata
from workers.autoscaler.providers import LocalProvider, Node, Provider
from workers.errors import CapacityUnavailable, ProviderError

log = logging.getLogger(__name__)

CAPACITY_ERRORS = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "Unsupported",
        "InsufficientFreeAddressesInSubnet",
    }
)
"""RunInstances error codes that mean "not this capacity, now": try another type or
lifecycle, or wait. (EC2's error reference, "Common client error codes".)"""

LIVE_STATES = ("pending", "running")
GONE_STATES = ("shutting-down", "stopping", "stopped")
MANAGED_BY = "klique-autoscaler"
WORKER_PREFIX = "ec2-"


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    max: int | None = None  # instances of this type in the pool at once

    @classmethod
    def parse(cls, item: Any, where: str) -> "InstanceType":
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(
                f"{where}: an instance type is {{name: g5.xlarge, gpus: 1, max: 4}}, found {item!r}"
            )
        unknown = set(item) - {"name", "gpus", "max"}
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; known: name, gpus, max")
        gpus, top = item.get("gpus"), item.get("max")
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
            raise ValueError(f"{where}.gpus: a whole number of GPUs >= 1, found {gpus!r}")
        if top is not None and (not isinstance(top, int) or isinstance(top, bool) or top < 0):
            raise ValueError(f"{where}.max: a whole number of instances >= 0, found {top!r}")
        return cls(item["name"], gpus, top)


def _tag(inst: dict, key: str) -> str | None:
    return next((t["Value"] for t in inst.get("Tags") or [] if t["Key"] == key), None)


class Ec2Provider(Provider):
    name = "ec2"

    KNOWN = {
        "region",
        "endpoint_url",
        "image_id",
        "instance_types",
        "subnet_id",
        "security_group_ids",
        "key_name",
        "iam_instance_profile",
        "token_ssm_parameter",
        "tags",
        "worker_command",
        "worker_args",
        "url",
        "emulate_workers",
    }

    def __init__(
        self,
        *,
        region: str,
        image_id: str,
        instance_types: list[InstanceType],
        url: str,
        token_ssm_parameter: str,
        endpoint_url: str | None = None,
        subnet_id: str | None = None,
        security_group_ids: list[str] | None = None,
        key_name: str | None = None,
        iam_instance_profile: str | None = None,
        tags: dict[str, str] | None = None,
        revision: str | None = None,
        worker_command: str = "klique-worker",
        worker_args: list[str] | None = None,
        emulation: LocalProvider | None = None,
        client: Any = None,
    ):
        try:
            import boto3  # only where the provider is used: a worker host does not need it
        except ImportError:
            raise ValueError("the ec2 provider needs boto3: pip install 'klique[ec2]'") from None

        self.region, self.image_id, self.url = region, image_id, url
        self.types = list(instance_types)
        self.token_ssm_parameter = token_ssm_parameter
        self.subnet_id, self.key_name = subnet_id, key_name
        self.security_group_ids = list(security_group_ids or [])
        self.iam_instance_profile = iam_instance_profile
        self.tags, self.revision = dict(tags or {}), revision
        self.worker_command, self.worker_args = worker_command, list(worker_args or [])
        self.emulation = emulation
        self._terminated: set[str] = set()
        self.ec2 = client or boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)

    @classmethod
    def from_config(
        cls,
        config: dict,
        url: str | None = None,
        token_file: str | None = None,
        revision: str | None = None,
    ) -> "Ec2Provider":
        unknown = set(config) - cls.KNOWN
        if unknown:
            raise ValueError(
                f"ec2 provider: unknown setting(s) {sorted(unknown)}; known: "
                f"{', '.join(sorted(cls.KNOWN))}"
            )
        for key in ("region", "image_id", "token_ssm_parameter"):
            if not isinstance(config.get(key), str) or not config[key]:
                raise ValueError(f"ec2 provider: {key} is required (a string)")
        raw = config.get("instance_types")
        if not isinstance(raw, list) or not raw:
            raise ValueError(
                "ec2 provider: instance_types is required: a list of {name, gpus, max}"
            )
        types = [InstanceType.parse(t, f"instance_types[{i}]") for i, t in enumerate(raw)]
        url = config.get("url") or url
        if not url:
            raise ValueError(
                "ec2 provider: give the control plane's url its workers use "
                "(url in the provider config, or --url)"
            )
        tags = config.get("tags") or {}
        if not isinstance(tags, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
        ):
            raise ValueError("ec2 provider: tags is a mapping of strings to strings")
        emulation = None
        emu = config.get("emulate_workers")
        if emu:
            if not isinstance(emu, dict) or not (emu.get("token_file") or token_file):
                raise ValueError(
                    "ec2 provider: emulate_workers is {root: DIR, token_file: "
                    "FILE, worker_args: [...]} (local workers for an emulator)"
                )
            emu_token = emu.get("token_file") or token_file
            assert emu_token is not None
            emulation = LocalProvider(
                emu.get("root") or "klique-ec2-emulation",
                url,
                emu_token,
                worker_args=emu.get("worker_args"),
            )
        return cls(
            region=config["region"],
            image_id=config["image_id"],
            instance_types=types,
            url=url,
            token_ssm_parameter=config["token_ssm_parameter"],
            endpoint_url=config.get("endpoint_url"),
            subnet_id=config.get("subnet_id"),
            security_group_ids=config.get("security_group_ids"),
            key_name=config.get("key_name"),
            iam_instance_profile=config.get("iam_instance_profile"),
            tags=tags,
            revision=revision,
            worker_command=config.get("worker_command") or "klique-worker",
            worker_args=config.get("worker_args"),
            emulation=emulation,
        )

    # --------------------------------------------------------------------------------------
    def user_data(self, pool: str) -> str:
        return userdata.render(
            pool=pool,
            url=self.url,
            region=self.region,
            token_ssm_parameter=self.token_ssm_parameter,
            revision=self.revision,
            worker_command=self.worker_command,
            worker_args=self.worker_args,
            worker_id_prefix=WORKER_PREFIX,
        )

    def tags_for(self, pool: str, spot: bool) -> dict[str, str]:
        return {
            **self.tags,
            "Name": f"klique-{pool}",
            "klique:pool": pool,
            "klique:revision": self.revision or "",
            "klique:managed-by": MANAGED_BY,
            "klique:lifecycle": "spot" if spot else "on-demand",
        }

    def _instances(self, pool: str, states: tuple[str, ...]) -> list[dict]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            pages = self.ec2.get_paginator("describe_instances").paginate(
                Filters=[
                    {"Name": "tag:klique:pool", "Values": [pool]},
                    {"Name": "tag:klique:managed-by", "Values": [MANAGED_BY]},
                    {"Name": "instance-state-name", "Values": list(states)},
                ]
            )
            return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        except (ClientError, BotoCoreError) as exc:
            raise ProviderError(f"ec2: cannot list the instances of pool {pool}: {exc}") from exc

    def _choices(self, pool: str, gpus: int) -> tuple[list[InstanceType], list[str]]:
        """The types that may take a node of ``gpus`` GPUs now, smallest first, and why the
        others may not."""
        counts: dict[str, int] = {}
        for inst in self._instances(pool, LIVE_STATES):
            counts[inst["InstanceType"]] = counts.get(inst["InstanceType"], 0) + 1
        fit = sorted((t for t in self.types if t.gpus >= gpus), key=lambda t: t.gpus)
        why = (
            []
            if fit
            else [
                f"no instance type has {gpus} GPU(s) (largest: {max(t.gpus for t in self.types)})"
            ]
        )
        ok = []
        for t in fit:
            if t.max is not None and counts.get(t.name, 0) >= t.max:
                why.append(f"{t.name} at its maximum ({counts.get(t.name, 0)}/{t.max})")
            else:
                ok.append(t)
        return ok, why

    def launch(self, pool: str, gpus: int, spot: bool) -> Node:
        from botocore.exceptions import BotoCoreError, ClientError

        kind = "spot" if spot else "on-demand"
        types, refused = self._choices(pool, gpus)
        for t in types:
            args: dict[str, Any] = {
                "ImageId": self.image_id,
                "InstanceType": t.name,
                "MinCount": 1,
                "MaxCount": 1,
                "UserData": self.user_data(pool),
                "ClientToken": uuid.uuid4().hex,
                "TagSpecifications": [
                    {
                        "ResourceType": rt,
                        "Tags": [
                            {"Key": k, "Value": v} for k, v in self.tags_for(pool, spot).items()
                        ],
                    }
                    for rt in ("instance", "volume")
                ],
            }
            if spot:
                args["InstanceMarketOptions"] = {
                    "MarketType": "spot",
                    "SpotOptions": {
                        "SpotInstanceType": "one-time",
                        "InstanceInterruptionBehavior": "terminate",
                    },
                }
            if self.subnet_id:
                args["SubnetId"] = self.subnet_id
            if self.security_group_ids:
                args["SecurityGroupIds"] = self.security_group_ids
            if self.key_name:
                args["KeyName"] = self.key_name
            if self.iam_instance_profile:
                args["IamInstanceProfile"] = {"Name": self.iam_instance_profile}
            try:
                inst = self.ec2.run_instances(**args)["Instances"][0]
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code in CAPACITY_ERRORS:
                    refused.append(f"{t.name}: {code}")
                    log.info("ec2: %s %s refused for pool %s: %s", kind, t.name, pool, code)
                    continue
                raise ProviderError(f"ec2: RunInstances {t.name} ({kind}) failed: {exc}") from exc
            except BotoCoreError as exc:
                raise ProviderError(f"ec2: RunInstances {t.name} ({kind}) failed: {exc}") from exc
            node = self._node(inst, pool)
            if self.emulation is not None:
                self.emulation.start_worker(
                    node.id, pool, node.gpus, spot, worker_id=node.worker_id
                )
            return node
        raise CapacityUnavailable(
            f"ec2: no {kind} capacity for {gpus} GPU(s): " + "; ".join(refused)
        )

    def _node(self, inst: dict, pool: str) -> Node:
        gpus = next((t.gpus for t in self.types if t.name == inst["InstanceType"]), 0)
        state = inst["State"]["Name"]
        spot = inst.get("InstanceLifecycle") == "spot"
        up = state == "running"
        if up and self.emulation is not None:
            local = {n.id: n for n in self.emulation.list(pool)}.get(inst["InstanceId"])
            up = local is not None and local.up
        return Node(
            inst["InstanceId"],
            pool,
            gpus,
            spot,
            inst["LaunchTime"].timestamp(),
            up=up,
            gone=state in GONE_STATES or state == "terminated",
            worker_id=WORKER_PREFIX + inst["InstanceId"],
            meta={
                "instance_type": inst["InstanceType"],
                "state": state,
                "lifecycle": "spot" if spot else "on-demand",
                "provider": self.name,
            },
        )

    def list(self, pool: str) -> list[Node]:
        """Pending and running instances, and those stopped or terminated by someone else
        (a reclaimed spot instance, a console click) as ``gone``: the loop then releases
        them at once (their worker deregistered, their interval ended). EC2 shows a
        terminated instance for about an hour; the ones this provider terminated are left
        out."""
        return [
            self._node(i, pool)
            for i in self._instances(pool, LIVE_STATES + GONE_STATES + ("terminated",))
            if i["InstanceId"] not in self._terminated
        ]

    def terminate(self, node: Node) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        if self.emulation is not None:
            for local in self.emulation.list(node.pool):
                if local.id == node.id:
                    self.emulation.terminate(local)
        self._terminated.add(node.id)
        try:
            self.ec2.terminate_instances(InstanceIds=[node.id])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidInstanceID.NotFound":
                return
            raise ProviderError(f"ec2: TerminateInstances {node.id} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise ProviderError(f"ec2: TerminateInstances {node.id} failed: {exc}") from exc
