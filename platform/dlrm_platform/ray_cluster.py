"""Joining or starting the Ray cluster a command runs on (`run`, `analyze`, `dedup-convert`)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from dlrm_platform.config import RayClusterConfig

__all__ = ["ray_session"]

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
        ray.init(address="local", num_cpus=cfg.num_cpus, **kwargs)
    stage.info("Ray %s, %g CPUs", f"joined: {address}" if address else "started: local cluster",
               ray.cluster_resources().get("CPU", 0))
    try:
        yield
    finally:
        ray.shutdown()
