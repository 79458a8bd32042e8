"""What a generated CI job gives ``pip install``: a source the organisation pins.

The job that runs ``kliqued plan`` holds the planner token and ``pull-requests: write``, so
whatever it installs runs with both. A bare package name (``klique``, ``klique==0.1.0``) is
resolved on a public index, where nobody from the organisation owns the name: the job would
fail today and run a stranger's code the day someone registers it. So ``kliqued ci init``
only writes a git URL at a ref (best a commit, which cannot move) or a wheel (a path in the
estate repository, or a URL with its hash), and refuses anything else with the reason.

Pure: text in, an ``Install`` or an ``InstallError`` out; ``from_direct_url`` reads the
PEP 610 record pip keeps of how this kliqued was installed, as data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

EXAMPLES = (
    "git+https://git.example.org/platform/klique.git@<commit>",
    "tools/klique-0.1.0-py3-none-any.whl",
)
"""What to give instead, in every refusal."""

_NAMED = re.compile(r"^\s*[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._ -]*\])?\s*@\s*(?P<rest>.+)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_UNSAFE = re.compile(r"[\s\"'`$\\]")


class InstallError(ValueError):
    """A ``--install`` value that is not a pinned source; the message says why and what to
    give instead."""


@dataclass(frozen=True)
class Install:
    """A pinned source: the text pip gets and, for the generated file's comment, what it is
    pinned to."""

    spec: str
    kind: str
    """``git commit``, ``git ref`` (a tag or branch: it can be moved) or ``wheel``."""
    pinned_to: str

    @property
    def comment(self) -> str:
        """The lines the generated file carries above its install step."""
        return (
            f"kliqued is installed from a source the organisation pins ({self.kind} "
            f"{self.pinned_to}), never a bare package name: a name on a public index may "
            "be anyone's, and this job holds the planner token and pull-requests: write."
        )


def _refuse(value: str, why: str) -> InstallError:
    shown = value if len(value) <= 120 else value[:117] + "..."
    return InstallError(
        f"--install {shown!r}: {why}; give the project's git URL at a commit "
        f"({EXAMPLES[0]}) or a wheel ({EXAMPLES[1]})"
    )


def parse(value: str) -> Install:
    """``value`` as a pinned source, or an ``InstallError`` naming what is wrong."""
    text = value.strip()
    if not text:
        raise _refuse(value, "it is empty")
    named = _NAMED.match(text)
    source = named.group("rest").strip() if named else text
    if not source.startswith("git+") and not _is_wheel(source):
        raise _refuse(
            value,
            "a package name or version is looked up on a public index, "
            "where nobody from your organisation owns it, so the job would "
            "run whatever is published under that name",
        )
    if _UNSAFE.search(source):
        raise _refuse(
            value,
            "it holds a quote, a space, $, a backslash or a backtick, which "
            "the generated shell step and YAML would read",
        )
    if source.startswith("git+"):
        return _git(value, text, source)
    return Install(text, "wheel", source.split("#", 1)[0])


def _git(value: str, text: str, source: str) -> Install:
    parts = urlsplit(source[len("git+") :])
    if parts.scheme not in ("https", "ssh", "http", "file") or not parts.path.strip("/"):
        raise _refuse(value, "a git URL needs a scheme (https, ssh, file) and a path")
    path = parts.path.split("#", 1)[0]
    if "@" not in path:
        raise _refuse(
            value,
            "the git URL names no commit or tag (add @<commit> at its end), "
            "so each run would install whatever the default branch holds",
        )
    ref = path.rsplit("@", 1)[1]
    if not ref:
        raise _refuse(value, "the git URL's ref after @ is empty")
    if _COMMIT.match(ref):
        return Install(text, "git commit", ref)
    return Install(text, "git ref", ref)


def _is_wheel(source: str) -> bool:
    return source.split("#", 1)[0].split("?", 1)[0].endswith(".whl")


def from_direct_url(record: dict[str, Any] | None) -> Install | None:
    """The pinned source this kliqued itself came from, when pip recorded one (PEP 610,
    ``direct_url.json``): a git commit, or a wheel's URL with its hash. ``None`` for an
    editable or local directory install, or one from an index: nothing CI can pin."""
    if not record or not isinstance(record.get("url"), str):
        return None
    url = record["url"]
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") == "git" and isinstance(vcs.get("commit_id"), str):
        return parse(f"git+{url}@{vcs['commit_id']}")
    archive = record.get("archive_info")
    if isinstance(archive, dict) and _is_wheel(url) and not url.startswith("file:"):
        digest = archive.get("hash") or (archive.get("hashes") or {}).get("sha256")
        if isinstance(digest, str) and "=" not in digest:
            digest = f"sha256={digest}"
        return parse(url + (f"#{digest}" if digest else ""))
    return None
