"""Rewrites references to the daemon's old flat modules (``kliqued/daemon/<x>.py``) to their
rooms (issue 27, item 1; kliqued/daemon/README.md and docs/architecture.md).

Run it on a branch made before the move, before merging it::

    python tools/rooms_rewrite.py [paths...]      # default: the whole repository
    python tools/rooms_rewrite.py --since main    # only the files the branch changed

``--since`` is the one to use before a merge: a file the branch did not touch is left as it
is, so git takes the move's version of it whole (rewriting it too would meet the move's later
hand edits of the same import lines as a conflict). Where both touched a file, the lines this
script writes are the move's own, so only real edits on both sides conflict. Edits to
``Daemon.run_pass`` or a ``Daemon.prepare_*`` (now ``state/daemon.py``) meet a conflict in
``state/core.py`` and are moved by hand; mypy then names any reference left (``Module has no
attribute``).

It rewrites, in every text file it is given (or finds under the given directories):
- relative imports inside ``kliqued/daemon`` (``from .core import``, ``from .. import history``),
  made absolute first, so that they resolve from the file's own place;
- ``from kliqued.daemon import a, b`` (split by room), ``from kliqued.daemon.x import``,
  ``import kliqued.daemon.x`` and any dotted string ``"kliqued.daemon.x.attr"`` (monkeypatch
  targets, ``python -m``, loggers' names);
- paths ``kliqued/daemon/x.py``, ``kliqued/daemon/handlers/``, ``kliqued/daemon/agents/``.

It is idempotent: a new name is never an old one (the one shared name, ``fleet``, the old
module and the new package, is told apart by what follows it). It moves no file: git's rename
detection carries a branch's changes to the moved files when it is merged.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def _root() -> Path:
    """The repository the command runs in (the lead runs this file on other branches'
    worktrees), else the one holding this file."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], capture_output=True, check=True, text=True
        ).stdout.strip()
        return Path(out).resolve()
    except (OSError, subprocess.CalledProcessError):
        return Path(__file__).resolve().parent.parent


ROOT = _root()

ROOMS: dict[str, list[str]] = {
    "storage": [
        "store",
        "eventlog",
        "pglog",
        "pgreader",
        "querypool",
        "compaction",
        "storefault",
        "keyfile",
    ],
    "state": [
        "core",
        "reducers",
        "channel_state",
        "channels",
        "pipeline_cache",
        "pipelines",
        "schedules",
        "binding",
        "cloud",
        "autoscalers",
        "alerts",
        "history",
        "snapshot",
        "replay",
        "loop",
        "clockwatch",
        "unattended",
        "gitops",
    ],
    "api": [
        "app",
        "routes",
        "request",
        "inputs",
        "openapi",
        "views",
        "treeviews",
        "metrics",
        "sessions",
        "session_site",
        "submission",
        "handlers",
        "agents",
    ],
    "fleet": ["gang", "capacity", "tunnels", "ends"],
    "ha": ["lease", "standby", "replica"],
}
"""Each room's modules (a module keeps its name; ``handlers`` and ``agents`` move whole)."""

RENAMED = {"fleet": "fleet.workers"}
"""Old modules whose name is taken by their room: ``kliqued.daemon.fleet`` is the package."""

FLEET_NEW = {"workers", "gang", "capacity", "tunnels", "ends", "cloud", "autoscalers"}
"""The fleet package's modules: ``kliqued.daemon.fleet.<one of these>`` is already new."""

SYMBOLS: dict[str, dict[str, str]] = {
    "state.core": {n: "state.prepared" for n in ("Overlay", "Prepared", "merged")}
    | {"Daemon": "state.daemon"},
    "state.cloud": {
        n: "fleet.cloud"
        for n in ("view", "_cloud_pool", "prepare_started", "prepare_ended", "prepare_scaling")
    },
    "state.autoscalers": {
        n: "fleet.autoscalers"
        for n in ("overdue", "prepare_heartbeat", "prepare_lost", "restart_grace", "_interval")
    },
    "state.channels": {n: "state.as_owner" for n in ("prepare_as_owner", "sent")},
    "api.handlers": {"agents": "api.agents:routes"},
}
"""Names that left their module to break an import cycle (new module -> name -> its module
now; ``module:new``: a module renamed, imported ``as`` its old name). ``from M import name``
lines are split; ``M.name`` after ``import M`` is not rewritten
(mypy names each one left: ``Module has no attribute``). ``autoscalers.live(d, pool)`` is now
the method ``d.autoscaler_live(pool)``."""

