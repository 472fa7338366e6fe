"""The suite's hard exit (tests/conftest.py) keeps pytest's exit status: a green run exits 0, a red one 1,
in one process and under pytest-xdist (`make test TEST_WORKERS=2` runs the suite in worker processes, each
exiting hard)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one_process", "xdist"])
@pytest.mark.parametrize(("body", "status"), [("assert True", 0), ("assert False", 1)])
def test_exit_status_is_pytests_own(tmp_path: Path, body: str, status: int, workers: list[str]) -> None:
    (tmp_path / "test_one.py").write_text(f"def test_one():\n    {body}\n")
    # An atexit handler registered before the suite's conftest runs only if CPython's finalization runs.
    code = ("import atexit, sys; atexit.register(lambda: print('FINALIZED'));"
            "import pytest; sys.exit(pytest.main(['-q', '-p', 'conftest', '-p', 'no:cacheprovider', *sys.argv[2:],"
            " sys.argv[1]]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "test_one.py"), *workers], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == status, done.stdout + done.stderr
    assert ("1 passed" if status == 0 else "1 failed") in done.stdout
    assert "FINALIZED" not in done.stdout
