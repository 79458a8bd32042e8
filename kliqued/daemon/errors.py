"""The one error type handlers raise; the error middleware renders it as the contract's JSON
``{"error": {"code", "message", "details"?}}``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            err["details"] = self.details
        return {"error": err}


def bad_request(message: str, details: dict[str, Any] | None = None) -> ApiError:
    return ApiError(400, "invalid-request", message, details)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "not-found", message)


class Unavailable(ApiError):
    """The daemon is shutting down or its log cannot be written: nothing was recorded."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "unavailable", message)
