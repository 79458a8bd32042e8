"""A CI job runs ``kliqued plan --against`` and ``--what-if-from`` with only its own ID token
(issue 30): GitHub Actions' token service (the Actions-shaped real provider) answers
``ACTIONS_ID_TOKEN_REQUEST_URL`` as a runner with ``id-token: write`` has it, the daemon
trusts the issuer for the estate repository's main branch and the job reads the live counts
as ``role:planner``; no ``KLIQUE_TOKEN``, no config file, no stored secret. A job of another
branch is refused, saying which claim failed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.harness.inproc import InProcServer
from tests.harness.oidc import Provider
from tests.plan.helpers import commit_all, init_repo, run_plan


@pytest.fixture
def job_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, oidc_actions: Provider) -> None:
    """The environment of a GitHub Actions job with ``id-token: write``, and nothing else."""
    for var in ("KLIQUE_TOKEN", "KLIQUE_URL", "KLIQUE_ID_TOKEN", "KLIQUE_AUDIENCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KLIQUE_CONFIG", str(tmp_path / "no-config.yaml"))
    monkeypatch.setenv("ACTIONS_ID_TOKEN_REQUEST_URL", oidc_actions.actions_url)
    monkeypatch.setenv("ACTIONS_ID_TOKEN_REQUEST_TOKEN", oidc_actions.request_token)


def _repo(tmp_path: Path) -> Path:
    repo = init_repo(tmp_path / "repo")
    shutil.copytree(tmp_path / "estate", repo / "estate")
    commit_all(repo, "the estate")
    policies = repo / "estate" / "policies.yaml"
    policies.write_text(policies.read_text().replace("limit: 10", "limit: 3", 1))
    return repo


def test_plan_against_with_only_the_jobs_id_token(
    tmp_path: Path, idp_server: InProcServer, job_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    s = idp_server
    alice = s.token({"user": "alice"})
    s.ok("POST", "/v1/tasks", {"resource": "team-a/one", "command": ["true"]}, token=alice)
    repo = _repo(tmp_path)
    code, out, err = run_plan(
        capsys,
        "--repo",
        str(repo),
        "--base",
        "main",
        "--against",
        s.url,
        "--what-if-from",
        s.url,
        "--format",
        "json",
    )
    assert code == 2, (err, out[-2000:])
    plan = json.loads(out)
    assert plan["against"]["source"] == s.url
    assert plan["against"]["revision"] == plan["base"]["estate_revision"]
    signed = s.ok("GET", "/v1/events?kind=signed_in")["events"]
    assert {e["data"]["provider"] for e in signed} == {"github"}
    assert {e["actor"] for e in signed} == {"role:planner"}


def test_a_job_of_another_branch_is_refused_with_the_claim(
    tmp_path: Path,
    idp_server: InProcServer,
    job_env: None,
    oidc_actions: Provider,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(
        "ACTIONS_ID_TOKEN_REQUEST_URL", oidc_actions.actions_url + "&ref=refs/heads/feature"
    )
    repo = _repo(tmp_path)
    code, _, err = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--against", idp_server.url
    )
    assert code == 1 and "Traceback" not in err
    assert "ref is 'refs/heads/feature', the estate asks 'refs/heads/main'" in err


def test_without_id_token_permission_the_plan_says_what_is_missing(
    tmp_path: Path,
    idp_server: InProcServer,
    job_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "not-the-runners")
    repo = _repo(tmp_path)
    code, _, err = run_plan(
        capsys, "--repo", str(repo), "--base", "main", "--against", idp_server.url
    )
    assert code == 1 and "Traceback" not in err
    assert "answered HTTP 401; give the workflow `permissions: id-token: write`" in err


def test_advise_against_with_only_the_jobs_id_token(
    tmp_path: Path, idp_server: InProcServer, job_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The weekly advise job (``kliqued ci init --advise``) reads the demand with the job's
    own ID token too: no stored planner secret (issue 31's job, issue 30's rule)."""
    from kliqued.cli import main

    s = idp_server
    alice = s.token({"user": "alice"})
    s.ok("POST", "/v1/tasks", {"resource": "team-a/one", "command": ["true"]}, token=alice)
    report = tmp_path / "advice.md"
    code = main(
        ["advise", "--estate", str(tmp_path / "estate"), "--against", s.url, "-o", str(report)]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert s.url in report.read_text()  # the demand's source: the daemon, read as the planner
    signed = s.ok("GET", "/v1/events?kind=signed_in")["events"]
    assert {e["data"]["provider"] for e in signed} == {"github"}
    assert {e["actor"] for e in signed} == {"role:planner"}
