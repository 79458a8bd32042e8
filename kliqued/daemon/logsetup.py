"""The daemon's log: one stderr handler for every logger (ours, aiohttp's, asyncio's) that
never prints a credential and never lets a flood of connections flood the log.

Why here and not per call site: the text that leaks a token is often not ours. aiohttp's
parser errors quote the raw header bytes (``Authorization: Bearer kq_...\\x00``), asyncio logs
exceptions with their messages, and a traceback repeats them. A filter on the one handler sees
every record after it is formatted, so it scrubs whatever its origin. Likewise a flood (3,000
half-open connections, a scanner) repeats the same few messages: the filter lets the first of
each kind through, counts the rest, and says how many it held back with the next one.
"""

from __future__ import annotations

import logging
import re
import sys
import time

log = logging.getLogger(__name__)

_REDACTED = "[redacted]"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # an Authorization header as a line, in a repr of bytes, or in a dict: its whole value
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)[^\r\n'\"]*"), r"\1" + _REDACTED),
    # a scheme and its credential anywhere (a header value quoted on its own)
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s'\"\\,;]+"), r"\1\2" + _REDACTED),
    # ``token=...``, ``"secret": "..."``; not "token t-01..." (an id, worth reading)
    (
        re.compile(r"(?i)\b(token|secret|password)(['\"]?\s*[=:]\s*['\"]?)[^\s'\"\\,;}]+"),
        r"\1\2" + _REDACTED,
    ),
    # Klique's own token shape, wherever it appears
    (re.compile(r"kq_[A-Za-z0-9_\-]{6,}"), "kq_" + _REDACTED),
    # environment assignments of secrets (a command line echoed in an error)
    (re.compile(r"(?i)\b([A-Z_]*(?:TOKEN|SECRET|PASSWORD)=)\S+"), r"\1" + _REDACTED),
]


def redact(text: str) -> str:
    """``text`` with every credential-shaped value replaced by ``[redacted]``."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


class RedactFilter(logging.Filter):
    """Scrubs the message, its arguments and its traceback of credentials. The record is
    rendered here (once) so that what the formatter prints is exactly what was scrubbed."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: show it raw rather than lose the record
            message = f"{record.msg!r} {record.args!r}"
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


FLOOD_PRONE = ("aiohttp", "asyncio", "kliqued.daemon.listener")
"""Loggers whose messages are driven by what clients do (one per connection or request): a
flood of those is aggregated. Our own loggers say one thing per event worth reading."""


class FloodFilter(logging.Filter):
    """Lets through at most ``burst`` records of one kind (logger and message template) per
    ``window`` seconds; the next one let through says how many were held back. Tracebacks of
    client-caused records are dropped past the first: they are the bulk of a flood."""

    def __init__(
        self,
        window: float = 60.0,
        burst: int = 1,
        prefixes: tuple[str, ...] = FLOOD_PRONE,
        max_kinds: int = 1000,
    ) -> None:
        super().__init__()
        self.window, self.burst, self.prefixes, self.max_kinds = (
            window,
            burst,
            prefixes,
            max_kinds,
        )
        self._kinds: dict[tuple[str, str, str], list[float | int]] = {}
        """kind -> [window start, let through in this window, held back since last shown]"""

    def _prone(self, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in self.prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._prone(record.name):
            return True
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, str(record.msg), exc)
        now = time.monotonic()
        state = self._kinds.get(key)
        if state is None:
            if len(self._kinds) >= self.max_kinds:  # an endless variety: one bucket for all
                key = (record.name, "*", "")
                state = self._kinds.setdefault(key, [now, 0, 0])
            else:
                state = self._kinds[key] = [now, 0, 0]
        if now - state[0] >= self.window:
            state[0], state[1] = now, 0
        if state[1] >= self.burst:
            state[2] += 1
            return False
        state[1] += 1
        if state[2]:
            record.msg = f"{record.msg} (and {int(state[2])} more like this not shown)"
            state[2] = 0
            record.exc_info, record.exc_text = None, None
        return True

    def held_back(self) -> list[tuple[str, str, int]]:
        """(logger, message template, count) of records held back and not yet reported; the
        counts are reset."""
        out = []
        for (name, msg, _), state in self._kinds.items():
            if state[2]:
                out.append((name, msg, int(state[2])))
                state[2] = 0
        return out


def report_held_back() -> None:
    """Says, at a stop, how many client-driven records were held back since last shown."""
    for h in logging.getLogger().handlers:
        for f in h.filters:
            if isinstance(f, FloodFilter):
                for name, msg, count in f.held_back():
                    log.info("%d more log lines of [%s] %r were not shown", count, name, msg)


_FORMAT = "%(asctime)s kliqued %(levelname)s %(message)s"


class _Format(logging.Formatter):
    """Our format; records of other libraries name their logger."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not record.name.startswith("kliqued"):
            head, sep, rest = text.partition(f" {record.levelname} ")
            text = f"{head}{sep}[{record.name}] {rest}"
        return text


class _Handler(logging.StreamHandler):
    """The one handler ``setup`` installs; found again by its class (``setup`` is
    idempotent)."""


def setup(stream=None, level: int = logging.INFO) -> logging.Handler:
    """Installs the one stderr handler on the root logger (idempotent) and routes the
    ``kliqued`` logger to it at ``level``: every module logs to ``logging.getLogger(__name__)``,
    a child of ``kliqued``, so this sets them all, and one module's level can still be set on
    its own (the logger ``kliqued.daemon.state.gitops``, say). Returns the handler."""
    root = logging.getLogger()
    for h in root.handlers:
        if isinstance(h, _Handler):
            return h
    handler = _Handler(stream or sys.stderr)
    handler.setFormatter(_Format(_FORMAT))
    handler.addFilter(FloodFilter())  # first: a held-back record costs no scrubbing
    handler.addFilter(RedactFilter())
    root.addHandler(handler)  # other libraries: warnings and errors (root's default level)
    ours = logging.getLogger("kliqued")
    ours.setLevel(level)
    ours.propagate = True
    return handler
