"""Bodies and query parameters clients send."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dlrm_platform.api.db import JobStatus

CONFIG_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
OVERRIDE_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*$"
MAX_DEADLINE_S = 30 * 24 * 3600.0


class JobSubmitRequest(BaseModel):
    """A training job: a config by name from ``configs/`` or a whole config, plus overrides."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"config_name": "demo", "overrides": {"train.epochs": 1}, "priority": 10, "max_retries": 1}
            ]
        },
    )

    config_name: str | None = Field(
        default=None,
        pattern=CONFIG_NAME_PATTERN,
        description="a config in the service's configs/ directory, without '.yaml' (e.g. 'demo')",
    )
    config: dict[str, Any] | None = Field(
        default=None, description="a whole job config (the same schema as the YAML files)"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="dotted field paths to values, applied on top of the config, e.g. {'train.epochs': 1}",
        max_length=100,
    )
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first")
    max_retries: int | None = Field(
        default=None, ge=0, le=20, description="attempts after a failure; each resumes from the last checkpoint"
    )
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_DEADLINE_S,
        description="seconds from submission after which the job is stopped (TIMED_OUT), queued or running",
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[\x21-\x7e]+$",
        description="a repeat with the same key and body returns the same job; a different body gets 409",
    )

    @field_validator("overrides")
    @classmethod
    def _check_override_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        import re

        bad = [k for k in v if not re.match(OVERRIDE_KEY_PATTERN, k)]
        if bad:
            raise ValueError(f"override keys must be dotted field paths like 'train.epochs', got {bad[:3]}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> JobSubmitRequest:
        if (self.config_name is None) == (self.config is None):
            raise ValueError("give exactly one of config_name and config")
        return self

    def fingerprint(self) -> str:
        """Hash of the body, for idempotency checks."""
        body = self.model_dump(mode="json")
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class JobListQuery(BaseModel):
    status: JobStatus | None = None
    owner: str | None = None
    limit: int = 50
    offset: int = 0
