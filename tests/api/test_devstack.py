"""``devstack.RayHead.stop``: a head that ignores SIGTERM is killed, process group and all, after its grace."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dlrm_platform.api import devstack


def _group_alive(pgid: int) -> bool:
    out = subprocess.run(["ps", "-o", "stat=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return any(not s.strip().startswith("Z") for s in out.splitlines() if s.strip())


def test_head_stop_kills_a_group_that_ignores_sigterm_after_its_grace() -> None:
    # A parent and a child that both ignore SIGTERM, like `ray start --block` and a GCS that linger.
    proc = subprocess.Popen(
        ["bash", "-c", "trap '' TERM; (trap '' TERM; sleep 300) & sleep 300"], start_new_session=True
    )
    time.sleep(0.3)
    head = devstack.RayHead(proc, "http://127.0.0.1:1", "127.0.0.1:1", None, {})
    started = time.monotonic()
    head.stop(grace_s=1.0)
    took = time.monotonic() - started
    assert proc.poll() is not None
    assert 1.0 <= took < 8.0, took
    deadline = time.monotonic() + 5.0
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "the head's child outlived its stop"


def test_free_ports_are_distinct_and_skip_the_excluded() -> None:
    taken = devstack.free_port()
    ports = devstack.free_ports(64, exclude={taken})
    assert len(set(ports)) == 64
    assert taken not in ports


def test_a_head_that_fails_to_start_says_why_from_its_log(tmp_path) -> None:
    # One port for the dashboard and the GCS: `ray start` refuses at once. The error must carry
    # the head log's reason, not only "exited with code 1".
    port = devstack.free_port()
    log = tmp_path / "ray-head.log"
    ray_tmp = Path(tempfile.mkdtemp(prefix="dlrmhead-", dir="/tmp"))  # Ray's socket paths must stay short
    try:
        with pytest.raises(RuntimeError, match=r"ray start exited with code \d+(?s:.*)used by other components"):
            devstack.start_ray_head(
                num_cpus=1, env={}, dashboard_port=port, gcs_port=port, temp_dir=ray_tmp, log_file=log, timeout_s=60
            )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
