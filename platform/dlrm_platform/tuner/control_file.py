"""Small JSON files a running pipeline's tasks poll: the benchmark's cost multipliers and the
tuner's rows per block (``spec.BlockRowsSpec``). Written whole by rename, so a task never reads
half a file; read through a cache keyed on the file's stat, so a task pays one ``stat`` when
nothing changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

_CACHE: dict[str, tuple[tuple[int, int, int], dict]] = {}


def write_control(path: str | Path, data: dict) -> None:
    """Replace the control file at ``path`` with ``data`` (atomically)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_control(path: str | None) -> dict:
    """The control file's JSON, re-read when it changed; ``{}`` without one."""
    if not path:
        return {}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    cached = _CACHE.get(path)
    if cached is None or cached[0] != stamp:
        try:
            data = json.loads(Path(path).read_text() or "{}")
        except (OSError, ValueError):
            data = cached[1] if cached else {}
        cached = _CACHE[path] = (stamp, data)
    return cached[1]
