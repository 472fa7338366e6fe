"""The job config of a submission: a named config file or an inline one, overrides, validation, paths.

Every error names its field in FastAPI's validation-error shape (a 422), so a
client sees all of them at once.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dlrm_platform.api.errors import InvalidRequest
from dlrm_platform.api.schemas.requests import JobSubmitRequest
from dlrm_platform.api.settings import ApiSettings
from dlrm_platform.config import ConfigError, JobConfig, apply_overrides
from dlrm_platform.paths import check_job_paths

__all__ = ["SERVICE_FIELDS", "ConfigResolver"]

# Fields the service sets on every attempt (Scheduler.job_overrides): a request may not choose them, or a user could
# resume from, or log into, another user's checkpoint or MLflow run.
SERVICE_FIELDS = (("train", "storage_path"), ("train", "resume_from"), ("tracking", "run_id"))


class ConfigResolver:
    """Resolves and checks the config of a request; named config files are parsed once per version."""

    def __init__(self, settings: ApiSettings, data_roots: list[Path], writable_roots: list[Path],
                 workdir: Path) -> None:
        self.settings = settings
        self.data_roots = data_roots
        self.writable_roots = writable_roots  # the output roots and the service's own storage
        self.workdir = workdir
        self._config_files: dict[Path, tuple[int, Any]] = {}

    def resolve(self, req: JobSubmitRequest) -> dict[str, Any]:
        """The validated job config of a request, as a JSON-able dict. Raises InvalidRequest."""
        if req.config_name is not None:
            source = f"configs/{req.config_name}"
            path = self._config_path(req.config_name)
            if path is None:
                raise InvalidRequest(
                    [
                        {
                            "loc": ["body", "config_name"],
                            "msg": f"no config named {req.config_name!r} in {self.settings.configs_dir}",
                            "type": "value_error",
                        }
                    ]
                )
            try:
                raw = self._read_config_file(path)
            except (OSError, yaml.YAMLError) as err:
                raise InvalidRequest(
                    [{"loc": ["body", "config_name"], "msg": f"{source}: unreadable: {err}", "type": "value_error"}]
                ) from None
            if not isinstance(raw, dict):
                raise InvalidRequest(
                    [{"loc": ["body", "config_name"], "msg": f"{source} is not a job config", "type": "value_error"}]
                )
        else:
            source = "config"
            raw = req.config or {}
        try:
            raw = apply_overrides(raw, req.overrides)
        except ConfigError as err:
            raise InvalidRequest([{"loc": ["body", "overrides"], "msg": str(err), "type": "value_error"}]) from None
        try:
            cfg = JobConfig.model_validate(raw)
        except ValidationError as err:
            errors = []
            for e in err.errors():
                path = [str(p) for p in e["loc"]]
                dotted = ".".join(path) or "<root>"
                msg = "unknown key (not a field of this section)" if e["type"] == "extra_forbidden" else e["msg"]
                errors.append(
                    {"loc": ["body", "config", *path], "msg": f"{source}: {dotted}: {msg}", "type": e["type"]}
                )
            raise InvalidRequest(errors) from None
        self._check_request_paths(cfg, raw, source)
        return cfg.model_dump(mode="json")

    def _check_request_paths(self, cfg: JobConfig, raw: dict[str, Any], source: str) -> None:
        """422 for a service-managed field set by the request, or a path outside the data/output roots."""
        errors = []
        for section, name in SERVICE_FIELDS:
            if isinstance(raw.get(section), dict) and raw[section].get(name) is not None:
                errors.append({
                    "loc": ["body", "config", section, name],
                    "msg": f"{source}: {section}.{name}: set by the service for every attempt; not accepted "
                    "in a request",
                    "type": "value_error",
                })
        for problem in check_job_paths(cfg, self.data_roots, self.writable_roots, self.workdir):
            errors.append({
                "loc": ["body", "config", *problem.field.split(".")],
                "msg": f"{source}: {problem.message}",
                "type": "path_outside_roots",
            })
        if errors:
            raise InvalidRequest(errors)

    def _read_config_file(self, path: Path) -> Any:
        """YAML of a named config, parsed once per version of the file (submissions are hot)."""
        mtime = path.stat().st_mtime_ns
        hit = self._config_files.get(path)
        if hit is None or hit[0] != mtime:
            hit = (mtime, yaml.safe_load(path.read_text()))
            self._config_files[path] = hit
        return copy.deepcopy(hit[1])

    def _config_path(self, name: str) -> Path | None:
        base = self.settings.configs_dir.resolve()
        for suffix in (".yaml", ".yml"):
            p = (base / f"{name}{suffix}").resolve()
            if p.parent == base and p.is_file():
                return p
        return None
