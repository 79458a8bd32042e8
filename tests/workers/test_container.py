"""The container executors (docker, podman): the command lines they build (always), and real
containers run by Podman when it is installed (`make test` installs podman, runc and
busybox-static; the image is a busybox root filesystem imported with `podman import`, since
images cannot be pulled here). Podman's settings on these machines: ../shared/notes."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.wait import wait_for_async, wait_for_text
from tests.workers.conftest import WorkerProcess
from tests.workers.protocol_peer import ProtocolPeer
from workers import checkpoints, outputs
from workers.executors.base import Exited, StartError
from workers.executors.container import (
    ContainerExecutor,
    ContainerHandle,
    container_name,
    run_command,
)
from workers.gpus import Gpu

REAL_GPUS = [Gpu(i, f"GPU-{i:08x}", 81920) for i in range(4)]
FAKE_GPUS = [Gpu(i, f"declared-{i}", None) for i in range(4)]
IMAGE = "localhost/klique-busybox:test"
PODMAN_ARGS = [
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
    "--network=none",
]


def lease(task="t-1", command=("python", "train.py"), gpus=1.0, **extra) -> dict:
    return {
        "task": task,
        "epoch": 3,
        "command": list(command),
        "gpus": gpus,
        "grace_s": 5,
        "user": "alice",
        "project": "p",
        "resource": "team/standard",
        "env": {"SECRET": "s3cret"},
        **extra,
    }


# command lines (always) ----------------------------------------------------------------------
def test_docker_command_line_with_real_gpus(tmp_path):
    ex = ContainerExecutor(tmp_path, runtime="docker", image="pytorch:24", gpus=REAL_GPUS)
    cmd, env = ex.command_for(lease(gpus=2), [0, 1])
    assert cmd[:10] == [
        "docker",
        "run",
        "--rm",
        "--name",
        "klique-t-1-3",
        "--label",
        "klique.task=t-1",
        "--label",
        "klique.epoch=3",
        "--gpus",
    ]
    assert cmd[10] == '"device=0,1"'  # the quotes are docker's csv syntax
    assert "--memory" not in cmd  # whole GPUs: no cap
    assert cmd[-3:] == ["pytorch:24", "python", "train.py"]
    names = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-e"]
    assert names == sorted(
        [
            "SECRET",
            "KLIQUE_TASK_ID",
            "KLIQUE_EPOCH",
            "KLIQUE_GPUS",
            "KLIQUE_USER",
            "KLIQUE_PROJECT",
            "KLIQUE_RESOURCE",
        ]
    )
    assert "s3cret" not in " ".join(cmd)  # values only in the client's environment
    assert env["SECRET"] == "s3cret" and env["KLIQUE_EPOCH"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in names  # --gpus maps the devices


def test_podman_uses_cdi_devices_and_fractions_get_a_memory_cap(tmp_path):
    ex = ContainerExecutor(
        tmp_path,
        runtime="podman",
        image="img",
        gpus=REAL_GPUS,
        memory_per_gpu_mb=65536,
        container_args=["--network=none"],
    )
    cmd, env = ex.command_for(lease(gpus=2), [2, 3])
    assert cmd[0] == "podman"
    assert cmd[cmd.index("--device") : cmd.index("--device") + 4] == [
        "--device",
        "nvidia.com/gpu=2",
        "--device",
        "nvidia.com/gpu=3",
    ]
    assert "--gpus" not in cmd
    assert cmd[-4:] == ["--network=none", "img", "python", "train.py"]
    cmd, env = ex.command_for(lease(gpus=0.25), [1])
    assert cmd[cmd.index("--memory") + 1] == "16384m"
    assert env["KLIQUE_GPU_MEMORY_MB"] == "20480"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["KLIQUE_GPU_MEMORY_FRACTION"] == "0.25"
    docker = ContainerExecutor(
        tmp_path, runtime="docker", image="img", gpus=REAL_GPUS, memory_per_gpu_mb=65536
    )
    cmd, _ = docker.command_for(lease(gpus=0.5), [1])
    assert cmd[cmd.index("--gpus") + 1] == '"device=1"'
    assert cmd[cmd.index("--memory") + 1] == "32768m"


def test_declared_gpus_only_set_cuda_visible_devices(tmp_path):
    for runtime in ("docker", "podman"):
        ex = ContainerExecutor(
            tmp_path, runtime=runtime, image="img", gpus=FAKE_GPUS, memory_per_gpu_mb=1000
        )
        cmd, env = ex.command_for(lease(gpus=2), [1, 3])
        assert "--gpus" not in cmd and "--device" not in cmd
        assert env["CUDA_VISIBLE_DEVICES"] == "1,3" and "CUDA_VISIBLE_DEVICES" in cmd


def test_the_image_comes_from_the_lease_or_the_worker(tmp_path):
    ex = ContainerExecutor(tmp_path, runtime="docker", gpus=REAL_GPUS)
    with pytest.raises(StartError, match="no image"):
        ex.command_for(lease(), [0])
    assert ex.command_for(lease(image="a:1"), [0])[0][-3] == "a:1"
    assert ex.command_for(lease(payload={"image": "b:2"}), [0])[0][-3] == "b:2"
    assert container_name("team/run 1", 7) == "klique-team_run_1-7"
    assert (
        run_command(
            "docker",
            lease(command=()),
            [],
            image="x",
            variables=[],
            fake_gpus=False,
            memory_per_gpu_mb=None,
        )[-1]
        == "x"
    )


def task_files_env(log: Path) -> dict[str, str]:
    """The variables the worker daemon adds for a task's files (workers/daemon.py _start)."""
    return {
        "SECRET": "s3cret",
        outputs.ENV: outputs.path_for(str(log)),
        **checkpoints.task_env(str(log)),
    }


