"""The SDK's one exception type."""

from __future__ import annotations


class KliqueError(Exception):
    """A request that failed. ``status`` is the HTTP status (None when no answer came back),
    ``code`` the server's error code (``not-found``, ``submission-refused``, ...) or the SDK's
    own (``unreachable``, ``config``, ``bad-response``), ``message`` says what and how to fix
    it."""

    def __init__(self, status: int | None, code: str, message: str,
                 details: dict | None = None) -> None:
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