TABLE: dict[str, str] = {m: f"{room}.{m}" for room, ms in ROOMS.items() for m in ms}
TABLE.update(RENAMED)
"""Old name under ``kliqued.daemon`` -> new name under ``kliqued.daemon``."""

SKIP_DIRS = {
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "build",
    "dist",
    ".hypothesis",
}
SKIP_FILES = {"rooms_rewrite.py"}

_DOTTED = re.compile(r"(?<![\w.])kliqued\.daemon\.([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)?)")
_PATH = re.compile(r"(?<![\w/])kliqued/daemon/([A-Za-z_]\w*)(\.py\b|/)")
_FROM_PKG = re.compile(
    r"^(?P<ind>[ \t]*)from kliqued\.daemon import (?P<names>\([^)]*\)|[^\n#]*?)"
    r"(?P<tail>[ \t]*(?:#[^\n]*)?)$",
    re.M,
)
_RELATIVE = re.compile(r"^(?P<ind>[ \t]*)from (?P<dots>\.+)(?P<mod>[\w.]*) import ", re.M)


LITERALS = {
    "kliqued/daemon/handlers/agents.py": "kliqued/daemon/api/agents/routes.py",
    "kliqued.daemon.handlers.agents": "kliqued.daemon.api.agents.routes",
}
"""A module that changed its name as it moved: the MCP endpoint's routes went from the
handlers to the agents' package (the MCP adapter sits above the handlers it calls)."""


def new_dotted(name: str, rest: str) -> str | None:
    """The new ``kliqued.daemon.`` suffix for an old ``name`` followed by ``rest``
    (``.attr`` or empty), or None when the reference is already new (or never moved)."""
    if name == "fleet":
        if rest[1:] in FLEET_NEW:
            return None
        return "fleet.workers" + rest
    if name in TABLE:
        return TABLE[name] + rest
    return None


_IMPORTED = re.compile(r"[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)")


def _dotted(m: re.Match[str]) -> str:
    if m.group(1) == "fleet" and not m.group(2):
        # The old module only in ``from kliqued.daemon.fleet import <its names>``; else the
        # new package (``from kliqued.daemon.fleet import gang``, a contract's module list)
        imported = _IMPORTED.match(m.string, m.end())
        if not imported or all(
            n.split(" as ")[0].strip() in FLEET_NEW
            for n in imported.group(1).strip("()").split(",")
            if n.strip()
        ):
            return m.group(0)
    new = new_dotted(m.group(1), m.group(2))
    return m.group(0) if new is None else "kliqued.daemon." + new


def _path(m: re.Match[str]) -> str:
    name, end = m.group(1), m.group(2)
    if name == "fleet" and end == "/":
        return m.group(0)  # the new package
    if name not in TABLE:
        return m.group(0)
    if end == "/" and name not in ("handlers", "agents"):
        return m.group(0)
    return "kliqued/daemon/" + TABLE[name].replace(".", "/") + end


def _from_pkg(m: re.Match[str]) -> str:
    """``from kliqued.daemon import a, b as c`` -> one line per room."""
    raw = m.group("names")
    inner = raw[1:-1] if raw.startswith("(") else raw
    names = [n.strip() for n in re.sub(r"#[^\n]*", "", inner).replace("\n", " ").split(",")]
    names = [n for n in names if n]
    groups: dict[str, list[str]] = {}
    for n in names:
        base = n.split(" as ")[0].strip()
        if base == "fleet":
            groups.setdefault("kliqued.daemon.fleet", []).append(
                "workers" if " as " in n else "workers as fleet"
            )
            if " as " in n:
                groups["kliqued.daemon.fleet"][-1] = "workers as " + n.split(" as ")[1].strip()
            continue
        target = TABLE.get(base)
        if target is None:
            groups.setdefault("kliqued.daemon", []).append(n)
        else:
            pkg = "kliqued.daemon." + target.rsplit(".", 1)[0]
            groups.setdefault(pkg, []).append(n)
    if list(groups) == ["kliqued.daemon"]:
        return m.group(0)
    ind = m.group("ind")
    lines = [f"{ind}from {pkg} import {', '.join(ns)}" for pkg, ns in sorted(groups.items())]
    lines[-1] += m.group("tail")
    return "\n".join(lines)


_FROM_MOD = re.compile(
    r"^(?P<ind>[ \t]*)from kliqued\.daemon\.(?P<mod>[\w.]+) import (?P<names>\([^)]*\)|[^\n#]*?)"
    r"(?P<tail>[ \t]*(?:#[^\n]*)?)$",
    re.M,
)