def test_the_tasks_files_are_mounted_and_named_inside(tmp_path):
    """Issue 28: the task's directory writable, the notice's read-only, the variables naming
    the paths inside; nothing else of the state directory (not the logs beside it)."""
    log = tmp_path / "state" / "logs" / "t-1.e3.log"
    ex = ContainerExecutor(tmp_path, runtime="podman", image="img", gpus=FAKE_GPUS)
    cmd, env = ex.command_for(lease(env=task_files_env(log)), [0], log)
    volumes = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-v"]
    assert volumes == [f"{log}.task:/klique/task", f"{log}.notice:/klique/notice:ro"]
    assert env["KLIQUE_CHECKPOINT_FILE"] == "/klique/task/checkpoint"
    assert env["KLIQUE_OUTPUTS"] == "/klique/task/outputs"
    assert env["KLIQUE_PREEMPT_FILE"] == "/klique/notice/preempt"
    names = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-e"]
    assert {"KLIQUE_CHECKPOINT_FILE", "KLIQUE_OUTPUTS", "KLIQUE_PREEMPT_FILE"} <= set(names)
    # no log: nothing mounted (the command line alone); a variable naming a file elsewhere
    # is not mounted
    assert "-v" not in ex.command_for(lease(env=task_files_env(log)), [0])[0]
    odd = ex.command_for(lease(env={"KLIQUE_PREEMPT_FILE": "/elsewhere/p"}), [0], log)
    assert "-v" not in odd[0] and odd[1]["KLIQUE_PREEMPT_FILE"] == "/elsewhere/p"


def test_exit_codes_128_plus_n_are_signals(tmp_path):
    ex = ContainerExecutor(tmp_path, runtime="podman", image="img")
    h = ContainerHandle(pid=1, pgid=1, start_ticks=None, exit_path="/x", name="c")
    assert ex._translate(h, Exited(137)).signal == "SIGKILL"
    assert "out of memory" in ex._translate(h, Exited(137)).message
    assert ex._translate(h, Exited(143)) == Exited(
        None, "SIGTERM", ex._translate(h, Exited(143)).message
    )
    assert ex._translate(h, Exited(125)).exit_code == 125
    assert ex._translate(h, Exited(3)) == Exited(3)


# real containers through Podman ---------------------------------------------------------------
def _podman_missing() -> str | None:
    if not shutil.which("podman"):
        return "podman is not installed (`make test` installs podman, runc and busybox-static)"
    if not shutil.which("runc"):
        return "runc is not installed (podman needs the runc runtime here: ../shared/notes)"
    if not (shutil.which("busybox") or Path("/bin/busybox").exists()):
        return "busybox-static is not installed (the test image is a busybox rootfs)"
    if os.geteuid() != 0:
        return "podman runs containers as root here"
    return None


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    why = _podman_missing()
    if why:
        pytest.skip(why)
    if subprocess.run(["podman", "image", "exists", IMAGE]).returncode == 0:
        return IMAGE
    root = tmp_path_factory.mktemp("rootfs")
    (root / "bin").mkdir()
    shutil.copy(shutil.which("busybox") or "/bin/busybox", root / "bin" / "busybox")
    for applet in ("sh", "sleep", "echo", "env", "cat", "true", "kill"):
        (root / "bin" / applet).symlink_to("busybox")
    tar = root.parent / "rootfs.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
    p = subprocess.run(["podman", "import", str(tar), IMAGE], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"podman import failed: {p.stderr.strip()}")
    return IMAGE


