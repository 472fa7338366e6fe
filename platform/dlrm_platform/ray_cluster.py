"""Joining or starting the Ray cluster a command runs on (`run`, `analyze`, `dedup-convert`)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from dlrm_platform.config import RayClusterConfig

__all__ = ["IDLE_WORKER_KEEP_MS", "idle_worker_env", "local_system_config", "ray_session"]

# Ray kills an idle task worker after 1 s once the node runs more worker processes than it has CPUs (its
# soft limit; actors count, and a job runs several: the feed service, Ray Train's controller and workers,
# Ray Data's stats actor). A pipeline pass pauses longer than 1 s whenever the trainer is behind it (the
# feed service's bound holds it back), between passes (eval, checkpoint) and between epochs without the
# epoch cache, so on a small node every pass re-spawned its read tasks' workers: 1-2 CPU-seconds each on
# 2 cores (Python, Ray, pyarrow), taken from the trainer. Measured on the demo's plain pipeline with a
# 1-2 s pause before each warm epoch: 25k samples/s per data CPU at 1 s, 145k kept a minute.
IDLE_WORKER_KEEP_MS = int(RayClusterConfig.model_fields["idle_worker_keep_s"].default * 1000)
_IDLE_WORKER_SETTING = "idle_worker_killing_time_threshold_ms"


def local_system_config(idle_worker_keep_s: float = IDLE_WORKER_KEEP_MS / 1000) -> dict[str, int]:
    """Ray system settings for a cluster the platform starts itself (``ray.init(_system_config=...)``);
    ``idle_worker_keep_s``: ``ray.idle_worker_keep_s``."""
    return {_IDLE_WORKER_SETTING: int(idle_worker_keep_s * 1000)}


def idle_worker_env() -> dict[str, str]:
    """The same setting for ``ray start`` (Ray reads ``RAY_<setting>`` from the environment)."""
    return {f"RAY_{_IDLE_WORKER_SETTING}": str(IDLE_WORKER_KEEP_MS)}

log = logging.getLogger("dlrm_platform.job")  # the messages of the commands that use it
stage = logging.getLogger("dlrm_platform.stage")  # a run's stage lines (dlrm_platform.output.run_log)


@contextlib.contextmanager
def ray_session(cfg: RayClusterConfig, *, verbose: bool = False) -> Iterator[None]:
    """Connect to ``cfg.address`` (or $RAY_ADDRESS, as under `ray job submit`), else start a local cluster."""
    import ray

    if ray.is_initialized():  # a caller (a test, a notebook) owns the cluster
        yield
        return
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    kwargs: dict = {"logging_level": logging.INFO if verbose else logging.WARNING}
    if address:
        log.info("connecting to Ray at %s", address)
        ray.init(address=address, **kwargs)
    else:
        log.info("starting a local Ray cluster (%s CPUs)", cfg.num_cpus or "all")
        # address="local": never attach to some other Ray instance found on this machine.
        ray.init(address="local", num_cpus=cfg.num_cpus, _system_config=local_system_config(cfg.idle_worker_keep_s),
                 **kwargs)
    stage.info("Ray %s, %g CPUs", f"joined: {address}" if address else "started: local cluster",
               ray.cluster_resources().get("CPU", 0))
    try:
        yield
    finally:
        ray.shutdown()
