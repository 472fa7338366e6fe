"""The source root `platform/` must never shadow Python's stdlib module `platform`."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_platform_dir_is_not_a_package():
    assert (REPO / "platform" / "dlrm_platform" / "__init__.py").is_file()
    assert not (REPO / "platform" / "__init__.py").exists(), (
        "platform/__init__.py shadows the stdlib module 'platform' (torch, ray, uvicorn, mlflow import it)"
    )


def test_import_platform_gives_stdlib_from_repo_root():
    # Run from the repo root, where `platform/` sits on sys.path[0].
    code = "import platform, sysconfig, os; print(platform.__file__); print(platform.python_version())"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    module_file, version = out.stdout.split()
    stdlib = Path(__import__("sysconfig").get_paths()["stdlib"]).resolve()
    assert Path(module_file).resolve().parent == stdlib
    assert version.count(".") == 2


def test_package_imports_without_starting_ray():
    code = "import dlrm_platform.cli, dlrm_platform.config, ray; print(ray.is_initialized())"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
