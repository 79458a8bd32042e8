"""The Ansible rollout for real: ansible-runner runs workers/ansible/playbook.yml against
localhost (connection local) into a temporary prefix; the worker is installed in a virtual
env there from a wheel of this tree, configured, started with a pid file (this machine has no
systemd: PID 1 is not an init system, so the systemd steps are skipped by their condition),
registers, runs a task; a second run, through `kliqued workers rollout`, changes nothing.

The control plane is a real `kliqued serve` (tests/daemon/server.py) with the daemon tests'
small estate; the role's registration check asks its `GET /v1/workers`.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "ansible_runner",
    reason="ansible-runner is not installed: pip install -e '.[ops]' (make test does)",
)

from kliqued.sdk import Client  # noqa: E402
from tests.harness.daemon import ADMIN, SMALL_ESTATE, Server  # noqa: E402
from tests.harness.wait import wait_for  # noqa: E402
from workers.rollout import ANSIBLE_DIR, build_wheel, rollout  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
POOL = "pool-1"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rollout")
    prefix = tmp / "prefix"
    srv = Server(tmp, estate=SMALL_ESTATE).start()
    try:
        api = Client(srv.url, ADMIN)
        token = tmp / "worker.token"
        token.write_text(api.create_token(worker=True, pool=POOL)["token"] + "\n")
        token.chmod(0o600)
        inventory = tmp / "hosts.ini"
        inventory.write_text(
            f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
        )
        wheel = build_wheel(tmp / "dist")
        extra = {
            "klique_worker_python": sys.executable,
            "klique_worker_gpus": "0,1",
            "klique_worker_systemd_dir": str(tmp / "systemd"),
            "klique_worker_args": "--grace 1s --log-interval 0.2s --retry-max 0.5s",
        }
        lines: list[str] = []
        t0 = time.monotonic()
        first = rollout(
            inventory,
            POOL,
            srv.url,
            token,
            prefix=str(prefix),
            package=wheel,
            extravars=extra,
            out=lines.append,
        )
        first_s = time.monotonic() - t0
        yield {
            "srv": srv,
            "api": api,
            "token": token,
            "inventory": inventory,
            "wheel": wheel,
            "prefix": prefix,
            "extra": extra,
            "first": first,
            "lines": lines,
            "first_s": first_s,
            "tmp": tmp,
        }
    finally:
        # the worker and the daemon end with the module even when a rollout failed or
        # the worker's stop timed out (each step its own try: no process outlives it)
        try:
            ctl = prefix / "bin" / "klique-workerctl"
            if ctl.exists():
                try:
                    subprocess.run([str(ctl), "stop"], capture_output=True, timeout=60)
                except subprocess.TimeoutExpired:
                    pass  # killed by its pid file below
            pid_file = prefix / "run" / "klique-worker.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
                except (ValueError, ProcessLookupError):
                    pass
        finally:
            srv.stop()


def test_first_run_installs_configures_starts_and_registers(site):
    first, prefix, srv, api = site["first"], site["prefix"], site["srv"], site["api"]
    assert first.ok, "\n".join(site["lines"])
    assert list(first.hosts) == ["localhost"] and first.changed > 0
    # how long it took is a benchmark figure (docs/benchmarks.md), not a test
    out = "\n".join(site["lines"])
    assert "changed  Install the worker" in out
    assert "skipped" not in out  # skipped tasks are not printed
    # installed into the prefix's virtual env
    worker = prefix / "venv" / "bin" / "klique-worker"
    assert worker.exists()
    assert subprocess.run([str(worker), "--help"], capture_output=True).returncode == 0
    # configuration and token
    env = (prefix / "etc" / "worker.env").read_text()
    assert f"KLIQUE_WORKER_POOL={POOL}" in env and f"KLIQUE_WORKER_URL={srv.url}" in env
    assert "KLIQUE_WORKER_GPUS=0,1" in env and "Ansible managed" in env
    tok = prefix / "etc" / "worker.token"
    assert stat.S_IMODE(tok.stat().st_mode) == 0o600
    assert tok.read_text().strip().startswith("kq_")
    # no systemd here: no unit written, started with a pid file
    assert not (site["tmp"] / "systemd").exists()
    pid = int((prefix / "run" / "klique-worker.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert str(worker).encode() in cmdline[:2]
    # registered with the control plane, and it runs work
    wid = (prefix / "state" / "worker-id").read_text().strip()
    workers = {w["id"]: w for w in api._call("GET", "/workers")["workers"]}
    assert workers[wid]["pool"] == POOL and workers[wid]["gpus"] == 2
    task = api.submit("team-a/one", ["sh", "-c", "echo rolled out"], user="alice")
    done = wait_for(
        lambda: (t := api.task(task["id"]))["state"] == "ended" and t,
        30,
        "the task's end",
        every=0.2,
    )
    assert done["end_reason"] == "finished" and done.get("worker") == wid, done


def test_second_run_through_the_cli_changes_nothing(site):
    extra = [a for k, v in site["extra"].items() for a in ("-e", f"{k}={v}")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KLIQUE_")}
    env["KLIQUE_CONFIG"] = str(site["tmp"] / "no-config.yaml")
    pid_before = (site["prefix"] / "run" / "klique-worker.pid").read_text()
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kliqued.cli",
            "workers",
            "rollout",
            "--inventory",
            str(site["inventory"]),
            "--pool",
            POOL,
            "--url",
            site["srv"].url,
            "--token-file",
            str(site["token"]),
            "--prefix",
            str(site["prefix"]),
            "--package",
            str(site["wheel"]),
            *extra,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "localhost: ok=" in proc.stdout and " changed=0 " in proc.stdout, proc.stdout
    assert "failed=0" in proc.stdout and "1 host(s) done, 0 change(s)" in proc.stdout
    assert "ok       Start the worker without systemd (pid file)" in proc.stdout
    assert (site["prefix"] / "run" / "klique-worker.pid").read_text() == pid_before
    assert took < 60


def test_the_systemd_unit_renders(site):
    """Rendered from the role's template with the same variables (no systemd runs here)."""
    import jinja2

    tpl = jinja2.Template(
        (
            ANSIBLE_DIR / "roles" / "klique_worker" / "templates" / "klique-worker.service.j2"
        ).read_text()
    )
    unit = tpl.render(
        ansible_managed="Ansible managed",
        klique_worker_pool=POOL,
        klique_worker_prefix="/opt/klique",
        klique_worker_user="root",
        klique_worker_config_dir="/opt/klique/etc",
        klique_worker_venv="/opt/klique/venv",
    )
    assert "ExecStart=/opt/klique/venv/bin/klique-worker --url ${KLIQUE_WORKER_URL}" in unit
    assert "EnvironmentFile=/opt/klique/etc/worker.env" in unit
    assert "KillMode=process" in unit and "Restart=always" in unit


