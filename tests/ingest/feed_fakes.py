"""Fake Ray Data datasets for the feed service's unit tests (tests/ingest/test_feed_service.py, test_feed_steps.py):
``iter_internal_ref_bundles`` over named blocks, with the metadata the service reads."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ray.data import DataContext


@dataclass
class FakeStats:
    cpu_time_s: float


@dataclass
class FakeMeta:
    num_rows: int
    size_bytes: int
    exec_stats: FakeStats | None = None


@dataclass
class FakeEntry:
    ref: str
    metadata: FakeMeta


@dataclass
class FakeBundle:
    blocks: tuple
    slices: tuple | None = None


class FakeDataset:
    """Blocks named ``<name>-x<execution>-b<i>``; counts executions and blocks pulled; optional delay or failure."""

    def __init__(self, name: str, blocks: int, rows: int = 4, nbytes: int = 100, delay_s: float = 0.0,
                 fail_at: int | None = None, cpu_s: float = 0.5) -> None:
        self.context = DataContext()
        self.name, self.n, self.rows, self.nbytes = name, blocks, rows, nbytes
        self.delay_s, self.fail_at, self.cpu_s = delay_s, fail_at, cpu_s
        self.executions = 0
        self.pulled = 0

    def iter_internal_ref_bundles(self):
        self.executions += 1
        execution = self.executions
        for i in range(self.n):
            if self.fail_at == i:
                raise OSError(f"{self.name}: shard {i} unreadable")
            time.sleep(self.delay_s)
            self.pulled += 1
            meta = FakeMeta(self.rows, self.nbytes, FakeStats(self.cpu_s))
            yield FakeBundle((FakeEntry(f"{self.name}-x{execution}-b{i}", meta),))
