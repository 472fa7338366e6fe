"""Queue and retry policy: pure functions, no I/O beyond reading checkpoint directories.

- Queue: highest priority first, then oldest. A user at their running limit
  is skipped, not allowed to block the jobs of others behind them.
- Retries: a failed attempt is retried while ``retries used < max_retries``,
  the deadline has not passed and nobody asked to cancel; the retry resumes
  from the job's last checkpoint.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dlrm_platform.api.db import JobStatus


@dataclass(frozen=True)
class QueuedJob:
    id: str
    owner: str
    priority: int
    created_at: datetime


def queue_order(jobs: Iterable[QueuedJob]) -> list[QueuedJob]:
    return sorted(jobs, key=lambda j: (-j.priority, j.created_at, j.id))


def select_jobs_to_start(
    queued: Sequence[QueuedJob],
    running_by_user: Mapping[str, int],
    *,
    max_running: int,
    max_running_per_user: int,
) -> list[QueuedJob]:
    """Which queued jobs to start now, in start order."""
    running = dict(running_by_user)
    free = max_running - sum(running.values())
    chosen: list[QueuedJob] = []
    for job in queue_order(queued):
        if free <= 0:
            break
        if running.get(job.owner, 0) >= max_running_per_user:
            continue
        chosen.append(job)
        running[job.owner] = running.get(job.owner, 0) + 1
        free -= 1
    return chosen


def deadline_passed(deadline_at: datetime | None, now: datetime) -> bool:
    return deadline_at is not None and now >= deadline_at


def should_retry(
    *, attempt: int, max_retries: int, cancel_requested: bool, deadline_at: datetime | None, now: datetime
) -> bool:
    """After attempt number ``attempt`` (1-based) failed: try again?"""
    if cancel_requested or deadline_passed(deadline_at, now):
        return False
    return attempt - 1 < max_retries


RAY_TO_JOB_STATUS = {
    "PENDING": JobStatus.STARTING,
    "RUNNING": JobStatus.RUNNING,
    "SUCCEEDED": JobStatus.SUCCEEDED,
    "FAILED": JobStatus.FAILED,
    "STOPPED": JobStatus.STOPPED,
}


def map_ray_status(ray_status: str) -> JobStatus:
    return RAY_TO_JOB_STATUS.get(str(ray_status).split(".")[-1].upper(), JobStatus.RUNNING)


SNAPSHOT_NAME = "checkpoint_manager_snapshot.json"


def find_latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint Ray Train wrote under ``root``.

    Ray Train V2 records its checkpoints in ``checkpoint_manager_snapshot.json``
    once they are fully persisted; that record is trusted first (a directory
    being written when the attempt died is not). Without a snapshot, the newest
    non-empty ``checkpoint_*`` directory.
    """
    if not root.is_dir():
        return None
    candidates: list[tuple[float, Path]] = []
    for snap in root.rglob(SNAPSHOT_NAME):
        try:
            state = json.loads(snap.read_text())
            latest = state.get("latest_checkpoint_result") or {}
            name = latest.get("checkpoint_dir_name")
        except (OSError, ValueError, AttributeError):
            continue
        if name and (snap.parent / name).is_dir():
            candidates.append((snap.stat().st_mtime, snap.parent / name))
    if candidates:
        return max(candidates)[1]
    dirs = [p for p in root.rglob("checkpoint_*") if p.is_dir() and any(p.iterdir())]
    if not dirs:
        return None
    return max(dirs, key=lambda p: p.stat().st_mtime)


def _override_value(value: Any) -> str:
    # JSON is YAML, so the job's `--set` parser reads strings as strings
    # ("123", "true") and nested values intact.
    return json.dumps(value)


def build_entrypoint(
    *,
    python: str,
    workdir: Path,
    config_path: Path,
    overrides: Mapping[str, Any],
    summary_path: Path | None = None,
) -> str:
    """The shell command Ray runs: ``dlrm-platform run`` with this environment's interpreter."""
    parts = [python, "-m", "dlrm_platform.cli", "run", str(config_path)]
    for key, value in overrides.items():
        parts += ["--set", f"{key}={_override_value(value)}"]
    if summary_path is not None:
        parts += ["--summary-json", str(summary_path)]
    return f"cd {shlex.quote(str(workdir))} && exec " + " ".join(shlex.quote(p) for p in parts)
