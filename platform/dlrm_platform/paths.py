"""Keeping the paths of a job config inside the configured data and output roots.

The job service (``dlrm_platform.api``) runs configs that users send. Their
paths must not reach outside the roots the service is configured with
(``DLRM_API_DATA_ROOTS``, ``DLRM_API_OUTPUT_ROOTS``): no ``..`` component, no
absolute path elsewhere, no symbolic link that leads out. The service checks
every request; it also passes the roots to the job (``DLRM_DATA_ROOTS``,
``DLRM_OUTPUT_ROOTS``, :data:`os.pathsep`-separated), which checks again
before it starts anything (a symlink may have been swapped in since).
Without roots (a user running ``dlrm-platform run`` by hand) nothing is
confined.

Inputs (``data.path``, its dedup copy, ``tuner.policy_path``) must lie under
a data root; outputs (``tracking.runs_dir``, ``train.storage_path``,
``train.resume_from``, ``ingest.cache.spill_dir``) under an output root.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlrm_platform.errors import UserError

__all__ = [
    "DATA_ROOTS_ENV",
    "OUTPUT_ROOTS_ENV",
    "PathEscapeError",
    "PathProblem",
    "check_job_paths",
    "confine_path",
    "enforce_job_paths",
    "roots_from_env",
]

DATA_ROOTS_ENV = "DLRM_DATA_ROOTS"
OUTPUT_ROOTS_ENV = "DLRM_OUTPUT_ROOTS"


class PathEscapeError(UserError):
    """A config path outside its allowed roots. The message names the field."""


@dataclass(frozen=True)
class PathProblem:
    field: str  # dotted config field, e.g. "data.path"
    message: str


def _is_uri(text: str) -> bool:
    return "://" in text


def confine_path(value: str | Path, roots: Sequence[Path], *, field: str, base: Path) -> Path:
    """``value`` resolved (relative paths against ``base``, symlinks followed) if it lies under a root.

    Raises :class:`PathEscapeError` naming ``field`` for a NUL byte, a ``..``
    component, or a path (or the target of a symlink in it) outside every root.
    """
    text = str(value)
    shown = ", ".join(str(r) for r in roots)
    if "\x00" in text:
        raise PathEscapeError(f"{field}: the path contains a NUL byte")
    path = Path(text)
    if ".." in path.parts:
        raise PathEscapeError(f"{field}: {text!r} contains '..'; give a path inside {shown}")
    full = path if path.is_absolute() else base / path
    resolved_roots = [(r if r.is_absolute() else base / r).resolve() for r in roots]
    resolved = full.resolve()  # every existing component's symlinks followed
    if any(resolved == r or resolved.is_relative_to(r) for r in resolved_roots):
        return resolved
    lexical = Path(os.path.normpath(full.absolute()))
    lexical_roots = [Path(os.path.normpath((r if r.is_absolute() else base / r).absolute())) for r in roots]
    if any(lexical == r or lexical.is_relative_to(r) for r in lexical_roots):
        raise PathEscapeError(
            f"{field}: {text!r} leads outside {shown} through a symbolic link (it resolves to {resolved})"
        )
    raise PathEscapeError(f"{field}: {text!r} is outside the allowed directories ({shown})")


def _job_paths(job) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(data-side, output-side) ``(field, path)`` pairs a job config sets (the dedup copy: separately)."""
    inputs = [("data.path", str(job.data.path))]
    if job.tuner.policy_path is not None:
        inputs.append(("tuner.policy_path", str(job.tuner.policy_path)))
    outputs = [("tracking.runs_dir", str(job.tracking.runs_dir))]
    for name in ("storage_path", "resume_from"):
        value = getattr(job.train, name, None)
        if value is not None and not _is_uri(str(value)):
            outputs.append((f"train.{name}", str(value)))
    cache = getattr(job.ingest, "cache", None)
    spill = getattr(cache, "spill_dir", None) if cache is not None else None
    if spill is not None:
        outputs.append(("ingest.cache.spill_dir", str(spill)))
    return inputs, outputs


def check_job_paths(job, data_roots: Sequence[Path], output_roots: Sequence[Path], base: Path) -> list[PathProblem]:
    """Every path of ``job`` (a JobConfig) that is not under its roots, with the reason."""
    problems = []
    inputs, outputs = _job_paths(job)
    for pairs, roots in ((inputs, data_roots), (outputs, output_roots)):
        for field, value in pairs:
            try:
                resolved = confine_path(value, roots, field=field, base=base)
            except PathEscapeError as err:
                problems.append(PathProblem(field, str(err)))
                continue
            if field == "data.path" and job.dedup_enabled and resolved.name:
                # The dedup copy is written beside the data (ingest.dedup_storage.default_dedup_dir; not imported: Ray).
                dedup = resolved.with_name(resolved.name + ".dedup")
                try:
                    confine_path(dedup, roots, field="data.path", base=base)
                except PathEscapeError:
                    problems.append(PathProblem(field, f"data.path: the dedup copy of {value!r} is written beside "
                                                       f"it, at {dedup}, outside the allowed directories"))
    return problems


def roots_from_env() -> tuple[list[Path], list[Path]] | None:
    """The roots the job service passed to this job, or None when run without them."""
    data, output = os.environ.get(DATA_ROOTS_ENV), os.environ.get(OUTPUT_ROOTS_ENV)
    if not data and not output:
        return None
    split = lambda v: [Path(p) for p in (v or "").split(os.pathsep) if p]  # noqa: E731
    return split(data), split(output)


def enforce_job_paths(job, base: Path | None = None) -> None:
    """Raise :class:`PathEscapeError` listing every path of ``job`` outside the roots in the environment."""
    roots = roots_from_env()
    if roots is None:
        return
    problems = check_job_paths(job, roots[0], roots[1], base or Path.cwd())
    if problems:
        raise PathEscapeError("job config paths outside the allowed directories:\n  "
                              + "\n  ".join(p.message for p in problems))
