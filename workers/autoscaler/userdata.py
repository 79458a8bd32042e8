"""The start-up script of a cloud node: what makes a new instance a worker of its pool.

A cloud provider passes ``render(...)`` as the instance's user-data (EC2 ``UserData``, GCE
``startup-script``, Azure ``customData``); cloud-init runs it once, as root, at first boot.
It assumes an image with ``klique-worker`` installed (the Ansible role of workers/ansible/
can build one) and, on EC2, the AWS CLI and an instance profile that may read the token.

Why it is shaped this way:
- **No secret in the user-data.** Anyone who may describe the instance, and every process on
  it, can read its user-data; so the script fetches the pool's worker token from a secret
  store (on EC2 an SSM SecureString, ``token_ssm_parameter``) with the instance's own role
  and writes it 0600.
- **The worker is known by its node.** The script writes ``ec2-<instance id>`` (the
  provider's ``worker_id_prefix`` + the id from the metadata service) as the worker's stable
  id before starting it, so the autoscaler finds the worker of each instance at the control
  plane without asking the instance.
- **--drain**: a released node's SIGTERM makes the worker hand back its tasks and deregister
  instead of being declared lost a TTL later, as with the local provider.
"""

from __future__ import annotations

import shlex

STATE_DIR = "/var/lib/klique-worker"
TOKEN_FILE = "/etc/klique/worker.token"

_IMDS = "http://169.254.169.254/latest"


def render(
    *,
    pool: str,
    url: str,
    token_ssm_parameter: str,
    region: str,
    revision: str | None = None,
    worker_command: str = "klique-worker",
    worker_args: list[str] | None = None,
    worker_id_prefix: str = "ec2-",
) -> str:
    """The EC2 user-data (a bash script) that starts the pool's worker on a new instance."""
    q = shlex.quote
    argv = [
        worker_command,
        "--url",
        url,
        "--pool",
        pool,
        "--token-file",
        TOKEN_FILE,
        "--state-dir",
        STATE_DIR,
        "--gpus",
        "auto",
        "--drain",
        *(worker_args or []),
    ]
    wid = q(STATE_DIR + "/worker-id")
    return f"""#!/bin/bash
# klique: a node of pool {pool}, started by `kliqued autoscale` (estate {revision or "-"}).
# Runs once at first boot (cloud-init): fetch the pool's worker token, name the worker after
# this instance, start klique-worker under systemd.
set -euo pipefail
umask 077
install -d -m 0700 {q(STATE_DIR)} /etc/klique
imds=$(curl -sf -X PUT {_IMDS}/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')
iid=$(curl -sf -H "X-aws-ec2-metadata-token: $imds" {_IMDS}/meta-data/instance-id)
[ -s {wid} ] || echo "{worker_id_prefix}$iid" > {wid}
aws ssm get-parameter --region {q(region)} --with-decryption --name {q(token_ssm_parameter)} \\
    --query Parameter.Value --output text > {q(TOKEN_FILE)}
chmod 0600 {q(TOKEN_FILE)}
systemd-run --unit klique-worker --property Restart=on-failure --property KillSignal=SIGTERM \\
    --property TimeoutStopSec=120 {shlex.join(argv)}
"""
