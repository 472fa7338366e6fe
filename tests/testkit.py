"""Helpers shared by the test suites (tests/integration, tests/chaos, benchmarks/chaos.py).

Importable as ``testkit`` from any test: pytest's default (prepend) import mode
puts ``tests/`` on ``sys.path`` when it loads ``tests/conftest.py``, and
``benchmarks/chaos.py`` adds it itself.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def benchmark_module(script: str) -> Iterator[ModuleType]:
    """Import ``benchmarks/<script>.py`` as a module for its unit tests; registered in ``sys.modules`` while in
    use (its dataclasses look their module up) and removed after."""
    name = f"{script}_bench"
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(name, None)


def wait_for(what: str, probe: Callable[[], T], timeout_s: float, interval_s: float = 0.05) -> T:
    """Poll ``probe`` until it returns something truthy and return that; after ``timeout_s`` raise
    ``TimeoutError`` naming ``what`` and the probe's last value."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")


#: tries at starting a local Ray cluster (a start that timed out under load gets another)
STARTUP_ATTEMPTS = 2


@contextlib.contextmanager
def local_ray(num_cpus: int = 4, **init: Any) -> Iterator[Any]:
    """A fresh local Ray cluster (any running one is shut down first) with Ray Data's progress bars off;
    yields the ``ray`` module and shuts the cluster down on exit. ``init``: more ``ray.init`` arguments."""
    import ray
    from ray.data import DataContext

    if ray.is_initialized():
        ray.shutdown()
    from dlrm_platform.ray_cluster import local_system_config

    # The settings `dlrm-platform run` gives the local cluster it starts: the tests run what users run.
    args = {"address": "local", "num_cpus": num_cpus, "include_dashboard": False,
            "logging_level": "WARNING", "_system_config": local_system_config(), **init}
    for attempt in range(STARTUP_ATTEMPTS):
        try:
            ray.init(**args)
            break
        except Exception as e:
            # Ray gives a raylet 30 s to register (not configurable). Under `make test TEST_WORKERS=2`
            # (two processes) on 2 cores one once took longer, while the other process's chaos tests
            # were killing workers: a fresh start, not a failed test, is what that calls for.
            if "timed out during startup" not in str(e) or attempt + 1 == STARTUP_ATTEMPTS:
                raise
            ray.shutdown()
            time.sleep(5.0)
    DataContext.get_current().enable_progress_bars = False
    try:
        yield ray
    finally:
        ray.shutdown()
