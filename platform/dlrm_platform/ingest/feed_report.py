"""What the feed service reports about one job: its passes and whether shared streams served it.

:meth:`FeedService.describe <dlrm_platform.ingest.feed_service.FeedService.describe>`
returns a :class:`FeedReport`. It crosses the actor boundary by pickle, so the caller
re-validates it (``config.revalidate``, in :func:`~.feed_client.read_feed_report`)
before the job summary, its MLflow metrics and tags read it by attribute. Its JSON form
(``model_dump``) is the run's ``feed_service.json`` and the summary's ``feed``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["FeedReport", "PassStats", "SharingStats"]


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PassStats(_Report):
    """One job's reading of one pass (its latest generation); times in seconds from the stream's start."""

    name: str
    epoch: int
    generation: int
    blocks: int  # produced by the stream
    rows: int  # packed batches produced by the stream
    first_block_s: float | None  # when the stream produced its first block
    produced_s: float | None  # when it produced its last (None: still running or failed)
    first_open_s: float | None  # when the job's first worker opened the pass
    handed: dict[str, int]  # rank (a JSON key) -> packed batches (blocks mode) or samples (steps mode)
    unbalanced: int  # hand-outs that gave up waiting for the other workers (blocks mode)
    steps: int  # steps dealt (steps mode)
    uneven_steps: int  # steps whose batches differ in size (only a pass's last can)
    recut: int  # per-rank batches joined from pieces of the pipeline's batches
    shared: bool  # another job read the same stream
    paid: bool  # this job started the stream (its CPU time is this job's)
    joined_late: bool  # the stream had produced blocks before this job joined it
    cpu_s: float  # CPU-seconds of the tasks that produced the stream's blocks
    error: str | None  # the stream's failure (repr), if any


class SharingStats(_Report):
    """Whether a job was served from shared streams and the preprocessing it saved or paid (CPU-seconds)."""

    shared_streams: int  # of the job's streams, those another job also read
    streams: int
    served_from_shared_stream: bool  # some stream the job read was started (and paid) by another job
    cpu_s_saved: float
    cpu_s_paid: float
    jobs_attached: int  # jobs attached to the service when it reported


class FeedReport(_Report):
    """A job's passes on the feed service, and its sharing (:meth:`FeedService.describe`)."""

    passes: list[PassStats]
    sharing: SharingStats