def test_failed_host_exits_1(site, tmp_path):
    inv = tmp_path / "bad.ini"
    inv.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    lines: list[str] = []
    res = rollout(
        inv,
        POOL,
        site["srv"].url,
        site["token"],
        prefix=str(tmp_path / "p"),
        package=site["wheel"],
        extravars={"klique_worker_python": "/nonexistent/python3"},
        out=lines.append,
    )
    assert not res.ok and res.hosts["localhost"].failed == 1
    assert any("FAILED" in line and "Virtual env" in line for line in lines), lines


def test_the_reason_of_a_failed_task_is_printed():
    """Issue 10, bug 3: a failed command's line said only "non-zero return code"."""
    from workers.rollout import failure_text

    res = {
        "msg": "non-zero return code",
        "rc": 1,
        "stdout": "",
        "stderr": "klique-worker did not start; the end of /x/klique-worker.log:\n"
        "klique-worker: --gpus [0, 1]: not a list of GPU indices",
    }
    assert failure_text(res) == [
        "non-zero return code",
        "klique-worker did not start; the end of /x/klique-worker.log:",
        "klique-worker: --gpus [0, 1]: not a list of GPU indices",
    ]
    loop = {
        "msg": "One or more items failed",
        "results": [
            {"item": "a", "failed": False},
            {"item": "b", "failed": True, "msg": "mkdir: denied"},
        ],
    }
    assert failure_text(loop) == ["One or more items failed", "item 'b': mkdir: denied"]
    assert failure_text({}) == ["(ansible gave no reason)"]


@pytest.mark.parametrize("form", ["ini", "yaml"])
def test_gpus_from_an_ini_or_yaml_inventory_change_nothing(site, form, tmp_path):
    """Issue 10, bug 3: `host klique_worker_gpus=0,1` in an INI inventory (read as a list by
    Ansible) wrote KLIQUE_WORKER_GPUS=[0, 1] and the worker did not start. Both forms give
    the flag the first run wrote from `-e klique_worker_gpus=0,1`: nothing changes."""
    if form == "ini":
        inv = tmp_path / "hosts.ini"
        inv.write_text(
            f"localhost ansible_connection=local ansible_python_interpreter="
            f"{sys.executable} klique_worker_gpus=0,1\n"
        )
    else:
        inv = tmp_path / "hosts.yml"
        inv.write_text(
            f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
            f"      ansible_python_interpreter: {sys.executable}\n"
            f"      klique_worker_gpus: [0, 1]\n"
        )
    extra = {k: v for k, v in site["extra"].items() if k != "klique_worker_gpus"}
    lines: list[str] = []
    res = rollout(
        inv,
        POOL,
        site["srv"].url,
        site["token"],
        prefix=str(site["prefix"]),
        package=site["wheel"],
        extravars=extra,
        out=lines.append,
    )
    assert res.ok and res.changed == 0, "\n".join(lines)
    assert "KLIQUE_WORKER_GPUS=0,1\n" in (site["prefix"] / "etc" / "worker.env").read_text()


def test_bad_gpus_in_an_inventory_are_refused_with_the_variable_named(site, tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter="
        f"{sys.executable} klique_worker_gpus=0;1\n"
    )
    extra = {k: v for k, v in site["extra"].items() if k != "klique_worker_gpus"}
    lines: list[str] = []
    res = rollout(
        inv,
        POOL,
        site["srv"].url,
        site["token"],
        prefix=str(site["prefix"]),
        package=site["wheel"],
        extravars=extra,
        out=lines.append,
    )
    assert not res.ok
    out = "\n".join(lines)
    assert (
        "FAILED   Check klique_worker_gpus: klique_worker_gpus must be auto, none or GPU indices"
        in out
    )
    assert "not 0;1" in out


def test_zz_a_worker_that_does_not_start_says_why(site):
    """Last in this module: it leaves the worker stopped. The failing task's line is
    followed by the worker's own error (issue 10, bug 3: no reason, even with -v)."""
    extra = dict(site["extra"], klique_worker_args="--cpu-tasks -1")
    lines: list[str] = []
    res = rollout(
        site["inventory"],
        POOL,
        site["srv"].url,
        site["token"],
        prefix=str(site["prefix"]),
        package=site["wheel"],
        extravars=extra,
        out=lines.append,
    )
    out = "\n".join(lines)
    assert not res.ok and res.hosts["localhost"].failed >= 1, out
    assert "FAILED   Restart klique-worker (pid file): non-zero return code" in out, out
    assert "klique-worker did not start" in out
    assert "klique-worker: --cpu-tasks must be 0 or more, not -1" in out
