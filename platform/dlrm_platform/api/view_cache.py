"""Rendered job views kept in memory, dropped by every committed change to their job."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from dlrm_platform.api.db import JobEventRecord, JobRecord

__all__ = ["ViewCache"]


class ViewCache:
    """Rendered job views (JSON bytes) by job id, so that polling a job costs no query.

    Every committed change to a job or its history drops its entry (session
    events), and entries expire after ``ttl_s`` whatever happens. Expired entries
    and old change marks are swept out as new views come in, so memory follows the
    jobs polled lately, not every job the process has ever served.
    """

    # A change mark is kept this long: far longer than one render takes, which is all it guards.
    GENERATION_KEEP_S = 300.0

    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, str, bytes]] = {}
        # job id -> (mark, when): a mark is unique (a counter), so one swept out and set again never
        # equals the value a render in flight read before
        self._generations: dict[str, tuple[int, float]] = {}
        self._counter = itertools.count(1)
        self._next_sweep = 0.0
        self._lock = threading.Lock()

    def get(self, job_id: str) -> tuple[str, bytes] | None:
        hit = self._entries.get(job_id)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1], hit[2]

    def put(self, job_id: str, owner: str, body: bytes, generation: int) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            if generation != self.generation(job_id):
                return  # changed while it was being rendered
            now = time.monotonic()
            if now >= self._next_sweep or len(self._entries) > 50_000:
                self._sweep(now)
            self._entries[job_id] = (now + self.ttl_s, owner, body)

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + max(self.ttl_s, 1.0)
        for job_id in [k for k, (expires, _, _) in self._entries.items() if expires < now]:
            del self._entries[job_id]
        if len(self._entries) > 50_000:
            self._entries.clear()
        old = now - self.GENERATION_KEEP_S
        for job_id in [k for k, (_, at) in self._generations.items() if at < old]:
            del self._generations[job_id]

    def invalidate(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._entries.pop(job_id, None)
                self._generations[job_id] = (next(self._counter), time.monotonic())

    def generation(self, job_id: str) -> int:
        mark = self._generations.get(job_id)
        return 0 if mark is None else mark[0]

    def __len__(self) -> int:
        return len(self._entries)

    def watch(self, session_factory: sessionmaker[Session]) -> None:
        """Drop the entry of every job a committed session changed (the job or its history)."""
        event.listen(session_factory, "after_flush", _collect_changed_jobs)
        event.listen(session_factory, "after_commit", self._invalidate_committed)

    def _invalidate_committed(self, session: Session) -> None:
        changed = session.info.pop("changed_jobs", None)
        if changed:
            self.invalidate(changed)


def _collect_changed_jobs(session: Session, _ctx: Any) -> None:
    changed = session.info.setdefault("changed_jobs", set())
    for obj in (*session.new, *session.dirty, *session.deleted):
        if isinstance(obj, JobRecord):
            changed.add(obj.id)
        elif isinstance(obj, JobEventRecord):
            changed.add(obj.job_id)
