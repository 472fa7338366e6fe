"""The install (scripts/install.sh, scripts/torch_index.py, requirements/) works off this machine.

* where the torch build comes from: the decision rule, and the script under a pip that
  sees a local wheel directory (this machine) or only an index without ``+cpu`` builds
  (a fresh machine: PyPI) - offline, with find-links directories;
* the GPU pins differ from the CPU pins only in the CUDA stack;
* both images' requirement sets resolve: pip's resolver in dry-run mode against the
  indexes pip is configured with (slow: ~1-2 min; needs those indexes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "torch_index.py"


def _load_torch_index():
    spec = importlib.util.spec_from_file_location("torch_index", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ti = _load_torch_index()
CPU_INDEX = ti.DEFAULT_INDEX_URLS["cpu"]


# --------------------------------------------------------------------------- the decision rule


def test_configured_indexes_with_the_cpu_build_add_nothing():
    # This machine: a find-links directory holds torch 2.13.0+cpu next to PyPI's builds.
    assert ti.choose_index_args("cpu", ["2.14.0", "2.13.0+cpu", "2.13.0"], CPU_INDEX) == []


def test_pypi_alone_gets_the_pytorch_cpu_index():
    # A fresh machine: PyPI offers 2.13.0 (its CUDA build) but never +cpu.
    assert ti.choose_index_args("cpu", ["2.15.0", "2.13.0", "2.12.1"], CPU_INDEX) == ["--extra-index-url", CPU_INDEX]
    # pip could not be asked (offline, no index): fall back too, the install then says what failed.
    assert ti.choose_index_args("cpu", None, CPU_INDEX) == ["--extra-index-url", CPU_INDEX]


def test_gpu_wants_a_build_that_is_not_cpu():
    gpu_index = ti.DEFAULT_INDEX_URLS["gpu"]
    assert ti.choose_index_args("gpu", ["2.13.0+cpu", "2.13.0"], gpu_index) == []
    assert ti.choose_index_args("gpu", ["2.13.0+cu130"], gpu_index) == []
    assert ti.choose_index_args("gpu", ["2.13.0+cpu", "2.12.0"], gpu_index) == ["--extra-index-url", gpu_index]
    assert not ti.matches("gpu", "2.13.0+cpu") and not ti.matches("cpu", "2.13.0")
    assert not ti.matches("cpu", "2.13.1+cpu") and ti.matches("cpu", "2.13.0+cpu")


def test_no_fallback_index_is_an_error_that_says_what_to_set():
    with pytest.raises(ti.TorchNotAvailable, match=r"TORCH_INDEX_URL.*download\.pytorch\.org/whl/cpu") as err:
        ti.choose_index_args("cpu", ["2.13.0", "2.12.0"], "")
    assert "builds found: 2.13.0)" in str(err.value)


def test_index_url_from_env():
    assert ti.index_url_from_env("cpu", {}) == CPU_INDEX
    assert ti.index_url_from_env("cpu", {"TORCH_INDEX_URL": "http://mirror/whl"}) == "http://mirror/whl"
    assert ti.index_url_from_env("cpu", {"TORCH_INDEX_URL": ""}) == ""  # set but empty: no fallback


def test_parse_pip_index_versions_output():
    out = "torch (2.15.0)\nAvailable versions: 2.15.0, 2.13.0+cpu, 2.13.0\n  INSTALLED: 2.13.0+cpu\n"
    assert ti.parse_available(out) == ["2.15.0", "2.13.0+cpu", "2.13.0"]
    assert ti.parse_available("ERROR: No matching distribution found for torch") == []


def test_requirements_are_valid_pip_specifiers():
    from packaging.requirements import Requirement

    cpu, gpu = Requirement(ti.wanted_requirement("cpu")), Requirement(ti.wanted_requirement("gpu"))
    assert cpu.specifier.contains("2.13.0+cpu") and not cpu.specifier.contains("2.13.0")
    assert gpu.specifier.contains("2.13.0") and gpu.specifier.contains("2.13.0+cu130")
    assert not gpu.specifier.contains("2.13.0+cpu")


# --------------------------------------------------------------------------- the script, with a real pip


def _run_script(kind: str, find_links: Path, extra_env: dict[str, str] | None = None):
    """scripts/torch_index.py under a pip that sees only ``find_links`` (no config files, no index, offline)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "TORCH_INDEX_URL"}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(find_links)})
    env.update(extra_env or {})
    return subprocess.run([sys.executable, str(SCRIPT), kind], capture_output=True, text=True, env=env, timeout=120)


