"""Errors of the job service that the routes map to HTTP status codes."""

from __future__ import annotations

from typing import Any

__all__ = ["Conflict", "Forbidden", "InvalidRequest", "NotFound", "ServiceError"]


class ServiceError(Exception):
    status_code = 400


class NotFound(ServiceError):
    status_code = 404


class Forbidden(ServiceError):
    status_code = 403


class Conflict(ServiceError):
    status_code = 409


class InvalidRequest(ServiceError):
    """422 with FastAPI's validation-error body: ``errors`` are ``{loc, msg, type}``."""

    status_code = 422

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__("; ".join(e["msg"] for e in errors))
        self.errors = errors
