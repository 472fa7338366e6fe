#!/usr/bin/env bash
# Creates .venv from nothing and installs the pinned stack.
#   scripts/install.sh          CPU: torch 2.13.0+cpu, fbgemm-gpu-cpu 1.8.0, torchrec 1.8.0
#                               (requirements/constraints-cpu.txt)
#   GPU=1 scripts/install.sh    CUDA: torch 2.13.0 (CUDA build), fbgemm-gpu 1.8.0, torchrec 1.8.0
#                               (requirements/constraints-gpu.txt)
# Environment: PYTHON (default python3), VENV (default .venv), EXTRAS (the project's
# extras, default "test"), TORCH_INDEX_URL (where to find the torch build when pip's
# configured indexes lack it; default PyTorch's CPU index, or its CUDA index with GPU=1;
# see scripts/torch_index.py).
# torchrec declares an unpinned `fbgemm-gpu`; installed naively, the CUDA build
# overwrites fbgemm-gpu-cpu and `import torchrec` fails. So torchrec goes in
# with --no-deps and its own dependencies come from the constraints file.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
GPU=${GPU:-0}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test}
if [ "$GPU" = "1" ]; then KIND=gpu; else KIND=cpu; fi
CONSTRAINTS=requirements/constraints-$KIND.txt

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
LOG="$VENV/install.log"
# pip with its output kept in $LOG; the local index mirror's "Location ... ignored"
# warnings and torchrec's expected missing-fbgemm-gpu complaint are filtered out.
pip_install() {
  if ! "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" >"$LOG" 2>&1; then
    grep -v "^WARNING: Location" "$LOG" >&2
    echo "[install] pip $* failed (full log: $LOG)" >&2
    exit 1
  fi
  grep -vE "^WARNING: Location|torchrec 1.8.0 requires fbgemm-gpu|dependency resolver does not currently" "$LOG" || true
}

# One known pip everywhere (Python 3.11 ships 23.x): the same resolver and `pip index versions`
# output on every machine, and index pages evaluated ~3x faster than 23.x does.
PIP_VERSION=26.3
if [ "$("$VENV/bin/python" -m pip --version | cut -d' ' -f2)" != "$PIP_VERSION" ]; then
  pip_install install "pip==$PIP_VERSION"
fi

# Where the torch build comes from: pip's configured indexes when they have it,
# else $TORCH_INDEX_URL (scripts/torch_index.py decides; it prints the extra pip args).
TORCH_INDEX_ARGS=()
read -r -d '' -a TORCH_INDEX_ARGS < <("$VENV/bin/python" scripts/torch_index.py "$KIND" && printf '\0') \
  || { echo "[install] could not locate the torch build (see the message above)" >&2; exit 1; }

if [ "$KIND" = "gpu" ]; then
  pip_install install -c "$CONSTRAINTS" "${TORCH_INDEX_ARGS[@]}" "torch==2.13.0" "fbgemm-gpu==1.8.0"
  "$VENV/bin/python" -m pip uninstall -y -q fbgemm-gpu-cpu >/dev/null 2>&1 || true
else
  pip_install install -c "$CONSTRAINTS" "${TORCH_INDEX_ARGS[@]}" "torch==2.13.0+cpu" "fbgemm-gpu-cpu==1.8.0"
  # A previous naive install may have left the CUDA fbgemm-gpu behind.
  if "$VENV/bin/python" -m pip show fbgemm-gpu >/dev/null 2>&1; then
    echo "[install] removing CUDA fbgemm-gpu and restoring fbgemm-gpu-cpu"
    pip_install uninstall -y fbgemm-gpu
    pip_install install --force-reinstall --no-deps "${TORCH_INDEX_ARGS[@]}" "fbgemm-gpu-cpu==1.8.0"
  fi
fi
pip_install install --no-deps "torchrec==1.8.0"
pip_install install -c "$CONSTRAINTS" -e ".[$EXTRAS]"

# Verify: the right builds, and torchrec imports (the naive-install failure mode).
"$VENV/bin/python" - "$GPU" <<'PY'
import importlib.metadata as md, sys
gpu = sys.argv[1] == "1"
names = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}
import torch, torchrec, dlrm_platform  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
if gpu:
    assert "+cpu" not in torch.__version__, f"GPU install got the CPU build {torch.__version__}"
    assert "fbgemm-gpu" in names and "fbgemm-gpu-cpu" not in names, names
else:
    assert "+cpu" in torch.__version__, torch.__version__
    assert "fbgemm-gpu-cpu" in names and "fbgemm-gpu" not in names, "CUDA fbgemm-gpu present"
print(f"[install] ok: torch {torch.__version__}, torchrec {md.version('torchrec')}, "
      f"fbgemm {'gpu' if gpu else 'cpu'} {md.version('fbgemm-gpu' if gpu else 'fbgemm-gpu-cpu')}")
PY
