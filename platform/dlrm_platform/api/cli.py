"""Commands of the job service: ``serve``, ``serve-stack``, ``mlflow-server``, ``api-key ...``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the job service API (uvicorn); settings from DLRM_API_* variables")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--log-level", default="info")
    p.set_defaults(handler=_serve)

    p = sub.add_parser(
        "serve-stack", help="MLflow server + local Ray head + the job service, until Ctrl-C (`make serve`)"
    )
    p.add_argument("--root", type=Path, default=Path("runs/serve"), help="MLflow store and logs")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="API port")
    p.add_argument("--mlflow-port", type=int, default=5000)
    p.add_argument("--mlflow-host", default="127.0.0.1",
                   help="MLflow's listen address; beyond loopback its basic auth is on (password: "
                   "$DLRM_MLFLOW_PASSWORD or ROOT/mlflow/auth/admin_password)")
    p.add_argument("--dashboard-port", type=int, default=8265)
    p.add_argument("--gcs-port", type=int, default=6379)
    p.add_argument("--num-cpus", type=int, default=None)
    p.set_defaults(handler=_serve_stack)

    p = sub.add_parser("mlflow-server", help="MLflow tracking server: sqlite backend, local artifacts")
    p.add_argument("--root", type=Path, default=Path("runs/mlflow-server"))
    p.add_argument("--host", default="127.0.0.1",
                   help="listen address; beyond loopback MLflow's basic auth is on (admin password: "
                   "$DLRM_MLFLOW_PASSWORD or ROOT/auth/admin_password)")
    p.add_argument("--auth", action="store_true", help="basic auth on loopback too")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--workers", type=int, default=1)
    p.set_defaults(handler=_mlflow_server)

    keys = sub.add_parser("api-key", help="API keys of the job service (stored hashed)")
    ksub = keys.add_subparsers(dest="api_key_command", metavar="ACTION", required=True)
    k = ksub.add_parser("create", help="create a key and print it (shown once)")
    k.add_argument("--user", required=True)
    k.add_argument("--admin", action="store_true", help="may see and cancel every user's jobs")
    k.add_argument("--database-url", default=None, help="default: DLRM_API_DATABASE_URL or the service default")
    k.set_defaults(handler=_key_create)
    k = ksub.add_parser("list", help="list keys (ids and users, never the keys)")
    k.add_argument("--database-url", default=None)
    k.set_defaults(handler=_key_list)
    k = ksub.add_parser("revoke", help="revoke a key by its id")
    k.add_argument("key_id")
    k.add_argument("--database-url", default=None)
    k.set_defaults(handler=_key_revoke)


def _database(url: str | None) -> Any:
    from dlrm_platform.api.db import Database
    from dlrm_platform.api.settings import ApiSettings

    return Database(url or ApiSettings().database_url)


def _key_create(args: argparse.Namespace) -> int:
    from dlrm_platform.api.auth import create_api_key

    db = _database(args.database_url)
    with db.transaction() as s:
        record, key = create_api_key(s, args.user, admin=args.admin)
        key_id = record.key_id
    db.dispose()
    role = "admin" if args.admin else "user"
    print(key)
    import sys

    print(f"created {role} key {key_id} for {args.user}; it is not stored and will not be shown again", file=sys.stderr)
    return 0


def _key_list(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from dlrm_platform.api.db import ApiKeyRecord

    db = _database(args.database_url)
    with db.session() as s:
        for r in s.scalars(select(ApiKeyRecord).order_by(ApiKeyRecord.id)):
            state = f"revoked {r.revoked_at:%Y-%m-%d}" if r.revoked_at else "active"
            print(f"{r.key_id}  {r.user:<20} {'admin' if r.is_admin else 'user':<5}  {state}")
    db.dispose()
    return 0


def _key_revoke(args: argparse.Namespace) -> int:
    from dlrm_platform.api.auth import revoke_api_key
    from dlrm_platform.errors import UserError

    db = _database(args.database_url)
    with db.transaction() as s:
        ok = revoke_api_key(s, args.key_id)
    db.dispose()
    if not ok:
        raise UserError(f"no active key {args.key_id}")
    print(f"revoked {args.key_id}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dlrm_platform.api.app import create_app

    # One process: the scheduler lives in it (several workers would each schedule).
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _serve_stack(args: argparse.Namespace) -> int:
    from dlrm_platform.api.devstack import run_stack

    return run_stack(
        root=args.root,
        host=args.host,
        api_port=args.port,
        mlflow_port=args.mlflow_port,
        mlflow_host=args.mlflow_host,
        dashboard_port=args.dashboard_port,
        gcs_port=args.gcs_port,
        num_cpus=args.num_cpus,
    )


def _mlflow_server(args: argparse.Namespace) -> int:
    from dlrm_platform.api.mlflow_links import SERVER_ENV, init_backend_store, server_auth_for, server_command

    auth = server_auth_for(args.host, args.root, True if args.auth else None)
    uri = init_backend_store(args.root / "mlflow.db", args.root / "artifacts")
    print(f"[mlflow] backend {uri}, artifacts {args.root / 'artifacts'}; http://{args.host}:{args.port}", flush=True)
    if auth is not None:
        print(f"[mlflow] basic auth on: user {auth.username}, password in $DLRM_MLFLOW_PASSWORD or "
              f"{auth.password_file}; clients set MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD", flush=True)
    cmd = server_command(uri, args.root / "artifacts", args.host, args.port, args.workers, auth=auth is not None)
    os.execve(cmd[0], cmd, {**os.environ, **SERVER_ENV, **(auth.server_env() if auth else {})})
    return 0  # not reached
