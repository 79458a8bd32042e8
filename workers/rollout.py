"""Rolls the worker out with Ansible: ``workers/ansible/playbook.yml`` through ansible-runner,
with per-host progress as the events arrive and a summary (``kliqued workers rollout``).

What the hosts install: by default a wheel of this source tree, built on the controller
(``pip wheel --no-deps``) and copied to each host; or a given wheel/sdist (``package``); or a
pip requirement (``pip_spec``: ``klique==0.1.0``, a URL) from an index. The worker token goes
to the hosts from a file on the controller (``token_file``: never in the extra vars).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from klique_util.leader import split_urls
from workers.errors import RolloutError

ANSIBLE_DIR = Path(__file__).resolve().with_name("ansible")
PLAYBOOK = ANSIBLE_DIR / "playbook.yml"
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def source_tree() -> Path | None:
    """This package's source tree (a clone, an editable install), or None when installed from
    a wheel."""
    pyproject = SOURCE_ROOT / "pyproject.toml"
    if pyproject.is_file() and 'name = "klique"' in pyproject.read_text(encoding="utf-8"):
        return SOURCE_ROOT
    return None


class _building:
    """One wheel build of a source tree at a time on this machine: setuptools builds in the
    tree's own ``build/`` directory, so two rollouts started at once from one checkout (two
    operators, two pools) failed with ``File exists: build/bdist...``. The lock is a file in
    the temporary directory named by the tree's path, never in the tree."""

    def __init__(self, root: Path) -> None:
        digest = hashlib.sha256(str(root).encode()).hexdigest()[:16]
        self.path = Path(tempfile.gettempdir()) / f"klique-wheel-{digest}.lock"
        self._fh: int | None = None

    def __enter__(self) -> None:
        self._fh = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fh, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            os.close(self._fh)
            self._fh = None


def build_wheel(dest: Path) -> Path:
    """A wheel of the source tree, built into ``dest``."""
    root = source_tree()
    if root is None:
        raise RolloutError(
            "klique is not installed from a source tree here: give --package "
            "FILE (a wheel or sdist) or --pip-spec 'klique==VERSION'"
        )
    dest.mkdir(parents=True, exist_ok=True)
    # a fixed date in the archive: the same sources give the same bytes, so a second rollout
    # copies and reinstalls nothing
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
    with _building(root):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--quiet",
                "-w",
                str(dest),
                str(root),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
    wheels = sorted(dest.glob("klique-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RolloutError(f"building the wheel failed:\n{proc.stderr.strip()}")
    return wheels[-1]


@dataclass
class HostSummary:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0

    def line(self) -> str:
        return (
            f"ok={self.ok} changed={self.changed} failed={self.failed} "
            f"unreachable={self.unreachable} skipped={self.skipped}"
        )


@dataclass
class RolloutResult:
    rc: int
    status: str
    hosts: dict[str, HostSummary] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.rc == 0
            and bool(self.hosts)
            and not any(h.failed or h.unreachable for h in self.hosts.values())
        )

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts.values())


def failure_text(res: dict, limit: int = 20) -> list[str]:
    """Why a task failed, from its result: the module's ``msg``, then what the command
    printed (``stderr``, else ``stdout``: a ``command`` task's msg is only "non-zero return
    code"), then the failed items of a loop; the last ``limit`` lines of each."""
    lines: list[str] = []

    def add(text: object) -> None:
        text = str(text or "").strip()
        if text and text not in lines:
            lines.extend(text.splitlines()[-limit:])

    add(res.get("msg"))
    if res.get("rc") not in (None, 0) or res.get("stderr") or res.get("module_stderr"):
        add(res.get("stderr") or res.get("module_stderr") or res.get("stdout"))
    for item in res.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            add(f"item {item.get('item')!r}: {item.get('msg') or ''}".rstrip(": "))
            add(item.get("stderr"))
    return lines or ["(ansible gave no reason)"]


