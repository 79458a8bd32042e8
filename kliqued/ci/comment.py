"""One pull-request comment for the plan, updated on every push and split when too long.

Like Atlantis: the plan goes in as few comments as the forge's size limit allows (GitHub
refuses a body over 65,536 characters), each found again on the next push by a hidden marker
and edited in place; parts a shorter plan no longer needs are deleted, so the conversation
holds exactly one current plan. A part that cuts through a code block or a folded
``<details>`` closes it and the next part reopens it, so every part renders on its own.

Standard library HTTP only: the workflow runs it with the token the forge gives the job.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

MARKER = "<!-- klique-plan -->"
"""What ``kliqued plan --format markdown`` writes on its first line."""
PART = "<!-- klique-plan part {i} -->"
PART_RE = re.compile(r"<!-- klique-plan(?: part (\d+))? -->")
MAX_CHARS = 65_000
"""GitHub's limit is 65,536; GitLab's is larger. Room is kept for the part headers."""
PAGE = 100


class CommentError(Exception):
    """The forge refused or could not be reached; the message says which call and why."""


# ------------------------------------------------------------------ splitting

_FENCE = re.compile(r"^(`{3,}|~{3,})")


def split(text: str, max_chars: int = MAX_CHARS) -> list[str]:
    """``text`` cut at line ends into parts of at most ``max_chars`` (headers included); a
    part ending inside a code fence or a ``<details>`` closes it, the next reopens it."""
    if not text.endswith("\n"):
        text += "\n"
    header_room = len(PART.format(i=999)) + 60
    limit = max(200, max_chars - header_room)
    parts: list[str] = []
    cur: list[str] = []
    size = 0
    fence: str | None = None
    """The opening line of the code block we are in."""
    details = 0
    reopen: list[str] = []

    def closing() -> list[str]:
        out = []
        if fence is not None:
            out.append(_FENCE.match(fence).group(1))  # type: ignore[union-attr]
        out += ["</details>"] * details
        return out

    def flush() -> None:
        nonlocal cur, size, reopen
        body = cur + closing()
        parts.append("\n".join(body) + "\n")
        reopen = ["<details><summary>(continued)</summary>", ""] * details + (
            [fence] if fence is not None else []
        )
        cur = list(reopen)
        size = sum(len(x) + 1 for x in cur)

    for line in text.split("\n")[:-1]:
        while len(line) + 1 > limit - 100:  # a line longer than a part: cut it
            head, line = line[: limit - 200], line[limit - 200 :]
            if size + len(head) + 1 + 40 > limit and len(cur) > len(reopen):
                flush()
            cur.append(head)
            size += len(head) + 1
            flush()
        tail = sum(len(x) + 1 for x in closing())
        if size + len(line) + 1 + tail > limit and len(cur) > len(reopen):
            flush()
        cur.append(line)
        size += len(line) + 1
        m = _FENCE.match(line)
        if m:
            if fence is None:
                fence = line
            elif line.strip() == _FENCE.match(fence).group(1):  # type: ignore[union-attr]
                fence = None
        elif fence is None:
            details += line.count("<details") - line.count("</details>")
            details = max(0, details)
    if len(cur) > len(reopen) or not parts:
        parts.append("\n".join(cur + closing()) + "\n")
    n = len(parts)
    if n == 1:
        return [parts[0] if MARKER in parts[0] else f"{MARKER}\n{parts[0]}"]
    out = []
    for i, p in enumerate(parts, 1):
        head = MARKER if i == 1 else PART.format(i=i)
        if i == 1 and p.startswith(MARKER):
            p = p[len(MARKER) :].lstrip("\n")
        note = f"*Klique plan, part {i} of {n}.*\n\n" if n > 1 else ""
        out.append(f"{head}\n{note}{p}")
    return out


def part_number(body: str) -> int | None:
    """1 for the first part (the plain marker), i for ``part i``; None: not ours."""
    m = PART_RE.search(body or "")
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) else 1


# ------------------------------------------------------------------ forges


class Forge(Protocol):
    def list(self) -> list[tuple[int, str]]: ...
    def create(self, body: str) -> int: ...
    def update(self, cid: int, body: str) -> None: ...
    def delete(self, cid: int) -> None: ...


class _Http:
    def __init__(self, headers: dict[str, str], timeout: float = 30) -> None:
        self.headers = headers
        self.timeout = timeout

    def call(self, method: str, url: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        h = dict(self.headers)
        if data is not None:
            h["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise CommentError(f"{method} {url}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise CommentError(f"{method} {url}: {getattr(exc, 'reason', exc)}") from None
        return json.loads(raw) if raw.strip() else None


@dataclass
class GitHub:
    """Issue comments of a pull request (REST v3)."""

    api: str
    repo: str
    number: int
    token: str

    def __post_init__(self) -> None:
        self.http = _Http(
            {
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
                "User-Agent": "kliqued-ci",
            }
        )
        self.base = f"{self.api.rstrip('/')}/repos/{self.repo}"

    def list(self) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        page = 1
        while True:
            rows = self.http.call(
                "GET", f"{self.base}/issues/{self.number}/comments?per_page={PAGE}&page={page}"
            )
            out += [(int(c["id"]), c.get("body") or "") for c in rows]
            if len(rows) < PAGE:
                return out
            page += 1

    def create(self, body: str) -> int:
        return int(
            self.http.call("POST", f"{self.base}/issues/{self.number}/comments", {"body": body})[
                "id"
            ]
        )

    def update(self, cid: int, body: str) -> None:
        self.http.call("PATCH", f"{self.base}/issues/comments/{cid}", {"body": body})

    def delete(self, cid: int) -> None:
        self.http.call("DELETE", f"{self.base}/issues/comments/{cid}")


@dataclass
class GitLab:
    """Notes of a merge request (REST v4)."""

    api: str
    project: str
    iid: int
    token: str

    def __post_init__(self) -> None:
        self.http = _Http({"PRIVATE-TOKEN": self.token, "User-Agent": "kliqued-ci"})
        self.base = (
            f"{self.api.rstrip('/')}/projects/{urllib.parse.quote(self.project, '')}"
            f"/merge_requests/{self.iid}/notes"
        )

    def list(self) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        page = 1
        while True:
            rows = self.http.call(
                "GET", f"{self.base}?per_page={PAGE}&page={page}&sort=asc&order_by=created_at"
            )
            out += [(int(n["id"]), n.get("body") or "") for n in rows if not n.get("system")]
            if len(rows) < PAGE:
                return out
            page += 1

    def create(self, body: str) -> int:
        return int(self.http.call("POST", self.base, {"body": body})["id"])

    def update(self, cid: int, body: str) -> None:
        self.http.call("PUT", f"{self.base}/{cid}", {"body": body})

    def delete(self, cid: int) -> None:
        self.http.call("DELETE", f"{self.base}/{cid}")


@dataclass(frozen=True)
class Posted:
    created: int
    updated: int
    deleted: int

    @property
    def text(self) -> str:
        return f"{self.created} created, {self.updated} updated, {self.deleted} deleted"


def post(forge: Forge, text: str, max_chars: int = MAX_CHARS) -> Posted:
    """Makes the pull request's plan comments exactly the parts of ``text``: the existing
    ones edited in place (part by part), missing ones created, left-over ones deleted."""
    parts = split(text, max_chars)
    mine: dict[int, int] = {}
    extra: list[int] = []
    for cid, body in forge.list():
        n = part_number(body)
        if n is None:
            continue
        if n in mine:
            extra.append(cid)  # a duplicate (two runs raced): keep the first
        else:
            mine[n] = cid
    created = updated = 0
    for i, body in enumerate(parts, 1):
        if i in mine:
            forge.update(mine.pop(i), body)
            updated += 1
        else:
            forge.create(body)
            created += 1
    stale = sorted(mine.values()) + extra
    for cid in stale:
        forge.delete(cid)
    return Posted(created, updated, len(stale))
