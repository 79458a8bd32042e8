"""The advisor's advice on the Policy page (issue 31): the last advice ``kliqued advise
--publish DIR`` wrote into the daemon's directory, each change shown to who it concerns.

The daemon does not compute advice: a replay of weeks of demand per change tried takes
minutes of CPU (docs/advisor.md), which no page view may cost. It reads the published file
(``klique_util/advice_file.py``) when it changed (its size and modification time, looked at
on each rendering: a ``stat``), and the page says when the advice was made and from what
demand, so an old one reads as old. Who sees what: admins and finance every change; a
group's admin (a department head) the changes for their groups and the groups below them
(the change's group or the group it is for in their subtrees); others none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from klique_util import advice_file, fmt
from klique_util.advice_file import AdviceFileError, PublishedAdvice, PublishedChange
from kliqued.daemon.auth import Principal
from kliqued.daemon.state.daemon import Daemon
from kliqued.daemon.units import parse_iso


@dataclass(frozen=True, slots=True)
class Shown:
    """What the Policy page shows of the advice for one person."""

    scope: tuple[str, ...] | None
    """The groups whose subtrees the changes are for (None: the whole estate)."""
    advice: PublishedAdvice | None
    changes: tuple[PublishedChange, ...]
    age: str
    """How long ago the advice was made (``3d 2h``)."""
    problem: str | None
    """Why the published file cannot be read, for the page."""
    where: str


STATUS_ORDER = {"kept": 0, "helps": 1, "dropped": 2}


class AdviceCache:
    """The published advice, read again only when its file changed."""

    def __init__(self) -> None:
        self._key: tuple[str, int, int] | None = None
        self._value: PublishedAdvice | AdviceFileError | None = None

    def read(self, path: Path) -> PublishedAdvice | None:
        """The advice at ``path``, None when none was published; raises
        :class:`AdviceFileError` for a file that cannot be read."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._key, self._value = None, None
            return None
        key = (str(path), st.st_mtime_ns, st.st_size)
        if key != self._key:
            try:
                self._value = advice_file.loads(path.read_text(encoding="utf-8"), str(path))
            except AdviceFileError as exc:
                self._value = exc
            except (OSError, UnicodeDecodeError) as exc:
                self._value = AdviceFileError(f"{path}: cannot be read ({exc})")
            self._key = key
        if isinstance(self._value, AdviceFileError):
            raise self._value
        return self._value


def path_of(db_path: str) -> Path:
    """The published advice's place: beside the daemon's DuckDB file."""
    return Path(db_path).resolve().parent / advice_file.FILE


def scope_of(d: Daemon, p: Principal) -> tuple[str, ...] | None | bool:
    """The groups whose advice ``p`` sees: None for all (admins, finance), the groups they
    administer for a user (their subtrees), False for none."""
    if p.is_admin or p.is_finance:
        return None
    if p.is_user:
        acc = d.acc()
        mine = acc.admin_of(p.name)  # with the groups below those they administer
        tops = {g for g in mine if not any(g != h and g in acc.subtree(h) for h in mine)}
        return tuple(sorted(tops)) if tops else False
    return False


def shown(d: Daemon, p: Principal, cache: AdviceCache, path: Path, now_ms: int) -> Shown | None:
    """The advice for ``p``, or None when the page shows no advice section to them."""
    scope = scope_of(d, p)
    if scope is False:
        return None
    assert scope is None or isinstance(scope, tuple)
    try:
        advice = cache.read(path)
    except AdviceFileError as exc:
        return Shown(scope, None, (), "", str(exc), str(path))
    if advice is None:
        return Shown(scope, None, (), "", None, str(path))
    if scope is None:
        changes = advice.changes
    else:
        acc = d.acc()
        below: set[str] = set()
        for g in scope:
            below |= acc.subtree(g)
        changes = tuple(c for c in advice.changes if c.target in below or c.group in below)
    changes = tuple(sorted(changes, key=lambda c: STATUS_ORDER.get(c.status, 3)))
    try:
        age = fmt.span(max(0, now_ms - parse_iso(advice.generated_at)) / 1000)
    except ValueError:
        age = "an unknown time"
    return Shown(scope, advice, changes, age, None, str(path))


def wait(seconds: float | None) -> str:
    """A p95 wait as people say it (``7d 2h``); ``-`` without one."""
    return "-" if seconds is None else fmt.span(seconds)
