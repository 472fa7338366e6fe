"""Fixtures of the job service's unit tests (fakes live in api_fakes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from api_fakes import Stack


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, max_running_jobs=2, max_running_per_user=1, default_max_retries=0)
    yield s
    s.close()
