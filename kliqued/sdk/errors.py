"""The SDK's exceptions, and who catches them.

- :class:`KliqueError`: the one type every SDK call raises (an error answer, no answer, a
  response that is not the API's). Programs catch it; the ``kliqued`` CLI turns it into
  ``kliqued: <message>`` and exit 1 (``commands/_client.handles_errors``).
- :class:`ConfigError`: a ``KliqueError`` with code ``config``: no URL or token could be
  found, or the config file is broken. Raised before any request is made.
"""

from __future__ import annotations

from typing import Any


class KliqueError(Exception):
    """A request that failed. ``status`` is the HTTP status (None when no answer came back),
    ``code`` the server's error code (``not-found``, ``submission-refused``, ...) or the SDK's
    own (``unreachable``, ``config``, ``bad-response``), ``message`` says what and how to fix
    it."""

    def __init__(
        self, status: int | None, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"KliqueError({self.status!r}, {self.code!r}, {self.message!r})"


class ConfigError(KliqueError):
    """No URL or token could be found, or the config file is broken."""

    def __init__(self, message: str) -> None:
        super().__init__(None, "config", message)
