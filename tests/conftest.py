"""Suite-wide test settings: the Hypothesis profiles of the fuzz tests (see tests/fuzzing.py), and the
one local Ray cluster per test module that the Ray-backed tests share (tests/integration, tests/chaos)."""

from __future__ import annotations

import atexit
import os
import sys

import pytest
from hypothesis import settings

from fuzzing import CHAOS_EXAMPLES, CHAOS_PROFILE
from testkit import local_ray

# Code that reaches Ray outside a fixture must fail here, not start a stray local cluster from whichever thread
# touched Ray first: a feed service's lease thread once did, in a unit test; that cluster died under a later
# test and Ray ended the whole pytest process 60 s later ("Failed to connect to GCS"), with no summary.
os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"

# Under pytest-xdist (`make test TEST_WORKERS=2`) each test process runs its own Ray clusters. Ray records
# "the latest cluster" in <temp dir>/ray/ray_current_cluster, and whatever resolves an address on its own
# (the state API, Ray Train's placement-group cleaner) reads it: with one temp dir per machine a test reached
# the other process's cluster.
# One temp dir per test process; the processes a test starts (CLI jobs, `ray start`) inherit it.
if os.environ.get("PYTEST_XDIST_WORKER") and "RAY_TMPDIR" not in os.environ:
    os.environ["RAY_TMPDIR"] = f"/tmp/ray-{os.environ['PYTEST_XDIST_WORKER']}"

# Ray's native threads (GCS client, gRPC event engine) outlive ray.shutdown(), and after dozens of local clusters
# in one process CPython's finalization once crashed on them: SIGSEGV after "863 passed", so CI failed a green run.
# Once pytest has reported, the process ends with pytest's own exit status and skips that finalization.
# atexit runs the handlers registered after this one first (Ray's, MLflow's), then this.
_pytest_exit_status: list[int] = []


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int):
    yield
    _pytest_exit_status[:] = [int(session.exitstatus)]


def _exit_without_finalization() -> None:
    if _pytest_exit_status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_pytest_exit_status[0])


atexit.register(_exit_without_finalization)

# `pytest --hypothesis-profile=chaos` (or DLRM_HYPOTHESIS_PROFILE=chaos): 600+ inputs per fuzz test.
settings.register_profile(CHAOS_PROFILE, max_examples=CHAOS_EXAMPLES, deadline=None, print_blob=True)
if os.environ.get("DLRM_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["DLRM_HYPOTHESIS_PROFILE"])


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for the module (4 logical CPUs on 2 cores: room for data and trainers)."""
    with local_ray(num_cpus=4) as ray:
        yield ray
