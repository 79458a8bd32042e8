"""The published advice: what ``kliqued advise --publish DIR`` writes (``DIR/advice.json``)
and what the dashboard reads from the daemon's directory, to show a department head the
advice for their subtree (issue 31).

Why a file, read as it is: the advice replays weeks of demand once per change tried, which
takes minutes of CPU (docs/advisor.md: 6 min 36 s on the example estate), too much for a
page view or for the daemon's event loop; the weekly job that runs it anyway (``kliqued ci
init --advise``, a cron job) publishes its result, and the page says when it was made and
from what demand. One format for the writer and the reader, so neither can drift.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

FILE = "advice.json"
"""Its name in the daemon's directory (where its DuckDB file is)."""
VERSION = 1


class AdviceFileError(ValueError):
    """A published advice that cannot be read: the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class PublishedChange:
    """One change the advisor tried, and what the replay said of it."""

    policy: str
    group: str
    """The changed policy's group."""
    target: str
    """The group whose waits it is for."""
    label: str
    """``team-a: limit 2 -> 3``."""
    why: str
    status: str
    """``kept`` (in the patch), ``helps`` (kept rule, another value of it was kept),
    ``dropped``."""
    verdict: str
    p95_before_s: float | None
    p95_after_s: float | None
    worst_other: str | None
    """The other group whose p95 wait rose most, and by how much (``team-b +40%``)."""
    approvers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PublishedAdvice:
    generated_at: str
    """When ``kliqued advise`` ran (UTC, RFC 3339)."""
    source: str
    """The demand it replayed (a file, or a daemon and a window)."""
    estate: str
    subtree: str | None
    changes: tuple[PublishedChange, ...]
    report: str
    """The Markdown report, whole."""
    patch: str
    """The kept changes as a patch."""


def dumps(advice: PublishedAdvice) -> str:
    body = asdict(advice)
    return json.dumps({"version": VERSION, **body}, indent=2, ensure_ascii=False) + "\n"


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind):
        raise AdviceFileError(
            f"{where}: field {name!r} is missing or not a {getattr(kind, '__name__', kind)}; "
            "publish it again with kliqued advise --publish DIR"
        )
    return value


def loads(text: str, where: str) -> PublishedAdvice:
    """The advice in ``text`` (the file ``where``); :class:`AdviceFileError` naming what is
    wrong, never a traceback on a page."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise AdviceFileError(f"{where}: not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        raise AdviceFileError(
            f"{where}: not a version {VERSION} advice file; publish it again with this "
            "version's kliqued advise --publish DIR"
        )
    changes = []
    for i, c in enumerate(_field(raw, "changes", list, where)):
        at = f"{where}: changes[{i}]"
        if not isinstance(c, dict):
            raise AdviceFileError(f"{at}: not an object")
        number = (int, float, type(None))
        changes.append(
            PublishedChange(
                policy=_field(c, "policy", str, at),
                group=_field(c, "group", str, at),
                target=_field(c, "target", str, at),
                label=_field(c, "label", str, at),
                why=_field(c, "why", str, at),
                status=_field(c, "status", str, at),
                verdict=_field(c, "verdict", str, at),
                p95_before_s=_field(c, "p95_before_s", number, at),
                p95_after_s=_field(c, "p95_after_s", number, at),
                worst_other=_field(c, "worst_other", (str, type(None)), at),
                approvers=tuple(str(a) for a in _field(c, "approvers", list, at)),
            )
        )
    return PublishedAdvice(
        generated_at=_field(raw, "generated_at", str, where),
        source=_field(raw, "source", str, where),
        estate=_field(raw, "estate", str, where),
        subtree=_field(raw, "subtree", (str, type(None)), where),
        changes=tuple(changes),
        report=_field(raw, "report", str, where),
        patch=_field(raw, "patch", str, where),
    )
