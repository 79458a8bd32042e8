"""The pipeline example of docs/channels.md ("Pipelines") runs on the example estate
(estate/) as its console lines say, through the CLI against a real daemon: the file's
`project` is the steps' project, `--project` overrides it, a step's own wins, and a step
left without a project is refused with that reason alone (issue 32)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.harness.daemon import EXAMPLE_ESTATE, ROOT
from tests.harness.inproc import InProcServer
from tests.harness.wait import wait_for

DOC = ROOT / "docs" / "channels.md"


def doc_example() -> tuple[str, list[list[str]]]:
    """The YAML block and the `kliqued pipeline run` lines of the doc's Pipelines section."""
    section = DOC.read_text().split("\n## Pipelines\n", 1)[1].split("\n## ", 1)[0]
    yaml_block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert yaml_block is not None, "docs/channels.md: the Pipelines section lost its example"
    runs = [
        line[2:].split("#")[0].split()[2:]
        for line in section.splitlines()
        if line.startswith("$ kliqued pipeline run ")
    ]
    return yaml_block.group(1), runs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcServer]:
    s = InProcServer(tmp_path_factory.mktemp("pipeline-doc"), estate=EXAMPLE_ESTATE).start()
    yield s
    assert s.stop() == 0, s.log()


def cli(s: InProcServer, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KLIQUE_URL": s.url, "KLIQUE_TOKEN": s.token("alice")}
    env.pop("KLIQUE_CONFIG", None)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "kliqued.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def first_task(s: InProcServer, pid: str) -> dict:
    """The first step's task, once the daemon's loop sent it."""
    tid = wait_for(
        lambda: s.ok("GET", f"/v1/pipelines/{pid}", token=s.token("alice"))["steps"][0]["task"],
        30,
        f"pipeline {pid} to send its first step",
    )
    return s.ok("GET", f"/v1/tasks/{tid}", token=s.token("alice"))


def test_the_docs_pipeline_runs_on_the_example_estate(server: InProcServer, tmp_path: Path) -> None:
    text, runs = doc_example()
    (tmp_path / "nightly.yaml").write_text(text)
    assert [r[:2] for r in runs] == [["run", "nightly.yaml"]] * 2, runs
    want = ["foundation-7b", "rlhf"]  # the file's project, then --project's
    for args, project in zip(runs, want):
        r = cli(server, tmp_path, "pipeline", *args, "--json")  # args: run nightly.yaml ...
        assert r.returncode == 0, r.stderr
        pid = json.loads(r.stdout)["id"]
        task = first_task(server, pid)
        assert (task["project"], task["user"]) == (project, "alice"), task
        assert task["command"][:2] == ["python", "prep.py"]


def test_a_step_without_a_project_is_refused_for_that_alone(
    server: InProcServer, tmp_path: Path
) -> None:
    text, _ = doc_example()
    no_project = "".join(line for line in text.splitlines(keepends=True) if "project:" not in line)
    (tmp_path / "nightly.yaml").write_text(no_project)
    r = cli(server, tmp_path, "pipeline", "run", "nightly.yaml")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3, r.stderr  # one a step
    assert lines[0] == (
        "kliqued: nightly.yaml: step prepare: project required: group 'llm-research' "
        "records its use against a project; give one of evals, foundation-7b, rlhf"
    )
    assert "may submit to" not in r.stderr
    body = {"file": "nightly.yaml", "text": no_project}
    code, answer = server.call("POST", "/v1/pipelines", body, token=server.token("alice"))
    assert code == 422 and answer["error"]["details"]["field"] == "project", answer
