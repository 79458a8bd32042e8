"""`klique-worker`: the worker daemon of a pool (docs/workers.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys

from klique_util import session_apps
from klique_util.cli import HelpFormatter
from klique_util.units import DAY_S, SECOND_MS, UNIT_SECONDS
from workers.errors import ConfigError

EXAMPLES = """\
  # a bare-metal server with NVIDIA GPUs (found with nvidia-smi)
  klique-worker --url https://klique.example.com --pool onprem-baremetal \\
      --token-file /etc/klique/worker.token

  # a machine without GPUs, declaring two fake ones (development, tests)
  klique-worker --url http://127.0.0.1:8080 --pool onprem-baremetal \\
      --token-file worker.token --state-dir /tmp/kw --gpus 0,1

  # only GPUs 4-7 of this server, tasks in a given virtual env, a private CA, 2 minutes
  # for a preempted task to checkpoint
  klique-worker --url https://klique.internal --pool hpc-a100 --token-file /etc/klique/t \\
      --gpus 4,5,6,7 --venv /opt/envs/torch --ca-file /etc/klique/ca.pem --grace 2m
"""

_UNITS = {"ms": 1 / SECOND_MS, **UNIT_SECONDS}


def duration(text: str) -> float:
    """`30s`, `2m`, `1h`, `1.5s`, `500ms`, or plain seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 2m or 1h")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="klique-worker",
        formatter_class=HelpFormatter,
        description="The Klique worker daemon: pulls the tasks placed on its pool from the\n"
        "control plane over outbound HTTPS, runs them on its GPUs, reports their\n"
        "ends and uploads their logs. Its restart is safe: running tasks keep\n"
        "running and are taken back (docs/workers.md).",
        epilog="examples:\n" + EXAMPLES,
    )
    p.add_argument(
        "--url",
        required=True,
        action="append",
        help="the control plane, e.g. https://klique.example.com; several daemons "
        "of one control plane: repeat it, or separate them with commas, and "
        "the worker follows the leader (docs/ha.md)",
    )
    p.add_argument("--pool", required=True, help="the pool this worker serves (the token's pool)")
    p.add_argument(
        "--token-file",
        required=True,
        help="file holding the worker token (kliqued token create --worker --pool "
        "NAME); read again when it changes",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="where the worker keeps its id, task records and logs (default "
        "/var/lib/klique-worker as root, else ~/.local/state/klique-worker); "
        "one worker per state dir",
    )
    p.add_argument(
        "--gpus",
        default="auto",
        help="`auto` (nvidia-smi), a list of GPU indices `0,1,2,3` (restricts "
        "nvidia-smi's GPUs, or declares GPUs where there is no nvidia-smi), "
        "or `none` (default: auto)",
    )
    p.add_argument(
        "--executor",
        default="process",
        choices=["process", "slurm", "pbs", "lsf", "docker", "podman", "kubernetes"],
        help="how tasks run: child processes here, sbatch, qsub (PBS) or bsub "
        "(LSF) jobs, containers (docker, podman) or Kubernetes Jobs "
        "(default: process; docs/executors.md)",
    )
    p.add_argument(
        "--gpu-memory",
        type=int,
        default=None,
        metavar="MIB",
        help="memory of each declared GPU in MiB, where nvidia-smi cannot say "
        "(sets the memory cap of fractions)",
    )
    slurm = p.add_argument_group("slurm executor")
    slurm.add_argument(
        "--partition",
        default=None,
        help="the Slurm partition of the pool's jobs when the pool's settings name "
        "none (default: Slurm's default)",
    )
    slurm.add_argument(
        "--slurm-conf", default=None, help="slurm.conf for sbatch/squeue/scancel (sets SLURM_CONF)"
    )
    slurm.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra sbatch argument, e.g. --sbatch-arg=--account=ml (repeatable)",
    )
    batch = p.add_argument_group("pbs and lsf executors")
    batch.add_argument(
        "--queue",
        default=None,
        help="the PBS or LSF queue of the pool's jobs when the pool's settings "
        "name none (default: the scheduler's default queue)",
    )
    batch.add_argument(
        "--batch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra qsub/bsub argument, e.g. --batch-arg=-P --batch-arg=ml (repeatable)",
    )
    ctr = p.add_argument_group("docker, podman and kubernetes executors")
    ctr.add_argument("--image", default=None, help="the image of tasks whose lease names none")
    ctr.add_argument(
        "--container-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `run` argument for docker/podman, e.g. "
        "--container-arg=--network=none (repeatable)",
    )
    ctr.add_argument(
        "--container-memory-per-gpu",
        type=int,
        default=None,
        metavar="MIB",
        help="host memory of one GPU's worth, in MiB: a fraction gets --memory = "
        "fraction x this (default: host memory / GPUs)",
    )
    k8s = p.add_argument_group("kubernetes executor")
    k8s.add_argument(
        "--namespace",
        default="default",
        help="namespace of the Jobs when the pool's settings name none",
    )
    k8s.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)",
    )
    k8s.add_argument(
        "--k8s-fraction-resource",
        default=None,
        metavar="NAME",
        help="resource a fraction asks for, e.g. nvidia.com/mig-1g.10gb or "
        "nvidia.com/gpu.shared (default: a whole nvidia.com/gpu)",
    )
    k8s.add_argument(
        "--k8s-fraction-units",
        type=int,
        default=1,
        metavar="N",
        help="units of --k8s-fraction-resource in one GPU (time-slicing replicas; 1 for MIG)",
    )
    k8s.add_argument("--service-account", default=None, help="service account of the pods")
    p.add_argument(
        "--cpu-tasks",
        type=int,
        default=None,
        metavar="N",
        help="CPU-only (0-GPU) tasks run at once beside the GPU tasks; they start "
        "even when every GPU is busy; 0: none (default: half the CPUs, at "
        "least 1)",
    )
    p.add_argument(
        "--venv", default=None, help="virtual env the tasks run in (default: the worker's own)"
    )
    p.add_argument(
        "--workdir", default=None, help="working directory of the tasks (default: the worker's)"
    )
    p.add_argument(
        "--grace",
        type=duration,
        default=30.0,
        help="time between SIGTERM and SIGKILL when a task is stopped, unless the "
        "lease or the stop instruction says otherwise (default: 30s)",
    )
    p.add_argument(
        "--ca-file",
        default=None,
        help="PEM file of the CA that signed the control plane's certificate",
    )
    p.add_argument(
        "--retry-max",
        type=duration,
        default=30.0,
        help="longest wait between retries while the control plane is down (default: 30s)",
    )
    p.add_argument(
        "--log-interval",
        type=duration,
        default=2.0,
        help="how often running tasks' logs are uploaded (default: 2s)",
    )
    p.add_argument(
        "--log-retention",
        type=duration,
        default=7.0 * DAY_S,
        help="how long logs of ended tasks are kept in the state dir (default: 7d)",
    )
    p.add_argument(
        "--session-apps",
        default=None,
        metavar="LIST",
        help="the session apps this worker says it can start, comma-separated ("
        + ", ".join(session_apps.PROGRAMS)
        + "), or 'none' (default: those whose program the tasks find on their PATH at start: "
        + ", ".join(f"{a}: {p}" for a, p in session_apps.PROGRAMS.items())
        + "; a container or batch executor, whose tasks run elsewhere, advertises none "
        "unless told)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--drain",
        action="store_true",
        help="on SIGTERM/SIGINT, stop every task (SIGTERM, grace, SIGKILL), hand "
        "them back to the control plane and deregister; without it a stop "
        "leaves the tasks running for the next start to take back",
    )
    return p


