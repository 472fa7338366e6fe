"""Shared fixtures for Ray-backed tests: one local cluster per test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for the module (4 logical CPUs on 2 cores: room for data and trainers)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING")
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()