def _from_mod(m: re.Match[str]) -> str:
    """``from kliqued.daemon.state.core import Daemon, Prepared`` -> one line per module."""
    moved = SYMBOLS.get(m.group("mod"))
    if moved is None:
        return m.group(0)
    raw = m.group("names")
    inner = raw[1:-1] if raw.startswith("(") else raw
    names = [
        n.strip()
        for n in re.sub(r"#[^\n]*", "", inner).replace("\\\n", " ").replace("\n", " ").split(",")
        if n.strip()
    ]
    if not any(n.split(" as ")[0].strip() in moved for n in names):
        return m.group(0)
    groups: dict[str, list[str]] = {}
    for n in names:
        old = n.split(" as ")[0].strip()
        target = moved.get(old, m.group("mod"))
        if ":" in target:  # a module renamed: imported as the name the code uses
            target, new = target.split(":")
            n = f"{new} as {n.split(' as ')[1].strip() if ' as ' in n else old}"
        groups.setdefault(target, []).append(n)
    ind = m.group("ind")
    lines = [
        f"{ind}from kliqued.daemon.{mod} import {', '.join(ns)}"
        for mod, ns in sorted(groups.items())
    ]
    lines[-1] += m.group("tail")
    return "\n".join(lines)


def _absolute(text: str, module: str, is_pkg: bool) -> str:
    """Relative imports of ``module`` made absolute."""
    parts = module.split(".")
    base = parts if is_pkg else parts[:-1]

    def sub(m: re.Match[str]) -> str:
        up = len(m.group("dots")) - 1
        anchor = base[: len(base) - up] if up else base
        target = ".".join(anchor + ([m.group("mod")] if m.group("mod") else []))
        return f"{m.group('ind')}from {target} import "

    return _RELATIVE.sub(sub, text)


def rewrite(text: str, rel: Path | None = None) -> str:
    """The text with every old reference made new (``rel``: the file's path in the
    repository, to resolve its relative imports when it sits in ``kliqued/daemon``)."""
    if rel is not None and rel.suffix == ".py" and rel.parts[:2] == ("kliqued", "daemon"):
        is_pkg = rel.name == "__init__.py"
        mod = ".".join(rel.with_suffix("").parts[:-1] if is_pkg else rel.with_suffix("").parts)
        text = _absolute(text, mod, is_pkg)
    for old, new in LITERALS.items():
        text = re.sub(re.escape(old) + r"(?![\w])", new, text)
    text = _DOTTED.sub(_dotted, text)
    text = _FROM_PKG.sub(_from_pkg, text)
    text = _FROM_MOD.sub(_from_mod, text)
    text = _PATH.sub(_path, text)
    return text


def changed_since(ref: str) -> list[Path]:
    """The files changed (or added, or untracked) since the branch left ``ref``."""
    base = subprocess.run(
        ["git", "merge-base", ref, "HEAD"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout.strip()
    names: set[str] = set()
    for cmd in (
        ["git", "diff", "--name-only", "--diff-filter=d", base],
        ["git", "ls-files", "--others", "--exclude-standard"],
    ):
        names.update(
            n
            for n in subprocess.run(
                cmd, cwd=ROOT, capture_output=True, check=True, text=True
            ).stdout.splitlines()
            if n
        )
    return [ROOT / n for n in sorted(names)]


def files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_file():
            out.append(p)
            continue
        try:
            listed = subprocess.run(
                [
                    "git",
                    "ls-files",
                    "-z",
                    "--cached",
                    "--others",
                    "--exclude-standard",
                    "--",
                    str(p),
                ],
                cwd=ROOT,
                capture_output=True,
                check=True,
            ).stdout.split(b"\0")
            out.extend(ROOT / f.decode() for f in listed if f)
        except (OSError, subprocess.CalledProcessError):
            out.extend(
                f
                for f in p.rglob("*")
                if f.is_file() and not SKIP_DIRS.intersection(f.relative_to(p).parts)
            )
    return [f for f in out if f.name not in SKIP_FILES and f.is_file()]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--since"] and len(argv) == 2:
        paths = changed_since(argv[1])
    else:
        paths = [Path(a).resolve() for a in argv] or [ROOT]
    changed = 0
    for f in files(paths):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        try:
            rel: Path | None = f.resolve().relative_to(ROOT)
        except ValueError:
            rel = None
        new = rewrite(text, rel)
        if new != text:
            f.write_text(new, encoding="utf-8")
            changed += 1
            print(f"rewrote {rel or f}")
    print(f"{changed} file(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
