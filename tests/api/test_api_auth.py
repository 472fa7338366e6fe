"""API keys: hashed at rest, verified, revoked; every auth failure over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from dlrm_platform.api import auth
from dlrm_platform.api.db import ApiKeyRecord, Database
from dlrm_platform.errors import UserError


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return Database(f"sqlite:///{tmp_path / 'k.db'}")


def test_keys_are_stored_hashed_and_verify(db: Database):
    with db.transaction() as s:
        rec, key = auth.create_api_key(s, "alice")
    with db.session() as s:
        stored = s.scalar(select(ApiKeyRecord))
        assert stored is not None
        assert key not in (stored.key_hash, stored.key_id) and stored.key_hash == auth.hash_key(key)
        p = auth.verify_key(s, key)
    assert p == auth.Principal("alice", False, rec.key_id)


def test_wrong_malformed_and_revoked_keys_fail(db: Database):
    with db.transaction() as s:
        rec, key = auth.create_api_key(s, "bob", admin=True)
    with db.session() as s:
        assert auth.verify_key(s, key).is_admin
        assert auth.verify_key(s, key[:-1] + ("A" if key[-1] != "A" else "B")) is None  # same id, wrong secret
        assert auth.verify_key(s, "dlrm_0000000000000000_" + "x" * 43) is None  # unknown id
        assert auth.verify_key(s, "not-a-key") is None
        assert auth.verify_key(s, "") is None
    with db.transaction() as s:
        assert auth.revoke_api_key(s, rec.key_id)
        assert not auth.revoke_api_key(s, rec.key_id)
    with db.session() as s:
        assert auth.verify_key(s, key) is None


def test_bad_user_names_rejected(db: Database):
    with db.transaction() as s, pytest.raises(UserError):
        auth.create_api_key(s, "no spaces")


def test_extract_key():
    assert auth.extract_key("Bearer abc", None) == "abc"
    assert auth.extract_key("bearer  abc ", None) == "abc"
    assert auth.extract_key("Basic abc", None) is None
    assert auth.extract_key(None, "k") == "k"


def test_cli_creates_a_working_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from dlrm_platform.cli import main

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["api-key", "create", "--user", "carol", "--admin", "--database-url", url]) == 0
    key = capsys.readouterr().out.strip()
    db = Database(url)
    with db.session() as s:
        p = auth.verify_key(s, key)
    assert p is not None and p.user == "carol" and p.is_admin
    assert main(["api-key", "revoke", p.key_id, "--database-url", url]) == 0
    assert main(["api-key", "revoke", p.key_id, "--database-url", url]) == 2


# --------------------------------------------------------------------------- over HTTP


@pytest.mark.parametrize(
    "method,path",
    [
        ("get", "/v1/jobs"),
        ("post", "/v1/jobs"),
        ("get", "/v1/jobs/job-x"),
        ("get", "/v1/jobs/job-x/logs"),
        ("post", "/v1/jobs/job-x/cancel"),
        ("get", "/metrics"),
    ],
)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer nope"},
        {"X-API-Key": "dlrm_0123456789abcdef_" + "y" * 43},
        {"Authorization": "Basic Zm9vOmJhcg=="},
    ],
    ids=["no-key", "bad-bearer", "unknown-key", "wrong-scheme"],
)
def test_every_endpoint_but_healthz_needs_a_key(stack, method, path, headers):
    r = getattr(stack.client, method)(path, headers=headers, **({"json": {"config_name": "tiny"}} if method == "post" else {}))
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"


def test_healthz_needs_no_key(stack):
    r = stack.client.get("/healthz")
    assert r.status_code == 200 and r.json()["database"] is True


def test_revoked_key_is_refused(stack):
    with stack.service.db.transaction() as s:
        rec, key = auth.create_api_key(s, "dave")
    assert stack.client.get("/v1/jobs", headers={"X-API-Key": key}).status_code == 200
    with stack.service.db.transaction() as s:
        auth.revoke_api_key(s, rec.key_id)
    assert stack.client.get("/v1/jobs", headers={"X-API-Key": key}).status_code == 401


def test_users_see_and_cancel_only_their_own_jobs(stack):
    job = stack.submit("alice")["id"]
    for method, path in (("get", f"/v1/jobs/{job}"), ("get", f"/v1/jobs/{job}/logs"), ("post", f"/v1/jobs/{job}/cancel")):
        r = getattr(stack.client, method)(path, headers=stack.h("bob"))
        assert r.status_code == 404, (path, r.text)
    assert stack.client.get("/v1/jobs", headers=stack.h("bob")).json()["total"] == 0
    assert stack.client.get("/v1/jobs?owner=alice", headers=stack.h("bob")).status_code == 403
    assert stack.job(job, "alice")["status"] == "QUEUED"  # bob's cancel did nothing
    # Admins see and cancel everything.
    assert stack.client.get("/v1/jobs?owner=alice", headers=stack.h("root")).json()["total"] == 1
    r = stack.client.post(f"/v1/jobs/{job}/cancel", headers=stack.h("root"))
    assert r.status_code == 202 and r.json()["status"] == "STOPPED"
