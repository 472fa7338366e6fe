"""The job's side of the feed service: start it, attach to a shared one, stop it, and read from it.

Apart from :mod:`.feed_service` (the actor's body) because this runs in other
processes: the driver starts the service and keeps a shared one's lease
(:func:`start_feed_service`, :func:`start_shared_feed_service`,
:class:`FeedHeartbeat`, :func:`stop_feed_service`, :func:`read_feed_report`), and
each training worker reads its share of a pass through a :class:`FeedClient`. What
they pass to the actor is a handle, or a :class:`JobFeed` for a shared service;
what comes back is :mod:`.feed_blocks`' block refs and steps, and a
:class:`~.feed_report.FeedReport`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from dlrm_platform.config import revalidate
from dlrm_platform.ingest.feed_blocks import Step, step_tables
from dlrm_platform.ingest.feed_report import FeedReport
from dlrm_platform.ingest.feed_service import DEFAULT_JOB, FeedService, PassKey

__all__ = ["NAMESPACE", "FeedClient", "FeedHeartbeat", "JobFeed", "read_feed_report", "shared_service_name",
           "start_feed_service", "start_shared_feed_service", "stop_feed_service"]

log = logging.getLogger("dlrm_platform.ingest.feed")

_MB = 1 << 20
NAMESPACE = "dlrm_platform"  # shared feed services live here, whatever namespace a job's driver has


def _on_this_node() -> Any:
    """Pin a feed service to the driver's node, as Ray pins ``streaming_split``'s coordinator.

    Hard, not soft: a soft pin let Ray place it on a data node when the driver's node looked busy (CI, a
    0-CPU head), and removing that data node then took the job's feed service, and its passes, with it.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def start_feed_service(datasets: dict[str, Any], *, consumers: int, ahead: Sequence[PassKey],
                       max_ahead_bytes: int = 256 * _MB, name: str | None = None,
                       step_samples: int | None = None) -> Any:
    """Create the job's own :class:`FeedService` actor on this node (no CPU: its work is Ray Data's scheduling)."""
    import ray

    actor = ray.remote(FeedService).options(
        name=name,
        num_cpus=0,
        # Killed (its process or node gone), Ray starts it again with the same datasets; the workers' calls in
        # flight are retried there and find their passes gone, so Ray Train restarts the group from its last
        # checkpoint, whose data position makes the resumed epochs exactly-once (tests/chaos).
        max_restarts=-1,
        max_task_retries=-1,
        # Each worker holds at most one take() and one open(); +2 for describe() and the ahead thread's peers.
        max_concurrency=2 * max(1, consumers) + 2,
        scheduling_strategy=_on_this_node(),
    )
    return actor.remote(datasets, ahead=list(ahead), max_ahead_bytes=max_ahead_bytes, consumers=consumers,
                        step_samples=step_samples)


@dataclass(frozen=True)
class JobFeed:
    """A job's handle on a shared feed service: the actor and the job's name there (pickles into Ray Train)."""

    actor: Any
    job: str
    shared: bool = True


def shared_service_name(fingerprint: str) -> str:
    return f"dlrm-feed-{fingerprint}"


def start_shared_feed_service(datasets: dict[str, Any], *, fingerprint: str, job: str, consumers: int,
                              ahead: Sequence[PassKey], step_samples: int | None = None,
                              max_ahead_bytes: int = 256 * _MB, retain_bytes: int = 256 * _MB,
                              lease_s: float = 120.0, max_jobs: int = 8, attempts: int = 20) -> JobFeed:
    """Attach ``job`` to the feed service of ``fingerprint``, creating it (named, detached) if none runs.

    The service outlives the job that created it while other jobs read from it,
    and exits when its last job detaches (:func:`stop_feed_service`) or goes
    silent for ``lease_s`` (a driver that died; :class:`FeedHeartbeat` keeps a live one attached).
    """
    import ray

    for attempt in range(attempts):
        actor = ray.remote(FeedService).options(
            name=shared_service_name(fingerprint), namespace=NAMESPACE, get_if_exists=True,
            lifetime="detached", num_cpus=0, max_concurrency=2 * max(1, consumers) * max_jobs + 4,
            scheduling_strategy=_on_this_node(),
        ).remote(datasets, max_ahead_bytes=max_ahead_bytes, consumers=1, retain_bytes=retain_bytes,
                 lease_s=lease_s)
        try:
            jobs = ray.get(actor.attach.remote(job, consumers, step_samples, list(ahead)))
        except Exception as err:  # noqa: BLE001 - closing or dead: its last job left; start a new one
            log.info("feed: shared service %s not joinable (%s); retrying", fingerprint, err)
            time.sleep(min(2.0, 0.2 * (attempt + 1)))
            continue
        log.info("feed: job %s attached to shared feed service %s (%d job(s))", job, fingerprint, jobs)
        return JobFeed(actor, job)
    raise RuntimeError(f"could not attach to the shared feed service {fingerprint}")


