"""Capacity providers: where the autoscaler gets nodes from, behind one small interface.

    Provider.launch(pool, gpus, spot) -> Node      raises CapacityUnavailable
    Provider.terminate(node)
    Provider.list(pool) -> list[Node]

A node is a machine (a VM, or here a process) running one ``klique-worker`` for the pool.
``Node.running`` is what the provider can tell about the tasks its worker holds (task id ->
milli-GPUs), or None when it cannot: the loop then relies on the control plane alone.

Built in: ``local``, which starts real ``klique-worker`` processes on this machine, each with
fake GPU indices (``--gpus 0,1,...``), so the whole loop runs for real in tests and demos.
Its configuration (``--provider-config FILE``, YAML or JSON):

    root: /var/tmp/klique-autoscaler   # one state dir per node below it
    url: http://127.0.0.1:8080         # the control plane the workers use (default: --url)
    token_file: worker.token           # a worker token of the pool (mode 0600)
    spot_capacity: 0                   # GPUs spot may give at once (0: spot always refused)
    on_demand_capacity: 64             # GPUs on-demand may give at once (default: no limit)
    worker_args: [--grace, 5s]         # more klique-worker flags

A cloud provider (EC2, GCE, Azure) implements the same three methods: launch creates an
instance whose user-data starts the worker (the Ansible role of workers/ansible/ can be the
image's provisioning), raising CapacityUnavailable for InsufficientInstanceCapacity,
SpotMaxPriceTooLow and the like; list filters instances by a ``klique-pool`` tag.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

from klique_util.files import write_atomic
from klique_util.units import gpus_to_milli
from workers.errors import CapacityUnavailable


@dataclass
class Node:
    id: str
    pool: str
    gpus: int
    spot: bool
    launched_at: float  # wall clock (time.time())
    up: bool = True  # its worker runs
    gone: bool = False  # the machine is gone (crashed, spot reclaimed)
    worker_id: str | None = None  # the worker's id at the control plane, once known
    running: dict[str, int] | None = None  # task -> milli-GPUs, if the provider can tell
    meta: dict = field(default_factory=dict)


class Provider(ABC):
    name: str

    @abstractmethod
    def launch(self, pool: str, gpus: int, spot: bool) -> Node:
        """Starts a node of `gpus` GPUs for `pool` (spot or on-demand); raises
        CapacityUnavailable when the provider cannot."""

    @abstractmethod
    def terminate(self, node: Node) -> None:
        """Stops the node and everything on it. Idempotent."""

    @abstractmethod
    def list(self, pool: str) -> list[Node]:
        """The pool's nodes this provider started and has not terminated."""