@pytest.fixture
def podman(image, tmp_path):
    ex = ContainerExecutor(
        tmp_path / "state",
        runtime="podman",
        image=image,
        gpus=FAKE_GPUS,
        container_args=PODMAN_ARGS,
        memory_per_gpu_mb=512,
    )
    yield ex
    out = subprocess.run(
        ["podman", "ps", "-a", "--filter", "label=klique.task", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in out:
        if name.startswith("klique-ptest-"):
            subprocess.run(["podman", "rm", "-f", name], capture_output=True)


async def wait_exit(ex, h, timeout=20.0) -> Exited:
    return await wait_for_async(
        lambda: r if isinstance(r := ex.poll(h), Exited) else None, timeout, "the container's end"
    )


def test_podman_runs_a_container_with_its_variables_and_exit_code(podman, tmp_path):
    log = tmp_path / "a.log"
    h = podman.start(
        lease(
            "ptest-a",
            [
                "sh",
                "-c",
                "echo cuda=$CUDA_VISIBLE_DEVICES "
                "task=$KLIQUE_TASK_ID $SECRET "
                "mem=$KLIQUE_GPU_MEMORY_FRACTION; exit 3",
            ],
            gpus=0.5,
        ),
        [2],
        log,
    )
    r = asyncio.run(wait_exit(podman, h))
    assert r.exit_code == 3 and r.signal is None
    assert log.read_text().strip() == "cuda=2 task=ptest-a s3cret mem=0.5"


def test_podman_stop_sends_sigterm_then_sigkill_after_the_grace(podman, tmp_path):
    log1, log2 = tmp_path / "t.log", tmp_path / "i.log"
    traps = podman.start(
        lease(
            "ptest-traps",
            ["sh", "-c", "trap 'echo checkpoint; exit 0' TERM; echo ready; sleep 30 & wait"],
        ),
        [0],
        log1,
    )
    ignores = podman.start(
        lease("ptest-ignores", ["sh", "-c", "trap '' TERM; echo ready; sleep 30"]), [1], log2
    )
    wait_for_text(log1, "ready")
    wait_for_text(log2, "ready")
    t0 = time.monotonic()
    r1 = asyncio.run(podman.stop(traps, 10))
    assert time.monotonic() - t0 < 5
    assert (r1.exit_code, r1.signal) == (0, None)
    assert "checkpoint" in log1.read_text()
    t0 = time.monotonic()
    r2 = asyncio.run(podman.stop(ignores, 1))
    assert 1.0 <= time.monotonic() - t0 < 8
    assert (r2.exit_code, r2.signal) == (None, "SIGKILL")


def test_podman_task_gets_its_checkpoint_file_and_the_notice_read_only(podman, tmp_path):
    """Issue 28, for real: in the container the task marks a checkpoint and writes its
    outputs in its directory (the worker sees both on its side), cannot write where the
    notice is, and its SIGTERM handler reads the notice the worker wrote before the stop."""
    log = tmp_path / "state" / "logs" / "ptest-files.e3.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    checkpoints.prepare(str(log))  # as the worker daemon does before a start
    script = (
        'echo "files=$KLIQUE_CHECKPOINT_FILE,$KLIQUE_OUTPUTS,$KLIQUE_PREEMPT_FILE"; '
        ': > "$KLIQUE_CHECKPOINT_FILE"; echo STEP=7 > "$KLIQUE_OUTPUTS"; '
        "if echo x > /klique/notice/forged 2>/dev/null; then echo notice-writable; "
        "else echo notice-read-only; fi; "
        "trap 'cat \"$KLIQUE_PREEMPT_FILE\"; echo; exit 0' TERM; "
        "echo ready; sleep 30 & wait"
    )
    h = podman.start(lease("ptest-files", ["sh", "-c", script], env=task_files_env(log)), [0], log)
    wait_for_text(log, "ready")
    text = log.read_text()
    assert "files=/klique/task/checkpoint,/klique/task/outputs,/klique/notice/preempt" in text
    assert (
        "notice-read-only" in text and not Path(checkpoints.notice_dir(str(log)), "forged").exists()
    )
    assert checkpoints.changed(str(log), None) is not None  # the worker sees the mark
    assert outputs.read(outputs.path_for(str(log))) == {"STEP": "7"}
    notice = checkpoints.write_notice(str(log), "preempted", "reclaimed by team-a", 5.0)
    r = asyncio.run(podman.stop(h, 5))
    assert (r.exit_code, r.signal) == (0, None)
    assert notice.to_json() in log.read_text()


def test_a_podman_worker_relays_a_containers_checkpoint_and_outputs(image, tmp_path):
    """The whole path with a real ``klique-worker --executor podman`` against the protocol's
    reference peer: the container's checkpoint mark reaches the control plane in a
    heartbeat (``checkpoint_at``), a stop's notice is read in the container, and a finished
    container's outputs come back with its report."""
    peer = ProtocolPeer()
    (tmp_path / "w").mkdir()
    w = WorkerProcess(
        peer,
        tmp_path / "w" / "state",
        gpus="0,1",
        extra=[
            "--executor",
            "podman",
            "--image",
            image,
            *[f"--container-arg={a}" for a in PODMAN_ARGS],
        ],
    )
    tids: list[str] = []
    try:
        w.start()
        marks = peer.submit(
            [
                "sh",
                "-c",
                (
                    ': > "$KLIQUE_CHECKPOINT_FILE"; '
                    "trap 'cat \"$KLIQUE_PREEMPT_FILE\"; echo; exit 0' "
                    "TERM; echo ready; sleep 30 & wait"
                ),
            ],
            grace_s=10,
        )
        writes = peer.submit(["sh", "-c", 'echo STEP=7 > "$KLIQUE_OUTPUTS"'])
        tids += [marks, writes]
        peer.wait_for(lambda: peer.end(writes), 30, "the outputs task ends")
        assert peer.end(writes)["event"] == "finished", peer.end(writes)
        assert peer.end(writes)["outputs"] == {"STEP": "7"}, peer.end(writes)
        peer.wait_for(
            lambda: any(
                r.get("task") == marks and r.get("checkpoint_at")
                for _, b, _ in peer.heartbeats
                for r in b["running"]
            ),
            30,
            "the checkpoint relayed in a heartbeat",
        )
        peer.wait_for(lambda: b"ready" in peer.log(marks), 30, "the trapping container runs")
        peer.stop(marks, reason="preempted", text="reclaimed by team-a", grace_s=10)
        peer.wait_for(lambda: peer.end(marks), 30, "stopped")
        assert peer.end(marks)["event"] == "stopped" and peer.end(marks)["exit_code"] == 0
        assert b'"reason":"preempted"' in peer.log(marks), peer.log(marks)
        assert b"reclaimed by team-a" in peer.log(marks)
    except BaseException:
        sys.stderr.write(w.stderr())
        raise
    finally:
        w.stop()
        peer.close()
        for tid in tids:
            subprocess.run(
                ["podman", "rm", "-f", container_name(tid, 1)], capture_output=True, check=False
            )


def test_podman_task_is_taken_back_after_a_restart(podman, image, tmp_path):
    log = tmp_path / "r.log"
    h = podman.start(lease("ptest-adopt", ["sh", "-c", "echo ready; sleep 1.5; exit 6"]), [0], log)
    wait_for_text(log, "ready")
    again = ContainerExecutor(
        tmp_path / "state",
        runtime="podman",
        image=image,
        gpus=FAKE_GPUS,
        container_args=PODMAN_ARGS,
    )
    h2 = again.adopt(h.to_record())
    assert h2.name == "klique-ptest-adopt-3"
    assert asyncio.run(wait_exit(again, h2)).exit_code == 6
    if h.popen is not None:
        h.popen.wait(5)  # reap the first executor's child


def test_podman_container_of_a_gone_worker_is_killed_before_the_requeue(podman, tmp_path):
    """Orphans (issue 9, finding 11): the worker is gone (a dead pid in its liveness file)
    and its deadlines pass: the container, which ignores SIGTERM, is killed by name before
    `kill_at` (``--orphan-kill``), and ``--rm`` removes it."""
    import json

    from workers.liveness import path_in

    dead = subprocess.Popen(["true"])
    dead.wait()
    log = tmp_path / "o.log"
    h = podman.start(
        lease("ptest-orphan", ["sh", "-c", "trap '' TERM; echo ready; sleep 30"]), [0], log
    )
    wait_for_text(log, "ready")
    now = time.monotonic()
    watch = path_in(tmp_path / "state")
    watch.write_text(
        json.dumps(
            {
                "pid": dead.pid,
                "alive_at": now,
                "contact_at": now - 5,
                "ttl_s": 6,
                "term_at": now + 0.5,
                "kill_at": now + 1.5,
            }
        )
    )
    r = asyncio.run(wait_exit(podman, h, timeout=15))
    assert time.monotonic() - now < 8
    assert r.message and r.message.startswith("worker-lost:"), r
    names = subprocess.run(
        ["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True
    ).stdout.split()
    assert "klique-ptest-orphan-3" not in names


def test_an_orphans_message_survives_the_exit_code_translation(tmp_path):
    ex = ContainerExecutor(tmp_path, runtime="docker", image="x")
    h = ContainerHandle(pid=1, pgid=1, start_ticks=None, exit_path="x", name="n")
    r = ex._translate(h, Exited(143, None, "worker-lost: its worker (pid 9) is gone"))
    assert (r.signal, r.message) == ("SIGTERM", "worker-lost: its worker (pid 9) is gone")
