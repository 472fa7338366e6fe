"""Security review, as tests: every route's auth for each role (from the app's own route table, so a
new route without a rule fails), API keys hashed at rest and never logged, the MLflow server loopback
only unless configured and with basic auth when exposed, no secrets in MLflow params or logs."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
import yaml
from api_fakes import TINY_CONFIG, Stack
from mlflow.tracking import MlflowClient

from dlrm_platform.api import auth
from dlrm_platform.api import mlflow_links
from dlrm_platform.config import parse_job_config
from dlrm_platform.errors import UserError
from dlrm_platform.redact import redact_param, redact_text

# (method, route) -> expected status per role. Roles: anon (no key), bad (a well-formed unknown key),
# revoked, owner (alice, whose job it is), other (bob), admin. Job routes use alice's job.
OK, CREATED, ACCEPTED = 200, 201, 202
RULES: dict[tuple[str, str], dict[str, int]] = {
    ("GET", "/healthz"): dict(anon=OK, bad=OK, revoked=OK, owner=OK, other=OK, admin=OK),
    ("GET", "/metrics"): dict(anon=401, bad=401, revoked=401, owner=OK, other=OK, admin=OK),
    ("POST", "/v1/jobs"): dict(anon=401, bad=401, revoked=401, owner=CREATED, other=CREATED, admin=CREATED),
    ("GET", "/v1/jobs"): dict(anon=401, bad=401, revoked=401, owner=OK, other=OK, admin=OK),
    ("GET", "/v1/jobs/{job_id}"): dict(anon=401, bad=401, revoked=401, owner=OK, other=404, admin=OK),
    ("GET", "/v1/jobs/{job_id}/logs"): dict(anon=401, bad=401, revoked=401, owner=OK, other=404, admin=OK),
    ("POST", "/v1/jobs/{job_id}/cancel"): dict(anon=401, bad=401, revoked=401, owner=ACCEPTED, other=404,
                                              admin=ACCEPTED),
}
# FastAPI's own documentation routes: public, they hold no data.
PUBLIC_DOCS = {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")}
ROLES = ["anon", "bad", "revoked", "owner", "other", "admin"]


def _walk(routes, prefix: str = ""):
    """(method, path) of every route, through included routers (FastAPI wraps them as _IncludedRouter)."""
    for r in routes:
        if hasattr(r, "original_router"):
            yield from _walk(r.original_router.routes, prefix + (r.include_context.prefix or ""))
        else:
            for method in getattr(r, "methods", None) or ():
                if method != "HEAD":
                    yield method, prefix + r.path


def test_every_route_has_an_auth_rule(stack: Stack) -> None:
    routes = set(_walk(stack.app.routes))
    assert len(routes) >= len(RULES)
    assert routes - PUBLIC_DOCS == set(RULES), "a route without an auth rule here (or a rule for no route)"


def _headers(stack: Stack, role: str, revoked_key: str) -> dict[str, str]:
    if role == "anon":
        return {}
    if role == "bad":
        return {"Authorization": "Bearer dlrm_0123456789abcdef_" + "z" * 43}
    if role == "revoked":
        return {"X-API-Key": revoked_key}
    return stack.h({"owner": "alice", "other": "bob", "admin": "root"}[role])


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("route", sorted(RULES), ids=lambda r: f"{r[0]} {r[1]}")
def test_route_auth_for_each_role(stack: Stack, route: tuple[str, str], role: str) -> None:
    method, path = route
    job = stack.submit("alice")["id"]
    with stack.service.db.transaction() as s:
        rec, revoked_key = auth.create_api_key(s, "mallory")
    with stack.service.db.transaction() as s:
        auth.revoke_api_key(s, rec.key_id)
    kwargs = {"json": {"config_name": "tiny"}} if (method, path) == ("POST", "/v1/jobs") else {}
    r = stack.client.request(method, path.replace("{job_id}", job), headers=_headers(stack, role, revoked_key),
                             **kwargs)
    assert r.status_code == RULES[route][role], r.text
    if r.status_code == 401:
        assert r.headers["www-authenticate"] == "Bearer"
    if role == "other" and (method, path) == ("GET", "/v1/jobs"):
        assert job not in r.text  # bob's list holds none of alice's jobs
    if role == "other" and path.endswith("/cancel"):
        assert stack.job(job, "alice")["status"] == "QUEUED"  # bob's cancel did nothing


# --------------------------------------------------------------------------- API keys at rest and in logs


def test_api_keys_are_hashed_at_rest_and_never_logged(stack: Stack, tmp_path: Path, caplog, capsys) -> None:
    from dlrm_platform.cli import main

    caplog.set_level(logging.DEBUG)
    db_url = stack.settings.database_url
    assert main(["api-key", "create", "--user", "erin", "--database-url", db_url]) == 0
    key = capsys.readouterr().out.strip()  # shown once, on stdout, by design
    secret = key.split("_", 2)[2]  # dlrm_<key id>_<secret>
    headers = {"X-API-Key": key}
    assert stack.client.get("/v1/jobs", headers=headers).status_code == 200
    job = stack.client.post("/v1/jobs", json={"config_name": "tiny"}, headers={"Authorization": f"Bearer {key}"})
    assert job.status_code == 201
    stack.service.tick()
    assert stack.client.get("/v1/jobs", headers={"X-API-Key": key[:-1] + "x"}).status_code == 401  # wrong secret
    assert stack.client.get("/metrics", headers=headers).status_code == 200

    logged = caplog.text + capsys.readouterr().err
    assert secret not in logged and key[:-1] not in logged
    # At rest: the database file holds the key's hash, never the key or its secret part.
    db_file = Path(db_url.removeprefix("sqlite:///"))
    raw = b"".join(p.read_bytes() for p in db_file.parent.glob(db_file.name + "*"))  # + its -wal journal
    assert secret.encode() not in raw and auth.hash_key(key).encode() in raw
    rows = sqlite3.connect(db_url.removeprefix("sqlite:///")).execute("select * from api_keys").fetchall()
    assert rows and not any(secret in str(row) for row in rows)
    # Nor anywhere the job went: its record, the submission Ray got.
    assert secret not in str(stack.backend.submissions) and secret not in stack.job(job.json()["id"], "root").__str__()


# --------------------------------------------------------------------------- secrets in MLflow and logs


def test_redaction() -> None:
    assert redact_text("http://svc:p%40ss@mlflow:5000/x") == "http://svc:***@mlflow:5000/x"
    assert redact_text("postgresql+psycopg://dlrm:hunter2@db/jobs") == "postgresql+psycopg://dlrm:***@db/jobs"
    assert redact_text("s3://b/k?X-Amz-Signature=1&token=abc&x=1") == "s3://b/k?X-Amz-Signature=1&token=***&x=1"
    assert redact_text("http://mlflow:5000") == "http://mlflow:5000"
    assert redact_param("tracking.tags.api_token", "abc") == "***"
    assert redact_param("train.epochs", "2") == "2"


def test_secrets_never_become_mlflow_params_or_tags(tmp_path: Path) -> None:
    from dlrm_platform.mlflow_run import start_job_run

    raw = yaml.safe_load(TINY_CONFIG)
    raw["tracking"] = {"tracking_uri": "http://ci:hunter2@mlflow.internal:5000", "experiment": "sec",
                       "tags": {"team": "recsys", "api_token": "tok-123456", "db_password": "pw-654321"}}
    job = parse_job_config(raw)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = start_job_run(job, uri)
    run = MlflowClient(uri).get_run(run_id)
    recorded = str(run.data.params) + str(run.data.tags)
    for secret in ("hunter2", "tok-123456", "pw-654321"):
        assert secret not in recorded
    assert run.data.params["tracking.tracking_uri"] == "http://ci:***@mlflow.internal:5000"
    assert run.data.tags["team"] == "recsys" and run.data.params["train.epochs"] == "1"


def test_service_logs_hold_no_tracking_password(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    s = Stack(tmp_path)
    s.settings.mlflow_tracking_uri = "http://svc:hunter2@mlflow:5000"
    try:
        s.submit("alice")
        s.service.tick()
        assert s.backend.submissions  # the job went to Ray
    finally:
        s.close()
    assert "hunter2" not in caplog.text and "http://svc:***@mlflow:5000" in caplog.text


# --------------------------------------------------------------------------- the MLflow server


def test_mlflow_server_is_loopback_unless_configured(tmp_path: Path) -> None:
    import argparse

    from dlrm_platform.api import cli, devstack

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    assert parser.parse_args(["serve-stack"]).mlflow_host == "127.0.0.1"
    assert parser.parse_args(["mlflow-server"]).host == "127.0.0.1"
    assert devstack.run_stack.__kwdefaults__["mlflow_host"] == "127.0.0.1"
    assert mlflow_links.start_server.__defaults__[0] == "127.0.0.1"
    for host in ("127.0.0.1", "localhost", "::1"):
        assert mlflow_links.is_loopback(host) and mlflow_links.server_auth_for(host, tmp_path) is None
    for host in ("0.0.0.0", "::", "10.1.2.3", "mlflow.example.com"):
        assert not mlflow_links.is_loopback(host)


def test_an_exposed_mlflow_server_gets_basic_auth(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DLRM_MLFLOW_PASSWORD", raising=False)
    with pytest.raises(UserError, match="must use basic auth"):
        mlflow_links.server_auth_for("0.0.0.0", tmp_path, auth=False)
    server_auth = mlflow_links.server_auth_for("0.0.0.0", tmp_path)
    assert server_auth is not None and len(server_auth.password) >= 24
    assert server_auth.password_file.stat().st_mode & 0o077 == 0  # readable by its owner only
    assert mlflow_links.server_auth_for("0.0.0.0", tmp_path).password == server_auth.password  # stable
    cmd = mlflow_links.server_command("sqlite:///x.db", tmp_path, "0.0.0.0", 5000, auth=True)
    assert cmd[cmd.index("--app-name") + 1] == "basic-auth"
    assert server_auth.password not in " ".join(cmd)  # never on a command line (ps shows it)
    assert server_auth.password not in server_auth.config_path.read_text()
    assert "default_permission = NO_PERMISSIONS" in server_auth.config_path.read_text()
    assert server_auth.server_env()["MLFLOW_AUTH_ADMIN_PASSWORD"] == server_auth.password
    monkeypatch.setenv("DLRM_MLFLOW_PASSWORD", "from-the-environment")
    assert mlflow_links.server_auth_for("10.0.0.1", tmp_path).password == "from-the-environment"


@pytest.mark.integration
def test_mlflow_server_with_basic_auth_refuses_anonymous_clients(tmp_path: Path, monkeypatch) -> None:
    """A real server: loopback by default (its socket), and with auth on, 401 without the password."""
    import base64
    import urllib.error
    import urllib.request

    from dlrm_platform.api.devstack import free_port, stop_process

    monkeypatch.delenv("DLRM_MLFLOW_PASSWORD", raising=False)
    port = free_port()
    proc = mlflow_links.start_server(tmp_path / "mlflow", port=port, auth=True)
    try:
        assert _listening_addresses(port) == {"127.0.0.1"}
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=10)
        assert err.value.code == 401
        creds = base64.b64encode(f"{proc.auth.username}:{proc.auth.password}".encode()).decode()
        req = urllib.request.Request(url, headers={"Authorization": f"Basic {creds}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        log_text = (tmp_path / "mlflow" / "mlflow-server.log").read_text()
        assert proc.auth.password not in log_text
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert proc.auth.password not in cmdline
    finally:
        stop_process(proc)


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (Linux /proc/net/tcp and tcp6)."""
    import ipaddress

    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.rsplit(":", 1)
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(addr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.add(str(ipaddress.ip_address(raw)))
    return out