def _progress(out: Callable[[str], None], verbose: bool):
    """ansible-runner's event handler: one line per host and task as results arrive."""
    width = [12]

    def say(host: str, task: str, what: str) -> None:
        width[0] = max(width[0], len(host))
        out(f"{host.ljust(width[0])}  {what.ljust(8)} {task}")

    def handler(event: dict) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host, task = data.get("host") or "", data.get("task") or ""
        res = data.get("res") or {}
        if kind == "runner_on_ok":
            say(host, task, "changed" if res.get("changed") else "ok")
        elif kind == "runner_on_failed":
            first, *rest = failure_text(res)
            ignored = " (ignored)" if data.get("ignore_errors") else ""
            say(host, f"{task}: {first[:500]}{ignored}", "FAILED")
            for line in rest:  # the reason, indented under the host's line
                out(f"{' ' * (width[0] + 11)}{line[:500]}")
        elif kind == "runner_on_unreachable":
            say(host, f"{task}: {str(res.get('msg', '')).strip()[:500]}", "UNREACH")
        elif kind == "runner_retry":
            say(host, f"{task} (retry {res.get('attempts')}/{res.get('retries')})", "waiting")
        elif kind == "runner_on_skipped" and verbose:
            say(host, task, "skipped")
        return True

    return handler


def role_vars(url: str | Iterable[str], pool: str, token_file: Path) -> dict:
    """The role's required variables. ``klique_worker_url`` carries every daemon's URL, comma-
    separated (``split_urls``: ``--url a --url b`` or ``--url a,b``), and the role gives the
    workers all of them, so they follow the leader (docs/ha.md)."""
    urls = split_urls(url)
    if not urls:
        raise RolloutError("no control-plane URL given (--url or KLIQUE_URL)")
    return {
        "klique_worker_url": ",".join(urls),
        "klique_worker_pool": pool,
        "klique_worker_token_src": str(token_file),
    }


def rollout(
    inventory: str | Path,
    pool: str,
    url: str | Iterable[str],
    token_file: str | Path,
    *,
    prefix: str | None = None,
    check: bool = False,
    package: str | Path | None = None,
    pip_spec: str | None = None,
    admin_token: str | None = None,
    extravars: dict | None = None,
    limit: str | None = None,
    verbose: bool = False,
    out: Callable[[str], None] = print,
) -> RolloutResult:
    try:
        import ansible_runner
    except ImportError:
        raise RolloutError("ansible-runner is not installed: pip install 'klique[ops]'") from None
    inventory = Path(inventory).resolve()
    if not inventory.exists():
        raise RolloutError(f"the inventory {inventory} does not exist")
    token_file = Path(token_file).expanduser().resolve()
    if not token_file.is_file():
        raise RolloutError(
            f"the worker token file {token_file} does not exist (kliqued token "
            f"create --worker --pool {pool} > FILE)"
        )
    work = Path(tempfile.mkdtemp(prefix="klique-rollout-"))  # mode 0700
    try:
        ev = role_vars(url, pool, token_file)
        if prefix:
            ev["klique_worker_prefix"] = str(Path(prefix).resolve())
        if pip_spec:
            ev["klique_worker_pip_spec"] = pip_spec
        else:
            pkg = Path(package).resolve() if package else build_wheel(work / "dist")
            # the same path on every run, so an unchanged build copies nothing
            stable = Path(tempfile.gettempdir()) / "klique-rollout-dist" / pkg.name
            stable.parent.mkdir(parents=True, exist_ok=True)
            if not stable.exists() or stable.read_bytes() != pkg.read_bytes():
                shutil.copyfile(pkg, stable)
            ev["klique_worker_package"] = str(stable)
        if admin_token:
            ev["klique_worker_admin_token"] = admin_token
        ev.update(extravars or {})
        bindir = str(Path(sys.executable).parent)
        envvars = {
            "PATH": bindir + os.pathsep + os.environ.get("PATH", os.defpath),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_PYTHON_INTERPRETER": os.environ.get(
                "ANSIBLE_PYTHON_INTERPRETER", "auto_silent"
            ),
            "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles"),
        }
        r = ansible_runner.run(
            private_data_dir=str(work),
            playbook=str(PLAYBOOK),
            inventory=str(inventory),
            extravars=ev,
            envvars=envvars,
            cmdline="--check --diff" if check else None,
            limit=limit,
            quiet=True,
            event_handler=_progress(out, verbose),
            project_dir=str(ANSIBLE_DIR),
        )
        stats = r.stats or {}
        hosts: dict[str, HostSummary] = {}
        for key, attr in (
            ("ok", "ok"),
            ("changed", "changed"),
            ("failures", "failed"),
            ("dark", "unreachable"),
            ("skipped", "skipped"),
        ):
            for host, n in (stats.get(key) or {}).items():
                setattr(hosts.setdefault(host, HostSummary()), attr, n)
        result = RolloutResult(r.rc, r.status, hosts)
        if not hosts and r.rc != 0:
            tail = "".join(r.stdout.readlines()[-15:]) if r.stdout else ""
            result.failures.append(f"ansible-playbook exited {r.rc} ({r.status}):\n{tail}")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
