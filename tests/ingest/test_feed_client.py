"""The job's side of the feed service, without a Ray cluster: what it reads back is the typed report, validated."""

from __future__ import annotations

import pickle

import pytest
import ray
from feed_fakes import FakeDataset

from dlrm_platform.config import ConfigError
from dlrm_platform.ingest.feed_client import JobFeed, read_feed_report
from dlrm_platform.ingest.feed_report import FeedReport
from dlrm_platform.ingest.feed_service import FeedService


class _Describe:
    """Stands in for the actor's method: ``remote(job)`` gives what Ray would hand back (a pickled copy)."""

    def __init__(self, describe) -> None:
        self.asked: list[str] = []
        self._describe = describe

    def remote(self, job: str):
        self.asked.append(job)
        return pickle.loads(pickle.dumps(self._describe(job)))


class _Actor:
    def __init__(self, describe) -> None:
        self.describe = _Describe(describe)


def test_the_report_comes_back_typed_for_the_job_that_asks(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    service = FeedService({"train": FakeDataset("train", blocks=3)}, retain_bytes=1000)
    service.attach("a", consumers=1)
    gen = service.open("train", 0, 0, "a")
    while service.take("train", 0, gen, 0, job="a") is not None:
        pass
    actor = _Actor(service.describe)
    report = read_feed_report(JobFeed(actor, "a"))
    assert isinstance(report, FeedReport) and report == service.describe("a")
    assert report.passes[0].rows == 12 and report.sharing.cpu_s_paid == pytest.approx(1.5)
    assert read_feed_report(actor).passes == []  # the service's own job ("") read nothing
    assert actor.describe.asked == ["a", ""]


def test_a_report_that_does_not_validate_is_refused(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    broken = FeedReport.model_construct(passes="not a list", sharing=None)  # past validation, as a stale pickle
    with pytest.raises(ConfigError, match="FeedReport"):
        read_feed_report(_Actor(lambda job: broken))