def _wheel_dir(tmp_path: Path, *versions: str) -> Path:
    d = tmp_path / "wheels"
    d.mkdir()
    for v in versions:  # pip lists find-links candidates by file name; the content is never read here
        (d / f"torch-{v}-py3-none-any.whl").write_bytes(b"")
    return d


def test_script_with_a_local_wheel_directory_adds_no_index(tmp_path):
    out = _run_script("cpu", _wheel_dir(tmp_path, "2.13.0+cpu", "2.13.0"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []
    assert "from pip's configured indexes" in out.stderr


def test_script_without_the_cpu_build_adds_the_torch_index(tmp_path):
    out = _run_script("cpu", _wheel_dir(tmp_path, "2.13.0", "2.12.0"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["--extra-index-url", CPU_INDEX]
    # A user's mirror replaces the default fallback.
    out = _run_script("cpu", tmp_path / "wheels", {"TORCH_INDEX_URL": "http://mirror.example/whl/cpu"})
    assert out.stdout.split() == ["--extra-index-url", "http://mirror.example/whl/cpu"]


def test_script_fails_with_advice_when_the_fallback_is_off(tmp_path):
    out = _run_script("cpu", _wheel_dir(tmp_path, "2.13.0"), {"TORCH_INDEX_URL": ""})
    assert out.returncode == 1 and out.stdout == ""
    assert "set TORCH_INDEX_URL" in out.stderr


def test_install_sh_asks_the_script_and_uses_the_kinds_constraints():
    text = (REPO / "scripts" / "install.sh").read_text()
    subprocess.run(["bash", "-n", str(REPO / "scripts" / "install.sh")], check=True)
    assert "scripts/torch_index.py" in text and '"${TORCH_INDEX_ARGS[@]}"' in text
    assert "CONSTRAINTS=requirements/constraints-$KIND.txt" in text
    assert "constraints-cpu.txt\"" not in text  # no hard-coded CPU pins on the GPU path


# --------------------------------------------------------------------------- pins


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, spec = re.match(r"([A-Za-z0-9_.\-]+)(.*)", line).groups()
            pins[re.sub(r"[-_.]+", "-", name).lower()] = spec
    return pins


def test_gpu_pins_differ_from_cpu_pins_only_in_the_cuda_stack():
    cpu = _pins(REPO / "requirements" / "constraints-cpu.txt")
    gpu = _pins(REPO / "requirements" / "constraints-gpu.txt")
    assert cpu.pop("torch") == "==2.13.0+cpu" and cpu.pop("fbgemm-gpu-cpu") == "==1.8.0"
    assert gpu.pop("torch") == "==2.13.0,!=2.13.0+cpu" and gpu.pop("fbgemm-gpu") == "==1.8.0"
    assert gpu["torchrec"] == "==1.8.0"
    assert gpu == cpu, "requirements/constraints-gpu.txt must pin everything but the CUDA stack as the CPU file"


# --------------------------------------------------------------------------- both images resolve (pip dry run)

RESOLVE_TIMEOUT_S = 300
_UNREACHABLE = re.compile(r"NewConnectionError|Temporary failure in name resolution|Max retries exceeded|"
                          r"ConnectTimeout|ReadTimeout|Network is unreachable|Connection refused")


def _project_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["test"], *extras["postgres"]]  # the image's EXTRAS


def _dry_run(kind: str, out_dir: Path, requirements: list[str], *flags: str) -> tuple[subprocess.Popen, Path, Path]:
    report, log = out_dir / f"{kind}-report.json", out_dir / f"{kind}.log"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--disable-pip-version-check",
           "--progress-bar", "off", "--timeout", "20", "--retries", "1", "--report", str(report), *flags, *requirements]
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
    return proc, report, log


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory):
    """The CPU and GPU images' requirement sets, resolved side by side (what install.sh installs with EXTRAS)."""
    out = tmp_path_factory.mktemp("resolve")
    cpu_index = ti.choose_index_args("cpu", ti.available_versions(sys.executable), ti.index_url_from_env("cpu"))
    gpu_index = ti.choose_index_args("gpu", ti.available_versions(sys.executable), ti.index_url_from_env("gpu"))
    reqs = _project_requirements()
    runs = {
        "cpu": _dry_run("cpu", out, ["torch==2.13.0+cpu", "fbgemm-gpu-cpu==1.8.0", *reqs],
                        "-c", str(REPO / "requirements" / "constraints-cpu.txt"), *cpu_index),
        # install.sh puts torchrec in with --no-deps on CPU (its fbgemm-gpu dependency is the CUDA build).
        "cpu-torchrec": _dry_run("cpu-torchrec", out, ["torchrec==1.8.0"], "--no-deps"),
        "gpu": _dry_run("gpu", out, ["torch==2.13.0", "fbgemm-gpu==1.8.0", "torchrec==1.8.0", *reqs],
                        "-c", str(REPO / "requirements" / "constraints-gpu.txt"), *gpu_index),
    }
    yield runs
    for proc, _, _ in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _resolved(runs, kind: str) -> dict[str, str]:
    """name -> version pip would install for ``kind``; fails with pip's reason when it does not resolve."""
    proc, report, log = runs[kind]
    try:
        proc.wait(timeout=RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"pip's resolver did not finish the {kind} set in {RESOLVE_TIMEOUT_S} s: is the package index "
                    f"reachable and fast enough? (log: {log})")
    text = log.read_text()
    if proc.returncode != 0:
        tail = "\n".join(line for line in text.splitlines() if not line.startswith("WARNING: Location"))[-3000:]
        if _UNREACHABLE.search(text):
            pytest.fail(f"a package index pip is configured with is unreachable; this test resolves against "
                        f"the configured indexes (pip config list).\n{tail}")
        pytest.fail(f"the {kind} image's requirement set does not resolve:\n{tail}")
    data = json.loads(report.read_text())
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in data["install"]}


