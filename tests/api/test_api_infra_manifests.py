"""infra/ and configs/ray_job/: parse every manifest and check the fields the platform relies on."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray._private.label_utils import parse_node_labels_string, validate_node_labels

from dlrm_platform.config import load_job_config
from dlrm_platform.ray_cluster import idle_worker_env

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
IMAGE_PYTHON = "/app/.venv/bin/python"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def containers(pod_template: dict[str, Any]) -> list[dict[str, Any]]:
    return pod_template["spec"]["containers"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def custom_resources(params: dict[str, str]) -> dict[str, float]:
    raw = params.get("resources")
    return json.loads(json.loads(raw)) if raw else {}  # KubeRay's '"{\"x\": 1}"' quoting


def check_ray_cluster_spec(spec: dict[str, Any]) -> None:
    assert spec["rayVersion"] == ray.__version__  # image and manifests pinned to the tested Ray
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0", "the head must not run data or training tasks"
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    roles = {}
    for name, g in groups.items():
        labels = parse_node_labels_string(g["rayStartParams"]["labels"])
        validate_node_labels(labels)
        roles[labels["dlrm.io/role"]] = g
    assert set(roles) == {"data", "trainer"}, roles.keys()
    # Every node keeps idle task workers as the platform's own local cluster does (ray_cluster.py).
    for template in (head["template"], *(g["template"] for g in groups.values())):
        for c in containers(template):
            assert env_of(c).items() >= idle_worker_env().items(), c["name"]

    data, trainer = roles["data"], roles["trainer"]
    for c in containers(data["template"]):
        limits = c["resources"]["limits"]
        assert not any("gpu" in k for k in limits), "data workers are CPU-only"
        assert c["image"].endswith(":0.1.0")
    assert "num-gpus" not in data["rayStartParams"]
    assert custom_resources(data["rayStartParams"]) == {"data_worker": float(data["rayStartParams"]["num-cpus"])}

    assert trainer["rayStartParams"]["num-gpus"] == "1"
    for c in containers(trainer["template"]):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert c["image"].endswith("-gpu")
    assert custom_resources(trainer["rayStartParams"]) == {"trainer": 1}
    assert any(t["key"] == "nvidia.com/gpu" for t in trainer["template"]["spec"]["tolerations"])

    # Token auth stays on everywhere; checkpoints live on storage every node mounts.
    for tmpl in [head["template"], *(g["template"] for g in groups.values())]:
        for c in containers(tmpl):
            env = env_of(c)
            assert env["RAY_AUTH_MODE"] == "token"
            assert env["RAY_AUTH_TOKEN"]["secretKeyRef"]["name"] == "ray-auth-token"
            assert env["DLRM_PYTHON"] == IMAGE_PYTHON
            assert {"name": "job-storage", "mountPath": "/mnt/storage"} in c["volumeMounts"]


def test_raycluster():
    doc = load(INFRA / "kuberay" / "raycluster.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayCluster")
    check_ray_cluster_spec(doc["spec"])
    head = containers(doc["spec"]["headGroupSpec"]["template"])[0]
    assert {p["containerPort"] for p in head["ports"]} >= {6379, 8265}  # GCS and the Jobs API
    assert env_of(head)["MLFLOW_TRACKING_URI"].startswith("http://mlflow.dlrm.svc")


def test_rayjob_entrypoint_and_cluster():
    doc = load(INFRA / "kuberay" / "rayjob.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayJob")
    spec = doc["spec"]
    check_ray_cluster_spec(spec["rayClusterSpec"])
    argv = shlex.split(spec["entrypoint"])
    assert argv[0] == "/app/configs/ray_job/entrypoint.sh"
    # The config it names exists and, with the job's overrides, validates.
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    cfg = load_job_config(ROOT / argv[1], overrides)
    assert cfg.train.use_gpu and cfg.train.storage_path.startswith("/mnt/storage/")
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    ray.runtime_env.RuntimeEnv(**runtime_env)
    assert runtime_env["env_vars"]["MLFLOW_TRACKING_URI"].startswith("http://mlflow.dlrm.svc")
    assert spec["shutdownAfterJobFinishes"] is True and spec["activeDeadlineSeconds"] > 0


def test_mlflow_on_postgres():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((INFRA / "mlflow" / "mlflow.yaml").read_text())}
    secret = docs[("Secret", "mlflow-postgres")]["stringData"]
    assert secret["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg://")
    assert "mlflow-postgres.dlrm.svc.cluster.local:5432/" + secret["POSTGRES_DB"] in secret["MLFLOW_BACKEND_STORE_URI"]
    pg = docs[("StatefulSet", "mlflow-postgres")]["spec"]
    assert containers(pg["template"])[0]["image"].startswith("postgres:")
    assert docs[("Service", "mlflow-postgres")]["spec"]["ports"][0]["port"] == 5432

    dep = docs[("Deployment", "mlflow")]["spec"]["template"]["spec"]
    init = [c["command"][-1] for c in dep["initContainers"]]
    assert any("pg_isready" in c for c in init) and any("mlflow db upgrade" in c for c in init), (
        "the schema must exist before the server and its clients start"
    )
    server = dep["containers"][0]
    cmd = server["command"][-1]
    assert "mlflow server" in cmd and '--backend-store-uri "$MLFLOW_BACKEND_STORE_URI"' in cmd
    dest = cmd.split("--artifacts-destination ")[1].split()[0]
    assert {"name": "artifacts", "mountPath": dest} in server["volumeMounts"]
    assert dep["volumes"][0]["persistentVolumeClaim"]["claimName"] in {n for k, n in docs if k == "PersistentVolumeClaim"}
    assert "--port 5000" in cmd and docs[("Service", "mlflow")]["spec"]["ports"][0]["port"] == 5000
    assert server["readinessProbe"]["httpGet"]["path"] == "/health"


def test_vm_cluster_launcher_file():
    import jsonschema

    cfg = load(INFRA / "vm" / "cluster.yaml")
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] == "head" and types["head"]["resources"]["CPU"] == 0
    by_role = {t["labels"]["dlrm.io/role"]: t for t in types.values()}
    for t in types.values():
        validate_node_labels(t["labels"])
    assert by_role["data"]["resources"].get("GPU", 0) == 0 and "data_worker" in by_role["data"]["resources"]
    assert by_role["trainer"]["resources"]["GPU"] >= 1 and by_role["trainer"]["resources"]["trainer"] == 1
    assert any("RAY_AUTH_MODE=token" in o for o in cfg["docker"]["run_options"])
    assert any(f"DLRM_PYTHON={IMAGE_PYTHON}" in o for o in cfg["docker"]["run_options"])
    for name, value in idle_worker_env().items():
        assert any(o.split("#")[0].split() == ["-e", f"{name}={value}"] for o in cfg["docker"]["run_options"])


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            if current.strip():
                word, _, args = current.strip().partition(" ")
                out.append((word.upper(), args.strip()))
            current = ""
    return out


def test_dockerfile():
    text = (INFRA / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11" in text
    steps = dockerfile_instructions(text)
    install = [i for i, (word, args) in enumerate(steps) if word == "RUN" and "scripts/install.sh" in args]
    assert len(install) == 1, "one RUN installs the environment with scripts/install.sh"
    run = steps[install[0]][1]
    assert "VENV=/app/.venv" in run and 'EXTRAS="test,postgres"' in run and "GPU=${GPU}" in run
    # The pins are install.sh's choice (constraints-cpu.txt or constraints-gpu.txt); re-applying the CPU
    # pins (torch +cpu) on top of the GPU install is what broke the GPU image.
    assert "constraints-" not in " ".join(args for _, args in steps)
    assert f"DLRM_API_JOB_PYTHON={IMAGE_PYTHON}" in text and "DLRM_API_JOB_WORKDIR=/app" in text
    # Everything the install reads is copied before it runs; everything copied exists.
    copied_before, copied = set(), set()
    for i, (word, args) in enumerate(steps):
        if word == "COPY":
            sources = [a.rstrip("/") for a in args.split()[:-1] if not a.startswith("--")]
            copied.update(sources)
            if i < install[0]:
                copied_before.update(sources)
    for path in copied:
        assert (ROOT / path).exists(), f"COPY {path}: not in the repository"
    assert {"pyproject.toml", "README.md", "requirements", "scripts", "platform"} <= copied_before
    assert "configs" in copied


def test_ray_job_submit_files():
    d = ROOT / "configs" / "ray_job"
    runtime_env = load(d / "runtime_env.yaml")
    ray.runtime_env.RuntimeEnv(**runtime_env)
    assert runtime_env["env_vars"]["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"  # make serve's server
    ep = d / "entrypoint.sh"
    assert os.access(ep, os.X_OK)
    subprocess.run(["bash", "-n", str(ep)], check=True)
    text = ep.read_text()
    assert '$ROOT/.venv/bin/python' in text and '"$PY" -m dlrm_platform.cli run' in text
    r = subprocess.run([str(ep)], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.parametrize("name", ["demo", "criteo_kaggle"])
def test_service_overrides_validate_on_shipped_configs(name, tmp_path):
    """What the job service adds to every attempt is accepted by the job config."""
    overrides = [
        'tracking.tracking_uri="http://127.0.0.1:5000"',
        'tracking.tags.job_id="job-0123"',
        'tracking.tags.user="123"',
        'tracking.run_id="abc"',
        f'train.storage_path="{tmp_path}"',
        f'train.resume_from="{tmp_path}/checkpoint_x"',
    ]
    cfg = load_job_config(ROOT / "configs" / f"{name}.yaml", overrides)
    assert cfg.tracking.tags == {"job_id": "job-0123", "user": "123"} | {
        k: v for k, v in cfg.tracking.tags.items() if k not in ("job_id", "user")
    }
    assert cfg.tracking.run_id == "abc" and cfg.train.resume_from.endswith("checkpoint_x")
