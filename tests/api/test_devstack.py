"""``devstack.RayHead.stop``: a head that ignores SIGTERM is killed, process group and all, after its grace."""

from __future__ import annotations

import subprocess
import time

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
