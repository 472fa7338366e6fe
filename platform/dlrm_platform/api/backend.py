"""Execution on Ray Jobs through ``JobSubmissionClient``.

Ray's token auth stays on: the Jobs SDK reads the cluster token
(``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH`` / ``~/.ray/auth_token`` with
``RAY_AUTH_MODE=token``) and attaches it to every request. ``ray`` is imported
lazily; nothing here connects at import time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


class BackendUnavailable(RuntimeError):
    """The Ray Jobs API cannot be reached; try again later, change nothing."""


@dataclass
class BackendJob:
    submission_id: str
    status: str  # Ray's JobStatus name: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    message: str | None = None
    ray_job_id: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


class JobBackend(Protocol):
    def submit(
        self,
        submission_id: str,
        entrypoint: str,
        *,
        runtime_env: dict[str, Any],
        metadata: dict[str, str],
        entrypoint_num_cpus: float,
    ) -> None: ...

    def info(self, submission_id: str) -> BackendJob | None:
        """None when Ray has no such job (e.g. its head restarted without GCS persistence)."""

    def list_jobs(self) -> list[BackendJob]: ...

    def stop(self, submission_id: str) -> bool: ...

    def logs(self, submission_id: str) -> str: ...

    def tail(self, submission_id: str) -> AsyncIterator[str]: ...


def _is_not_found(err: Exception) -> bool:
    text = str(err)
    return "status code 404" in text or "does not exist" in text or "not found" in text.lower()


class RayJobsBackend:
    """``JobBackend`` on a real Ray cluster's Jobs API."""

    MAX_BACKOFF_S = 15.0

    def __init__(self, address: str):
        self.address = address
        self._client: Any = None
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._backoff_s = 0.0

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                # While the head is down, reconnect with backoff: a failed connect costs CPU.
                if time.monotonic() < self._retry_at:
                    raise BackendUnavailable(f"Ray Jobs API at {self.address}: unreachable (retrying later)")
                from ray.job_submission import JobSubmissionClient

                try:
                    self._client = JobSubmissionClient(self.address)
                except Exception as err:  # connection refused, 401, version check
                    self._backoff_s = min(self.MAX_BACKOFF_S, max(1.0, self._backoff_s * 2))
                    self._retry_at = time.monotonic() + self._backoff_s
                    raise BackendUnavailable(f"Ray Jobs API at {self.address}: {err}") from err
                self._backoff_s = 0.0
            return self._client

    def _call(self, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        import requests

        client = self._get_client()
        try:
            return getattr(client, fn_name)(*args, **kwargs)
        except requests.exceptions.RequestException as err:
            with self._lock:
                self._client = None  # reconnect next time (the head may have moved or restarted)
            raise BackendUnavailable(f"Ray Jobs API at {self.address}: {err}") from err

    def submit(
        self,
        submission_id: str,
        entrypoint: str,
        *,
        runtime_env: dict[str, Any],
        metadata: dict[str, str],
        entrypoint_num_cpus: float,
    ) -> None:
        try:
            self._call(
                "submit_job",
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata=metadata,
                entrypoint_num_cpus=entrypoint_num_cpus or None,
            )
        except RuntimeError as err:
            if isinstance(err, BackendUnavailable):
                raise
            if "already exists" in str(err):
                return  # idempotent: this attempt was submitted before a crash
            raise

    @staticmethod
    def _convert(details: Any) -> BackendJob:
        status = getattr(details.status, "value", details.status)
        return BackendJob(
            submission_id=details.submission_id or details.job_id,
            status=str(status),
            message=details.message,
            ray_job_id=details.job_id,
            metadata=dict(details.metadata or {}),
        )

    def info(self, submission_id: str) -> BackendJob | None:
        try:
            return self._convert(self._call("get_job_info", submission_id))
        except BackendUnavailable:
            raise
        except RuntimeError as err:
            if _is_not_found(err):
                return None
            raise BackendUnavailable(str(err)) from err

    def list_jobs(self) -> list[BackendJob]:
        try:
            return [self._convert(d) for d in self._call("list_jobs") if d.submission_id]
        except BackendUnavailable:
            raise
        except RuntimeError as err:
            raise BackendUnavailable(str(err)) from err

    def stop(self, submission_id: str) -> bool:
        try:
            return bool(self._call("stop_job", submission_id))
        except BackendUnavailable:
            raise
        except RuntimeError as err:
            if _is_not_found(err):
                return False
            raise BackendUnavailable(str(err)) from err

    def logs(self, submission_id: str) -> str:
        try:
            return str(self._call("get_job_logs", submission_id))
        except BackendUnavailable:
            raise
        except RuntimeError as err:
            if _is_not_found(err):
                return ""
            raise BackendUnavailable(str(err)) from err

    async def tail(self, submission_id: str) -> AsyncIterator[str]:
        client = self._get_client()
        async for chunk in client.tail_job_logs(submission_id):
            yield chunk
