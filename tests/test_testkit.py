"""The shared test cluster helpers (tests/testkit.py, tests/conftest.py): a Ray start that times out under
load is tried once more, any other failure is not; each pytest-xdist process keeps its own Ray temp dir."""

from __future__ import annotations

import os

import pytest
import ray

import testkit


class _FakeRay:
    def __init__(self, failures: list[Exception]):
        self.failures = failures
        self.inits = 0
        self.shutdowns = 0

    def init(self, **kwargs):
        self.inits += 1
        assert kwargs["address"] == "local"
        if self.failures:
            raise self.failures.pop(0)

    def shutdown(self):
        self.shutdowns += 1


@pytest.fixture
def fake_ray(monkeypatch):
    def make(failures: list[Exception]) -> _FakeRay:
        fake = _FakeRay(failures)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray, "init", fake.init)
        monkeypatch.setattr(ray, "shutdown", fake.shutdown)
        monkeypatch.setattr(testkit.time, "sleep", lambda s: None)
        return fake
    return make


def test_a_ray_start_that_timed_out_is_tried_once_more(fake_ray):
    fake = fake_ray([Exception("The current node timed out during startup. This could happen ...")])
    with testkit.local_ray(num_cpus=2):
        assert fake.inits == 2 and fake.shutdowns == 1
    assert fake.shutdowns == 2


def test_a_ray_start_that_times_out_every_time_fails(fake_ray):
    fake = fake_ray([Exception("timed out during startup")] * testkit.STARTUP_ATTEMPTS)
    with pytest.raises(Exception, match="timed out during startup"):
        with testkit.local_ray(num_cpus=2):
            pass
    assert fake.inits == testkit.STARTUP_ATTEMPTS


def test_any_other_start_failure_is_not_retried(fake_ray):
    fake = fake_ray([ValueError("num_cpus must be >= 0")])
    with pytest.raises(ValueError, match="num_cpus"):
        with testkit.local_ray(num_cpus=2):
            pass
    assert fake.inits == 1


def test_each_xdist_process_has_its_own_ray_temp_dir():
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # one process: Ray's default temp dir, unless the user set one
        assert not os.environ.get("RAY_TMPDIR", "").startswith("/tmp/ray-gw")
    else:
        assert os.environ["RAY_TMPDIR"] == f"/tmp/ray-{worker}"
