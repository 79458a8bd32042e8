"""`make run` says which session apps its workers can start and how to enable the others
(issue 32): it installs none, so the first run stays fast."""

from __future__ import annotations

from pathlib import Path

from kliqued.commands.dev import session_lines


def program(where: Path, name: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    (where / name).write_text("#!/bin/sh\n")
    (where / name).chmod(0o755)


def test_without_jupyterlab_it_says_how_to_install_it(tmp_path: Path) -> None:
    program(tmp_path, "ttyd")
    text = "\n".join(session_lines(".venv/bin/kliqued", str(tmp_path)))
    assert "the workers can start shell." in text
    assert "pip install jupyterlab, then make run again" in text
    assert "--app shell" in text and "code-server" in text


def test_with_jupyterlab_it_shows_how_to_start_one(tmp_path: Path) -> None:
    program(tmp_path, "jupyter-lab")
    text = "\n".join(session_lines(".venv/bin/kliqued", str(tmp_path)))
    assert "the workers can start jupyter." in text
    assert "pip install jupyterlab" not in text
    assert (
        ".venv/bin/kliqued session start --resource llm-research/l40s-1x --project evals "
        "--app jupyter"
    ) in text


def test_with_none_it_says_so(tmp_path: Path) -> None:
    text = "\n".join(session_lines("kq", str(tmp_path / "empty")))
    assert "can start none of jupyter, vscode, shell" in text and "--resource" not in text