# the local provider ------------------------------------------------------------------------
def _proc_start(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = data[data.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X", "x"):
        return None
    return int(rest[19])


class LocalProvider(Provider):
    """Nodes are ``klique-worker`` processes on this machine, one state dir each under
    ``root``; a node's metadata is ``root/nodes/<id>.json``. Terminating a node stops its
    worker and kills its tasks (a VM going away takes its processes with it)."""

    name = "local"

    def __init__(
        self,
        root: str | Path,
        url: str,
        token_file: str | Path,
        spot_capacity: int | None = None,
        on_demand_capacity: int | None = None,
        worker_args: list[str] | None = None,
        python: str | None = None,
    ):
        self.root = Path(root).expanduser().resolve()
        self.url, self.token_file = url, str(Path(token_file).expanduser().resolve())
        self.spot_capacity, self.on_demand_capacity = spot_capacity, on_demand_capacity
        self.worker_args = list(worker_args or [])
        self.python = python or sys.executable
        self._children: dict[int, subprocess.Popen] = {}  # reaped, so no zombie lingers
        (self.root / "nodes").mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_config(
        cls, config: dict, url: str | None = None, token_file: str | None = None
    ) -> "LocalProvider":
        known = {
            "root",
            "url",
            "token_file",
            "spot_capacity",
            "on_demand_capacity",
            "worker_args",
            "python",
        }
        unknown = set(config) - known
        if unknown:
            raise ValueError(
                f"local provider: unknown setting(s) {sorted(unknown)}; known: "
                f"{', '.join(sorted(known))}"
            )
        url = config.get("url") or url
        token_file = config.get("token_file") or token_file
        if not url or not token_file:
            raise ValueError(
                "local provider: give the control plane's url and a worker "
                "token_file (in the provider config, or --url/--token-file)"
            )
        root = config.get("root") or os.path.join(
            os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"),
            "klique-autoscaler",
        )
        return cls(
            root,
            url,
            token_file,
            config.get("spot_capacity"),
            config.get("on_demand_capacity"),
            config.get("worker_args"),
            config.get("python"),
        )

    def _meta_path(self, node_id: str) -> Path:
        return self.root / "nodes" / f"{node_id}.json"

    def _in_use(self, pool: str, spot: bool) -> int:
        return sum(n.gpus for n in self.list(pool) if n.spot == spot and not n.gone)

    def launch(self, pool: str, gpus: int, spot: bool) -> Node:
        cap = self.spot_capacity if spot else self.on_demand_capacity
        if cap is not None and self._in_use(pool, spot) + gpus > cap:
            kind = "spot" if spot else "on-demand"
            raise CapacityUnavailable(
                f"local provider: no {kind} capacity for {gpus} GPU(s) ({kind}_capacity {cap})"
            )
        return self.start_worker(
            f"n-{pool}-{'s' if spot else 'o'}-{secrets.token_hex(3)}", pool, gpus, spot
        )

    def start_worker(
        self,
        node_id: str,
        pool: str,
        gpus: int,
        spot: bool,
        worker_id: str | None = None,
        meta: dict | None = None,
    ) -> Node:
        """Starts the worker of node ``node_id``: what a cloud node's start-up does, on this
        machine (a cloud provider's emulation mode uses it for the instances the emulator
        reports). ``worker_id`` is written to the state dir first, as a cloud node's
        user-data does, so the control plane knows the worker by its node."""
        state_dir = self.root / node_id
        state_dir.mkdir(parents=True)
        if worker_id:
            write_atomic(state_dir / "worker-id", worker_id + "\n")
        log = open(state_dir / "worker.log", "ab")
        # --drain: a node is released for good, so its worker hands back what it runs and
        # deregisters on the SIGTERM of terminate(), rather than being declared lost
        argv = [
            self.python,
            "-m",
            "workers.cli",
            "--url",
            self.url,
            "--pool",
            pool,
            "--token-file",
            self.token_file,
            "--state-dir",
            str(state_dir),
            "--gpus",
            ",".join(str(i) for i in range(gpus)) or "none",
            "--drain",
            *self.worker_args,
        ]
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            log.close()
        node = Node(
            node_id,
            pool,
            gpus,
            spot,
            time.time(),
            up=True,
            meta={
                **(meta or {}),
                "pid": proc.pid,
                "start": _proc_start(proc.pid),
                "state_dir": str(state_dir),
            },
        )
        write_atomic(
            self._meta_path(node_id),
            json.dumps(
                {k: v for k, v in asdict(node).items() if k not in ("up", "gone", "running")}
            ),
        )
        self._children[proc.pid] = proc
        return node

    def _alive(self, meta: dict) -> bool:
        pid = meta.get("pid")
        if pid is None:
            return False
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        return _proc_start(pid) == meta.get("start")

    def _records(self, state_dir: Path) -> dict[str, int]:
        running: dict[str, int] = {}
        for path in (state_dir / "tasks").glob("*.json"):
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if rec.get("fenced"):
                continue
            running[str(rec["task"])] = int(
                rec.get("milli") or gpus_to_milli(rec.get("lease", {}).get("gpus", 1))
            )
        return running

    def list(self, pool: str) -> list[Node]:
        nodes = []
        for path in sorted((self.root / "nodes").glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if data.get("pool") != pool:
                continue
            node = Node(**{k: v for k, v in data.items() if k not in ("up", "gone", "running")})
            state_dir = Path(node.meta["state_dir"])
            alive = self._alive(node.meta)
            wid = state_dir / "worker-id"
            node.worker_id = wid.read_text().strip() if wid.exists() else None
            node.up = alive and node.worker_id is not None
            node.gone = not alive
            node.running = self._records(state_dir)
            nodes.append(node)
        return nodes

    def terminate(self, node: Node) -> None:
        meta = node.meta
        pid = meta.get("pid")
        if pid and self._alive(meta):
            try:
                os.killpg(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self._alive(meta):
                time.sleep(0.05)
            if self._alive(meta):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        # the machine goes away: whatever its worker left running goes with it
        for path in (Path(meta.get("state_dir", "/nonexistent")) / "tasks").glob("*.json"):
            try:
                handle = json.loads(path.read_text()).get("handle") or {}
                if handle.get("pgid"):
                    os.killpg(int(handle["pgid"]), signal.SIGKILL)
            except (OSError, ValueError, ProcessLookupError):
                pass
        child = self._children.pop(pid, None) if pid is not None else None
        if child is not None:
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._meta_path(node.id).unlink(missing_ok=True)
