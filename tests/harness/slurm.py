"""A real single-node Slurm for tests and benchmarks, started and stopped by pid (no systemd).

Debian's slurm-wlm and munge packages (`make test` installs them:
tests/setup/system-packages.sh) provide the daemons; this writes a throw-away
configuration with fake GPUs declared through GRES (a `File=` per GPU, symlinks to
/dev/null: `Count=` alone makes slurmd drop them), starts munged, slurmctld and slurmd,
and waits until the node is idle. ``TwoNodeSlurm``: two node entries on this machine for
multi-node jobs (issue 15). Facts behind each setting: ../shared/notes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from tests.harness.leftovers import unmarked_env
from tests.harness.wait import wait_for

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class LocalSlurm:
    """``with LocalSlurm(tmp, gpus=8) as slurm: slurm.env`` gives SLURM_CONF for commands."""

    def __init__(
        self,
        root: Path,
        gpus: int = 8,
        cpus: int = 16,
        partition: str = "gpu",
        kill_wait_s: int = 5,
    ) -> None:
        self.root = Path(root)
        self.gpus = gpus
        self.cpus = cpus
        self.partition = partition
        self.kill_wait_s = kill_wait_s
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self._pids: list[Path] = []

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "spool", "log", "dev"):
            (r / d).mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus):
            link = r / "dev" / f"gpu{i}"
            if not link.exists():
                link.symlink_to("/dev/null")
        self.conf.write_text(f"""\
ClusterName=klique-test
SlurmctldHost={self.host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={r}/log/jobcomp.txt
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={self.kill_wait_s}
MinJobAge=300
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName={self.host} CPUs={self.cpus} RealMemory=4096 Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        (r / "gres.conf").write_text(
            f"NodeName={self.host} Name=gpu File={r}/dev/gpu[0-{self.gpus - 1}]\n"
        )

    def _start_munge(self) -> None:
        run = Path("/run/munge")
        run.mkdir(parents=True, exist_ok=True)
        shutil.chown(run, "munge", "munge")
        if (run / "munged.pid").exists():
            try:
                os.kill(int((run / "munged.pid").read_text().strip()), 0)
                return  # already running (shared by every LocalSlurm on this machine)
            except (OSError, ValueError):
                pass
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
            shutil.chown(key, "munge", "munge")
        # machine-wide and meant to outlive the run: without the run's marker, so the
        # session-end check of leftovers (tests/harness/leftovers.py) does not count it
        subprocess.run(
            ["runuser", "-u", "munge", "--", _bin("munged")],
            check=True,
            capture_output=True,
            env=unmarked_env(),
        )

    def start(self, timeout_s: float = 30.0) -> "LocalSlurm":
        self._write_config()
        self._start_munge()
        env = self.env
        subprocess.run([_bin("slurmctld")], env=env, check=True, capture_output=True)
        self._pids.append(self.root / "slurmctld.pid")
        subprocess.run([_bin("slurmd")], env=env, check=True, capture_output=True)
        self._pids.append(self.root / "slurmd.pid")
        state = ""

        def idle() -> bool:
            nonlocal state
            state = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True
            ).stdout.strip()
            return state.startswith(("idle", "mixed"))

        try:
            wait_for(idle, timeout_s, "the slurm node to become idle", every=0.2)
            return self
        except AssertionError:
            logs = "\n".join(f.read_text()[-2000:] for f in (self.root / "log").glob("*.log"))
            self.stop()
            raise RuntimeError(f"slurm node did not become idle (state {state!r}):\n{logs}")

    def stop(self) -> None:
        for pidfile in reversed(self._pids):
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                wait_for(lambda: not _exists(pid), 5, f"pid {pid} to exit", every=0.1)
            except AssertionError:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._pids.clear()

    def __enter__(self) -> "LocalSlurm":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodeSlurm(LocalSlurm):
    """A Slurm of ``nodes`` node entries (``n1``, ``n2``, ...) on this one machine, each a
    ``slurmd -N nI`` on its own port with its own fake GRES GPUs (``gpus`` each), so that
    ``sbatch --nodes 2`` gets two nodes and ``srun`` runs one step task on each (issue 15).
    What makes steps work here: a distinct GRES ``File=`` per node and ``MpiDefault=none``;
    the controller gets a port of its own (another test Slurm may run beside it)."""

    def __init__(self, root: Path, gpus: int = 2, nodes: int = 2, **kw: Any) -> None:
        super().__init__(root, gpus=gpus, **kw)
        self.nodes = [f"n{i + 1}" for i in range(nodes)]

    def _write_config(self) -> None:
        r = self.root
        for d in ("state", "log", "dev", *(f"spool/{n}" for n in self.nodes)):
            (r / d).mkdir(parents=True, exist_ok=True)
        for n in self.nodes:
            for i in range(self.gpus):
                link = r / "dev" / f"{n}-gpu{i}"
                if not link.exists():
                    link.symlink_to("/dev/null")
        entries = "".join(
            f"NodeName={n} NodeHostname=localhost Port={_free_port()} CPUs={self.cpus} "
            f"RealMemory=2048 Gres=gpu:{self.gpus} State=UNKNOWN\n"
            for n in self.nodes
        )
        self.conf.write_text(f"""\
ClusterName=klique-gang
SlurmctldHost={self.host}
SlurmctldPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={self.kill_wait_s}
MinJobAge=300
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
{entries}PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        (r / "gres.conf").write_text(
            "".join(
                f"NodeName={n} Name=gpu File={r}/dev/{n}-gpu[0-{self.gpus - 1}]\n"
                for n in self.nodes
            )
        )

    def start(self, timeout_s: float = 30.0) -> "TwoNodeSlurm":
        self._write_config()
        self._start_munge()
        env = self.env
        subprocess.run([_bin("slurmctld")], env=env, check=True, capture_output=True)
        self._pids.append(self.root / "slurmctld.pid")
        for n in self.nodes:
            subprocess.run([_bin("slurmd"), "-N", n], env=env, check=True, capture_output=True)
            self._pids.append(self.root / f"slurmd-{n}.pid")

        def idle() -> bool:
            states = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True
            ).stdout.split()
            return len(states) == len(self.nodes) and all(
                s.startswith(("idle", "mixed")) for s in states
            )

        try:
            wait_for(idle, timeout_s, "the slurm nodes to become idle", every=0.2)
            return self
        except AssertionError:
            logs = "\n".join(f.read_text()[-2000:] for f in (self.root / "log").glob("*.log"))
            self.stop()
            raise RuntimeError(f"slurm nodes did not become idle:\n{logs}")
