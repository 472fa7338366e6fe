#!/usr/bin/env bash
# Entry point for `ray job submit`: `dlrm-platform run CONFIG [--set k=v ...]` with the
# interpreter of the project's environment (not whatever `python` is on the PATH).
#
#   ray job submit --address http://127.0.0.1:8265 \
#       --runtime-env configs/ray_job/runtime_env.yaml \
#       -- "$PWD/configs/ray_job/entrypoint.sh" configs/demo.yaml
#
# Relative paths (the config, data.path) resolve against the project root.
# DLRM_PYTHON overrides the interpreter (e.g. /app/.venv/bin/python in the image).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${DLRM_PYTHON:-$ROOT/.venv/bin/python}"
if [ "$#" -lt 1 ]; then
  echo "usage: entrypoint.sh CONFIG [--set key=value ...] [--summary-json PATH]" >&2
  exit 2
fi
cd "$ROOT"
exec "$PY" -m dlrm_platform.cli run "$@"
