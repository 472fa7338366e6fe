"""Keeping secrets out of logs and MLflow: passwords in URIs, values of secret-named fields.

Credentials reach the platform's processes through the environment
(``MLFLOW_TRACKING_PASSWORD``, Ray's token file, ``DLRM_API_DATABASE_URL``...);
whatever is logged, printed or recorded as an MLflow param goes through
:func:`redact_text` or :func:`redact_param` first.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "is_secret_name", "redact_param", "redact_text"]

REDACTED = "***"
# scheme://user:password@host -> scheme://user:***@host (any scheme: http, postgresql+psycopg, s3, ...)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<password>[^@/\s]+)@")
# ?token=... / &password=... in a query string
_QUERY = re.compile(r"(?P<head>[?&](?:password|passwd|pwd|token|secret|api[_-]?key|access[_-]?key|sig)=)"
                    r"(?P<value>[^&\s#]+)", re.IGNORECASE)
_SECRET_NAME = re.compile(r"(password|passwd|secret|token|api[_-]?key|credential|private[_-]?key)",
                          re.IGNORECASE)


def redact_text(text: str) -> str:
    """``text`` with passwords in URIs and secret query parameters replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['head']}:{REDACTED}@", text)
    return _QUERY.sub(lambda m: f"{m['head']}{REDACTED}", text)


def is_secret_name(name: str) -> bool:
    """Whether a field or tag name says its value is a secret (``api_key``, ``db.password``...)."""
    return bool(_SECRET_NAME.search(name))


def redact_param(name: str, value: str) -> str:
    """An MLflow param's value as it may be recorded."""
    return REDACTED if is_secret_name(name) and value not in ("", "None") else redact_text(value)
