"""The worker's task records on disk after a lease round (issue 29): what a restart after
kill -9 needs, written without a write that buys nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from workers.client import ControlPlaneClient
from workers.daemon import WorkerConfig, WorkerDaemon
from workers.executors.process import ProcessExecutor
from workers.gpus import Gpu
from workers.state import RUNNING, STARTING, StateDir


def lease(task: str, command: list[str]) -> dict:
    return {"task": task, "epoch": 1, "command": command, "gpus": 1.0, "user": "alice"}


def test_a_lease_round_leaves_the_started_with_their_pid_and_the_waiting_on_disk(tmp_path):
    """One GPU, two leases in one answer: the first starts (its record, written after the
    start, has its pid), the second waits for the GPU (written at the end of the round, so a
    restarted worker starts it). Nothing is written when the leases are accepted: the lease
    alone on disk bought nothing and cost a rename a task."""
    token = tmp_path / "token"
    token.write_text("kq_test\n")
    state = StateDir(tmp_path / "state")
    executor = ProcessExecutor(state.root)
    cfg = WorkerConfig(
        url="http://127.0.0.1:9", pool="bare", token_file=str(token), state_dir=str(state.root)
    )

    async def round_of_two() -> WorkerDaemon:
        d = WorkerDaemon(
            cfg, [Gpu(0, "GPU-0", None)], executor, state, ControlPlaneClient(cfg.url, token)
        )
        d.registered.set()
        for item in (lease("t-1", ["sleep", "30"]), lease("t-2", ["true"])):
            d.accept(item)
        assert not list(state.tasks.glob("*.json"))  # nothing written before the start
        d._place_pending()
        d._write_waiting()
        await d.client.close()
        return d

    d = asyncio.run(round_of_two())
    try:
        on_disk = {
            (rec := json.loads(p.read_text()))["task"]: rec for p in state.tasks.glob("*.json")
        }
        assert set(on_disk) == {"t-1", "t-2"}
        assert on_disk["t-1"]["state"] == RUNNING and on_disk["t-1"]["handle"]["pid"] > 0
        assert on_disk["t-2"]["state"] == STARTING and on_disk["t-2"]["handle"] is None
        assert Path(on_disk["t-1"]["log_path"]).name == "t-1.e1.log"
    finally:
        for h in d.handles.values():
            try:
                os.killpg(h.to_record()["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        executor.close()
