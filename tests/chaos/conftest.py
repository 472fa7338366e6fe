"""One local Ray cluster per chaos test module (4 logical CPUs on 2 cores: room for data and two trainers)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def chaos_cluster():
    import ray
    from ray.data import DataContext

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING")
    DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()
