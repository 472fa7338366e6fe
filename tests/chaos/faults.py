"""Faults injected from outside the code under test, at points a seeded schedule picks.

The platform has no fault hooks: these helpers find a process the way an
operator (or a node failure) would, by what it runs, and kill it with a
signal. Ray names its worker processes after what they run (``ray::RayTrainWorker``
for a training worker, ``ray::MapBatches(...)`` for a Ray Data task), which
shows in ``/proc/<pid>/cmdline``.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class FaultSchedule:
    """Where faults land, drawn from ``seed`` (a failing seed reproduces the run), and what was injected."""

    seed: int
    injected: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def pick(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``."""
        return self._rng.randint(lo, hi)

    def choice(self, items: list[T]) -> T:
        return self._rng.choice(items)

    def record(self, kind: str, **details: Any) -> None:
        self.injected.append({"kind": kind, "seed": self.seed, "at_s": round(time.time(), 3), **details})


def processes(title_prefix: str) -> list[int]:
    """Pids of this user's processes whose command line (Ray's process title) starts with ``title_prefix``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode(errors="replace").startswith(title_prefix):
            pids.append(int(proc.name))
    return sorted(pids)


def kill(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to ``pid``; False if it was already gone."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
