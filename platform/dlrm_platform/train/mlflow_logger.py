"""Worker-side MLflow logging: rank 0 logs into the run the driver created.

The driver (``dlrm_platform.mlflow_run``) creates the store and the run and
passes its id and URI to the workers. Here, per-step metrics are buffered and
sent in one ``MlflowClient.log_batch`` request every ``log_every_steps``
steps; per-epoch metrics are sent at once. Without a run id (or on ranks
other than 0) :class:`NullTracker` keeps the loop free of conditionals.

Outages. Tracking must never stop training, nor lose metrics silently. The
requests go out on a sender thread: :meth:`MlflowTracker.flush` waits for them
only while the server answers. When it does not (stopped, restarting,
unreachable), metrics stay buffered (up to ``max_buffered``, oldest dropped
first and counted) and the sender retries with backoff; when the server comes
back the buffer is flushed in order. :meth:`MlflowTracker.close` at the end of
training says which metrics, if any, never reached the server.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["LostMetrics", "MlflowTracker", "NullTracker", "Tracker", "make_tracker"]

log = logging.getLogger(__name__)

# MLflow accepts at most 1000 metrics per log_batch request.
_MAX_METRICS_PER_BATCH = 1000


@dataclass
class LostMetrics:
    """Metrics that never reached the MLflow server: how many of each name, and the steps they span."""

    counts: Counter = field(default_factory=Counter)
    first_step: int | None = None
    last_step: int | None = None

    def add(self, metrics: list) -> None:
        for m in metrics:
            self.counts[m.key] += 1
            self.first_step = m.step if self.first_step is None else min(self.first_step, m.step)
            self.last_step = m.step if self.last_step is None else max(self.last_step, m.step)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def describe(self) -> str:
        if not self.total:
            return "none"
        names = ", ".join(f"{k} x{n}" for k, n in sorted(self.counts.items()))
        return f"{self.total} metrics of steps {self.first_step}-{self.last_step} ({names})"


class NullTracker:
    """Accepts everything, logs nothing."""

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def log_epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, timeout_s: float = 60.0) -> LostMetrics:
        return LostMetrics()


class MlflowTracker(NullTracker):
    """Logs to an existing MLflow run; step metrics are buffered until :meth:`flush` (see the module docstring).

    ``flush_wait_s``: how long :meth:`flush` waits for the server before training goes on (the metrics stay
    buffered); ``max_buffered``: metrics kept while the server is away; ``retry_s``: the longest pause
    between the sender's attempts during an outage.
    """

    def __init__(self, tracking_uri: str, run_id: str, *, max_buffered: int = 200_000,
                 flush_wait_s: float = 10.0, retry_s: float = 15.0, client=None) -> None:
        if client is None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri)
        self._client = client
        self._uri = tracking_uri
        self._run_id = run_id
        self._max_buffered = int(max_buffered)
        self._flush_wait_s = flush_wait_s
        self._retry_s = retry_s
        self._pending: list = []
        self._lost = LostMetrics()
        self._cond = threading.Condition()
        self._requested = 0  # flush requests made ...
        self._served = 0  # ... and the latest one whose metrics have all been sent
        self._failing_since: float | None = None
        self._closing = False
        self._sender = threading.Thread(target=self._send_loop, name="mlflow-sender", daemon=True)
        self._sender.start()

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self._cond:
            self._pending.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
            overflow = len(self._pending) - self._max_buffered
            if overflow > 0:  # the server has been away for long: keep the newest, count the rest
                self._lost.add(self._pending[:overflow])
                del self._pending[:overflow]

    def log_epoch(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self.log_step(epoch, metrics)
        self.flush()

    def flush(self) -> None:
        """Send what is buffered; wait for it only while the server answers (at most ``flush_wait_s``)."""
        self._request_and_wait(0.0 if self._failing_since is not None else self._flush_wait_s)

    def close(self, timeout_s: float = 60.0) -> LostMetrics:
        """Flush, waiting up to ``timeout_s`` for an absent server; report what never reached it."""
        self._request_and_wait(timeout_s)
        with self._cond:
            self._closing = True
            self._lost.add(self._pending)
            self._pending = []
            self._cond.notify_all()
            lost = self._lost
        if lost.total:
            log.warning("MLflow at %s did not take every metric of run %s: lost %s", self._uri, self._run_id,
                        lost.describe())
        return lost

    @property
    def buffered(self) -> int:
        with self._cond:
            return len(self._pending)

    def _request_and_wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._requested += 1
            ticket = self._requested
            self._cond.notify_all()
            while self._served < ticket and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def _send_loop(self) -> None:
        backoff = 0.5
        while True:
            with self._cond:
                while self._served >= self._requested and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                ticket = self._requested
                batch = list(self._pending)
                resend = self._failing_since is not None
            try:
                if resend:  # a request the server took before it went away must not be logged twice
                    batch = self._not_yet_logged(batch)
                for i in range(0, len(batch), _MAX_METRICS_PER_BATCH):
                    self._client.log_batch(self._run_id, metrics=batch[i : i + _MAX_METRICS_PER_BATCH])
                    with self._cond:  # sent: out of the buffer (the overflow may have dropped some meanwhile)
                        self._drop_sent(batch[i : i + _MAX_METRICS_PER_BATCH])
            except Exception as err:  # noqa: BLE001 - tracking must never kill training
                with self._cond:
                    if self._failing_since is None:
                        self._failing_since = time.monotonic()
                        log.warning("MLflow at %s is not answering (%s): training goes on, %d metrics buffered "
                                    "and retried", self._uri, _short(err), len(self._pending))
                    resume = time.monotonic() + min(backoff, self._retry_s)
                    while not self._closing and time.monotonic() < resume:  # flushes meanwhile just buffer
                        self._cond.wait(resume - time.monotonic())
                backoff = min(backoff * 2, self._retry_s)
                continue
            with self._cond:
                if self._failing_since is not None:
                    log.warning("MLflow at %s is back after %.0f s: buffered metrics sent", self._uri,
                                time.monotonic() - self._failing_since)
                    self._failing_since = None
                backoff = 0.5
                self._served = max(self._served, ticket)
                self._cond.notify_all()

    def _not_yet_logged(self, batch: list) -> list:
        """``batch`` less the points the server already holds (same key, step, timestamp and value)."""
        if not batch:
            return batch
        first = min(m.step for m in batch)
        # The whole history per key, filtered here: MLflow 3.17's client has no step range for a metric's
        # history (``MlflowClient.get_metric_history(run_id, key)`` only). The server's one ranged read,
        # the UI's ``/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval`` (start_step/end_step),
        # is not a client API and returns a *sample* of at most ``max_results`` steps, so it cannot tell
        # which points are held. This runs only on a resend after a failed send (one read per key).
        held = set()
        for key in {m.key for m in batch}:
            held.update((key, h.step, h.timestamp, h.value) for h in self._client.get_metric_history(self._run_id, key)
                        if h.step >= first)
        logged = [m for m in batch if (m.key, m.step, m.timestamp, m.value) in held]
        if logged:
            with self._cond:
                self._drop_sent(logged)
        return [m for m in batch if (m.key, m.step, m.timestamp, m.value) not in held]

    def _drop_sent(self, sent: list) -> None:
        ids = {id(m) for m in sent}
        self._pending = [m for m in self._pending if id(m) not in ids]


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:160]}" if text else type(err).__name__


Tracker = NullTracker


def make_tracker(tracking_uri: str | None, run_id: str | None, rank: int) -> Tracker:
    """An :class:`MlflowTracker` on rank 0 when a run is given, else a :class:`NullTracker`."""
    if rank != 0 or not run_id or not tracking_uri:
        return NullTracker()
    # The sender retries on its own, with backoff; MLflow's default 7 retries per request would keep it
    # from seeing a restarted server for ~2 minutes. A training worker's process: no one else's setting.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    return MlflowTracker(tracking_uri, run_id)
