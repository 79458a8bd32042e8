"""Real git repositories in tmp dirs for the plan tests, made deterministic.

Author, committer and dates are fixed and the user's git configuration is ignored, so the
same estates give the same commit ids on every machine (goldens still normalise them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kliqued.cli import main

ESTATES = Path(__file__).resolve().parent / "estates"
V1 = ESTATES / "v1"
V2 = ESTATES / "v2"

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Klique Test",
    "GIT_AUTHOR_EMAIL": "test@klique.invalid",
    "GIT_COMMITTER_NAME": "Klique Test",
    "GIT_COMMITTER_EMAIL": "test@klique.invalid",
    "GIT_AUTHOR_DATE": "2026-01-05T10:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-05T10:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def put_estate(repo: Path, source: Path, estate_path: str = "estate") -> None:
    target = repo / estate_path
    if target.exists():
        shutil.rmtree(target)
    # Fresh mtimes (not copy2's): two estates whose files have the same size and the same
    # mtime would look unchanged to git's index and the second commit would be empty.
    shutil.copytree(source, target, copy_function=shutil.copy)


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def init_repo(path: Path, branch: str = "main") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", branch)
    return path


def two_commit_repo(path: Path, v1: Path = V1, v2: Path = V2) -> tuple[Path, str, str]:
    """main: the v1 estate; branch ``change`` (checked out): the v2 estate."""
    repo = init_repo(path)
    put_estate(repo, v1)
    base = commit_all(repo, "estate v1")
    git(repo, "checkout", "-q", "-b", "change")
    put_estate(repo, v2)
    head = commit_all(repo, "estate v2")
    return repo, base, head


def run_plan(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err
