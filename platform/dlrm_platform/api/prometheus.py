"""Prometheus metrics of the service, on a registry of its own (one per app)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "dlrm_api_requests_total", "HTTP requests", ["method", "route", "status"], registry=r
        )
        self.latency = Histogram(
            "dlrm_api_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.auth_failures = Counter("dlrm_api_auth_failures_total", "requests without a valid API key", registry=r)
        self.submitted = Counter("dlrm_jobs_submitted_total", "jobs accepted", registry=r)
        self.attempts = Counter("dlrm_job_attempts_total", "attempts submitted to Ray", registry=r)
        self.retries = Counter("dlrm_job_retries_total", "failed attempts queued again", registry=r)
        self.finished = Counter("dlrm_jobs_finished_total", "jobs that reached a final state", ["status"], registry=r)
        self.scheduler_errors = Counter("dlrm_scheduler_errors_total", "scheduler passes that raised", registry=r)
        self.last_tick = Gauge("dlrm_scheduler_last_pass_timestamp_seconds", "end of the last scheduler pass", registry=r)
        self.queue_depth = Gauge("dlrm_queue_depth", "queued jobs ready to start", registry=r)
        self.ray_up = Gauge("dlrm_ray_up", "1 when the Ray Jobs API answered the last call", registry=r)

    def add_job_counts(self, counts: Callable[[], dict[str, int]]) -> None:
        self.registry.register(_JobCounts(counts))

    def observe(self, method: str, route: str, status: int, started: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(time.perf_counter() - started)


class _JobCounts(Collector):
    def __init__(self, counts: Callable[[], dict[str, int]]):
        self._counts = counts

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from dlrm_platform.api.db import JobStatus

        g = GaugeMetricFamily("dlrm_jobs", "jobs in the database by status", labels=["status"])
        counts = self._counts()
        for status in JobStatus:
            g.add_metric([status.value], counts.get(status.value, 0))
        yield g