def stop_feed_service(feed: Any) -> None:
    """The job is done with its feed: detach from a shared service (ending it when last), kill an own one."""
    import ray

    if isinstance(feed, JobFeed):
        try:
            left = ray.get(feed.actor.detach.remote(feed.job), timeout=30)
        except Exception as err:  # noqa: BLE001 - the service is gone already
            log.info("feed: detach from the shared service failed: %s", err)
            return
        if left == 0:
            ray.kill(feed.actor)
        return
    ray.kill(feed)


class FeedHeartbeat:
    """A driver thread that keeps ``feed``'s job attached to a shared service while the job runs."""

    def __init__(self, feed: Any, every_s: float = 10.0) -> None:
        self._stop = threading.Event()
        self._thread = None
        if isinstance(feed, JobFeed):
            self._thread = threading.Thread(target=self._run, args=(feed, every_s), name="feed-heartbeat",
                                            daemon=True)
            self._thread.start()

    def _run(self, feed: JobFeed, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                feed.actor.heartbeat.remote(feed.job)
            except Exception:  # noqa: BLE001 - the service is gone: nothing to keep alive
                return

    def close(self) -> None:
        self._stop.set()


def _actor_and_job(service: Any) -> tuple[Any, str]:
    if isinstance(service, JobFeed):
        return service.actor, service.job
    return service, DEFAULT_JOB


class FeedClient:
    """A worker's view of one dataset of the service: ``iter_pass(epoch)`` yields its share of the pass.

    Yields one-row Arrow tables (one packed batch each), as
    ``DataIterator.iter_batches(batch_size=1, batch_format="pyarrow")`` would;
    in steps mode one table per step, joined from its pieces. ``service``: the
    actor handle, or a :class:`JobFeed`. The next ``take`` is in flight while
    the current blocks are yielded.
    """

    def __init__(self, service: Any, name: str, rank: int) -> None:
        self.service, self.job = _actor_and_job(service)
        self.name = name
        self.rank = rank

    def iter_pass(self, epoch: int) -> Iterator[pa.Table]:
        import ray

        generation = ray.get(self.service.open.remote(self.name, epoch, self.rank, self.job))
        pending = self.service.take.remote(self.name, epoch, generation, self.rank, job=self.job)
        while True:
            blocks = ray.get(pending)
            if blocks is None:
                return
            pending = self.service.take.remote(self.name, epoch, generation, self.rank, job=self.job)
            if isinstance(blocks, str):  # _RETRY: nothing yet
                continue
            if blocks and isinstance(blocks[0], Step):
                yield from step_tables(blocks, ray.get)
                continue
            tables = ray.get([b.ref for b in blocks])
            for b, fetched in zip(blocks, tables, strict=True):
                table = b.rows_of(fetched)
                for i in range(table.num_rows):
                    yield table.slice(i, 1)


def read_feed_report(feed: Any, timeout_s: float = 10.0) -> FeedReport:
    """The feed service's report on this job (``feed``: the actor handle, or a :class:`JobFeed`), validated."""
    import ray

    actor, job = _actor_and_job(feed)
    return revalidate(ray.get(actor.describe.remote(job), timeout=timeout_s))
