"""Property test of the OpenAPI schema (schemathesis): generated requests to every operation,
valid and not, never get a 5xx, every response matches the schema, and every operation
refuses requests without a key."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import schemathesis
from api_fakes import Stack
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_schema_conformance,
    status_code_conformance,
)

_tmp = Path(tempfile.mkdtemp(prefix="dlrm-api-prop-"))
STACK = Stack(_tmp)
# Some jobs in every state so that listing and filters return real records.
for i in range(3):
    STACK.submit("root", priority=i)
STACK.service.tick()
schema = schemathesis.openapi.from_asgi("/openapi.json", STACK.app)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    ignored_auth,
]


@pytest.fixture(scope="module", autouse=True)
def _close_stack():
    yield
    STACK.close()


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_openapi_schema_holds(case):
    case.call_and_validate(headers=STACK.h("root"), checks=CHECKS)
    STACK.service.tick()  # let the scheduler act on what was submitted
