"""Job records in a database through SQLAlchemy (sqlite by default, any URL in production).

The database is the service's source of truth: the queue, every attempt and
the history of each job live here, so they survive a restart of the API or of
the Ray head. Ray's job table is reconciled against it on start-up.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (sqlite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class JobStatus(enum.StrEnum):
    QUEUED = "QUEUED"  # waiting in the service's queue (also between retries)
    STARTING = "STARTING"  # handed to Ray, which has not started the driver yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # cancelled
    TIMED_OUT = "TIMED_OUT"  # deadline passed

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES

    @property
    def active(self) -> bool:
        return self in (JobStatus.STARTING, JobStatus.RUNNING)


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.TIMED_OUT})
ACTIVE = (JobStatus.STARTING.value, JobStatus.RUNNING.value)
NOT_TERMINAL = (JobStatus.QUEUED.value, *ACTIVE)


class Base(DeclarativeBase):
    pass


class ApiKeyRecord(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32), unique=True, index=True)
    key_hash: Mapped[str] = mapped_column(String(128))
    user: Mapped[str] = mapped_column(String(64), index=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class JobRecord(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_status_priority", "status", "priority", "created_at"),
        Index("ix_jobs_owner_created", "owner", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value)
    status_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    name: Mapped[str] = mapped_column(String(128))
    config_name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    overrides: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # resolved, validated job config
    request_hash: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    max_retries: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # attempts started so far
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    stop_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)  # "cancelled" | "deadline"
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    ray_submission_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    ray_job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mlflow_experiment_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    resume_from: Mapped[str | None] = mapped_column(Text, nullable=True)
    steps_done: Mapped[int | None] = mapped_column(Integer, nullable=True)
    samples_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    data_wait_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)
    progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    @property
    def job_status(self) -> JobStatus:
        return JobStatus(self.status)


class JobEventRecord(Base):
    """The history of a job: one row per state change or decision."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")


class Database:
    """Engine + session factory. Creates the schema on first use."""

    def __init__(self, url: str):
        parsed = make_url(url)
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if parsed.get_backend_name() == "sqlite":
            db = parsed.database
            if db and db != ":memory:" and not db.startswith("file:"):
                Path(db).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            if not db or db == ":memory:":
                from sqlalchemy.pool import StaticPool

                kwargs["poolclass"] = StaticPool
            else:
                kwargs["pool_size"] = 20
                kwargs["max_overflow"] = 40
        self.url = url
        self.engine: Engine = create_engine(url, **kwargs)
        if parsed.get_backend_name() == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def session_factory(self) -> sessionmaker[Session]:
        return self._sessions

    def session(self) -> Session:
        return self._sessions()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session

    def get_job(self, job_id: str) -> JobRecord:
        """The record of a job that exists (the caller knows it does)."""
        with self.session() as s:
            job = s.get(JobRecord, job_id)
        assert job is not None
        return job

    def dispose(self) -> None:
        self.engine.dispose()


class JobHistory:
    """Writes a job's history: one ``JobEventRecord`` per decision, stamped by ``clock``."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock

    def add(self, s: Session, job: JobRecord, kind: str, message: str, status: JobStatus | None = None) -> None:
        s.add(
            JobEventRecord(
                job_id=job.id,
                at=self.clock(),
                attempt=job.attempt,
                kind=kind,
                status=status.value if status else None,
                message=message,
            )
        )


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