def _apps(text: str | None) -> list[str] | None | str:
    """``--session-apps``: None (detect), the apps named, or an error's text."""
    if text is None:
        return None
    if text.strip() == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in session_apps.PROGRAMS]
    if unknown:
        return (
            f"unknown app {', '.join(unknown)}; the apps are "
            f"{', '.join(session_apps.PROGRAMS)} (or 'none')"
        )
    return sorted(set(names))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    apps = _apps(args.session_apps)
    if isinstance(apps, str):
        print(f"klique-worker: --session-apps: {apps}", file=sys.stderr)
        return 2
    if args.cpu_tasks is not None and args.cpu_tasks < 0:
        print(
            f"klique-worker: --cpu-tasks must be 0 or more, not {args.cpu_tasks}", file=sys.stderr
        )
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log = logging.getLogger(__name__)
    from klique_util.filemodes import private_umask

    private_umask()  # the state dir, records and logs: 0600 / 0700 (tasks keep the original)

    from workers.client import ControlPlaneClient
    from workers.daemon import WorkerConfig, WorkerDaemon, default_cpu_tasks
    from workers.executors import make_executor
    from workers.executors.k8s_manifest import K8sSettings
    from workers.gpus import Gpu, GpuDiscoveryError, discover
    from workers.errors import SpawnsUnsettled
    from workers.state import StateDir, StateDirBusy, default_state_dir

    state_dir = args.state_dir or str(default_state_dir())
    try:
        gpus, source = discover(args.gpus)
        if args.gpu_memory:
            gpus = [
                g if g.memory_mb is not None else Gpu(g.index, g.uuid, args.gpu_memory, g.model)
                for g in gpus
            ]
        try:
            client = ControlPlaneClient(args.url, args.token_file, args.ca_file)
        except OSError as exc:
            raise ConfigError(
                f"cannot read the token file {args.token_file}: {exc.strerror or exc}"
            ) from None
        state = StateDir(state_dir)
        state.lock()
        executor = make_executor(
            args.executor,
            state_dir=state.root,
            venv=args.venv,
            workdir=args.workdir,
            gpus=gpus,
            partition=args.partition,
            slurm_conf=args.slurm_conf,
            sbatch_args=args.sbatch_arg,
            queue=args.queue,
            batch_args=args.batch_arg,
            image=args.image,
            container_args=args.container_arg,
            memory_per_gpu_mb=args.container_memory_per_gpu,
            kubeconfig=args.kubeconfig,
            settings=K8sSettings(
                namespace=args.namespace,
                image=args.image,
                fraction_resource=args.k8s_fraction_resource,
                fraction_units_per_gpu=args.k8s_fraction_units,
                service_account=args.service_account,
            ),
        )
        executor.settle()  # the earlier run's starts are done (or marked): workers/daemon.py
    except (GpuDiscoveryError, StateDirBusy, SpawnsUnsettled, ValueError, OSError) as exc:
        print(f"klique-worker: {exc}", file=sys.stderr)
        return 2
    log.info("GPUs: %s, %s", [g.index for g in gpus], source)
    if os.stat(args.token_file).st_mode & 0o077:
        log.warning("the token file %s is readable by other users; chmod 600 it", args.token_file)
    cfg = WorkerConfig(
        url=",".join(args.url),
        pool=args.pool,
        token_file=args.token_file,
        state_dir=str(state.root),
        executor=args.executor,
        grace_s=args.grace,
        retry_max_s=args.retry_max,
        log_interval_s=args.log_interval,
        log_retention_s=args.log_retention,
        drain=args.drain,
        cpu_tasks=(default_cpu_tasks() if args.cpu_tasks is None else args.cpu_tasks),
        session_apps=apps,
    )

    async def run() -> str | None:
        daemon = WorkerDaemon(cfg, gpus, executor, state, client)
        await daemon.run()
        return daemon.failure

    try:
        failure = asyncio.run(run())
    finally:
        state.unlock()
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