@pytest.mark.slow
def test_cpu_image_requirements_resolve(resolutions):
    got = _resolved(resolutions, "cpu")
    assert got["torch"] == "2.13.0+cpu"
    assert got["fbgemm-gpu-cpu"] == "1.8.0" and "fbgemm-gpu" not in got
    assert not any(name.startswith("nvidia-") for name in got), "CUDA libraries in the CPU image"
    assert got["ray"] == "2.60.0" and got["psycopg"]
    assert _resolved(resolutions, "cpu-torchrec") == {"torchrec": "1.8.0"}


@pytest.mark.slow
def test_gpu_image_requirements_resolve(resolutions):
    got = _resolved(resolutions, "gpu")
    assert got["torch"].startswith("2.13.0") and "+cpu" not in got["torch"], got["torch"]
    assert got["fbgemm-gpu"] == "1.8.0" and "fbgemm-gpu-cpu" not in got
    assert got["torchrec"] == "1.8.0" and got["ray"] == "2.60.0"
    cpu_pins = _pins(REPO / "requirements" / "constraints-cpu.txt")
    for name, version in got.items():  # every shared pin holds in the GPU image too
        if name in cpu_pins and name not in ("torch", "fbgemm-gpu-cpu"):
            assert cpu_pins[name] == f"=={version}", name
