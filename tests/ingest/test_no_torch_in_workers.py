"""Ray Data workers import the ingest operators' modules: they must not pull in torch.

Importing torch + torchrec costs 3-9 s per process on 2 cores; every Ray Data
worker that ran a transform paid it before the first block of an epoch could
move (the cold start that made the demo wait for its data).
"""

import subprocess
import sys

import pytest

INGEST_MODULES = [
    "dlrm_platform.ingest.transforms",
    "dlrm_platform.ingest.batching",
    "dlrm_platform.ingest.dedup_batching",
    "dlrm_platform.ingest.dedup_storage",
    "dlrm_platform.ingest.dedup_convert",
    "dlrm_platform.ingest.dedup_sessions",
    "dlrm_platform.ingest.dedup_operators",
    "dlrm_platform.ingest.pipeline",
    "dlrm_platform.ingest.fused",
    "dlrm_platform.ingest.feed_service",  # the feed service's actor
    "dlrm_platform.ingest.feed_client",
    "dlrm_platform.train.feed",
]


@pytest.mark.parametrize("module", INGEST_MODULES)
def test_ingest_module_imports_without_torch(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'torchrec') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"importing {module} imported {out.strip()}"
