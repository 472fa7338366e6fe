#!/usr/bin/env python3
"""Where pip finds the torch build the install needs (used by scripts/install.sh).

    python scripts/torch_index.py cpu|gpu     prints the extra pip arguments for the torch install
                                              (one per line; nothing when none are needed)

The CPU install pins ``torch==2.13.0+cpu``. PyPI does not host ``+cpu`` builds;
the PyTorch CPU wheel index does. Some machines already provide the build
through their own pip configuration (a find-links directory, a mirror), and
some reach no host but their configured indexes. So the rule is:

1. ask pip which torch versions the *configured* indexes and find-links offer
   (``pip index versions torch``: reads index pages, downloads no wheel);
2. if the wanted build is among them, add nothing (pip never contacts another host);
3. otherwise add ``--extra-index-url $TORCH_INDEX_URL`` (default: PyTorch's CPU
   index for cpu, its CUDA 13.0 index for gpu, the CUDA build PyPI's own
   ``torch==2.13.0`` wheels use). ``TORCH_INDEX_URL=''`` turns the fallback off:
   then a missing build is an error that says what to set.

The GPU install wants a CUDA build: any ``2.13.0`` whose local label is not
``cpu`` (PyPI's plain ``2.13.0`` is the CUDA build).

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

TORCH_VERSION = "2.13.0"
DEFAULT_INDEX_URLS = {
    "cpu": "https://download.pytorch.org/whl/cpu",
    "gpu": "https://download.pytorch.org/whl/cu130",
}
ENV_VAR = "TORCH_INDEX_URL"


class TorchNotAvailable(RuntimeError):
    """The wanted torch build is in no configured index and there is no fallback index."""


def wanted_requirement(kind: str) -> str:
    """The torch requirement of an install kind (``cpu`` or ``gpu``)."""
    if kind == "cpu":
        return f"torch=={TORCH_VERSION}+cpu"
    if kind == "gpu":
        return f"torch=={TORCH_VERSION},!={TORCH_VERSION}+cpu"
    raise ValueError(f"install kind must be 'cpu' or 'gpu', got {kind!r}")


def matches(kind: str, version: str) -> bool:
    """Whether ``version`` (as pip lists it) is the build ``kind`` needs."""
    public, _, local = version.strip().partition("+")
    if public != TORCH_VERSION:
        return False
    return local == "cpu" if kind == "cpu" else local != "cpu"


def parse_available(pip_output: str) -> list[str]:
    """The versions in the ``Available versions: a, b, ...`` line of ``pip index versions``."""
    m = re.search(r"^Available versions:\s*(.*)$", pip_output, re.MULTILINE)
    if not m:
        return []
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def choose_index_args(kind: str, available: list[str] | None, index_url: str) -> list[str]:
    """Extra pip arguments for installing ``kind``'s torch.

    ``available``: what the configured indexes offer (``None``: pip could not be asked).
    ``index_url``: the fallback index ('' for none).
    """
    if available and any(matches(kind, v) for v in available):
        return []
    if index_url:
        return ["--extra-index-url", index_url]
    seen = ", ".join(v for v in (available or []) if v.startswith(TORCH_VERSION)) or "none"
    raise TorchNotAvailable(
        f"{wanted_requirement(kind)} is not in pip's configured indexes (torch {TORCH_VERSION} builds found: "
        f"{seen}) and {ENV_VAR} is empty; set {ENV_VAR} to a PyTorch wheel index, e.g. "
        f"{DEFAULT_INDEX_URLS[kind]} (or a mirror of it), or add the wheel to pip's find-links"
    )


def available_versions(python: str = sys.executable, timeout_s: float = 120.0) -> list[str] | None:
    """torch versions pip's configured indexes and find-links offer this interpreter; None if pip failed."""
    cmd = [python, "-m", "pip", "index", "versions", "torch", "--disable-pip-version-check",
           "--timeout", "30", "--retries", "2"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return parse_available(out.stdout)


def index_url_from_env(kind: str, environ: dict[str, str] | os._Environ = os.environ) -> str:
    """``$TORCH_INDEX_URL`` when set (even to ''), else the default fallback of ``kind``."""
    return environ[ENV_VAR] if ENV_VAR in environ else DEFAULT_INDEX_URLS[kind]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in DEFAULT_INDEX_URLS:
        print("usage: torch_index.py cpu|gpu", file=sys.stderr)
        return 2
    kind = argv[0]
    available = available_versions()
    try:
        args = choose_index_args(kind, available, index_url_from_env(kind))
    except TorchNotAvailable as err:
        print(f"[install] {err}", file=sys.stderr)
        return 1
    where = f"adding {args[1]} ({ENV_VAR})" if args else "from pip's configured indexes"
    print(f"[install] {wanted_requirement(kind)}: {where}", file=sys.stderr)
    print("\n".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
