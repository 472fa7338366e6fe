"""The source root `platform/` must never shadow Python's stdlib module `platform`."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_platform_dir_is_not_a_package():
    assert (REPO / "platform" / "dlrm_platform" / "__init__.py").is_file()
    assert not (REPO / "platform" / "__init__.py").exists(), (
        "platform/__init__.py shadows the stdlib module 'platform' (torch, ray, uvicorn, mlflow import it)"
    )


def test_import_platform_gives_stdlib_from_repo_root():
    # Run from the repo root, where `platform/` sits on sys.path[0].
    code = "import platform, sysconfig, os; print(platform.__file__); print(platform.python_version())"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    module_file, version = out.stdout.split()
    stdlib = Path(__import__("sysconfig").get_paths()["stdlib"]).resolve()
    assert Path(module_file).resolve().parent == stdlib
    assert version.count(".") == 2


def test_package_imports_without_starting_ray():
    code = "import dlrm_platform.cli, dlrm_platform.config, ray; print(ray.is_initialized())"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _module_imports() -> dict[str, set[str]]:
    """Each platform module and the platform modules it imports at module level (lazy imports in functions and
    ``if TYPE_CHECKING`` blocks are not import-time edges)."""
    import ast

    root = REPO / "platform"
    paths = {}
    for p in (root / "dlrm_platform").rglob("*.py"):
        name = ".".join(p.relative_to(root).with_suffix("").parts)
        paths[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {}
    for name, p in paths.items():
        deps: set[str] = set()
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_no_import_cycle_between_platform_modules():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]  # the check itself finds one
    graph = _module_imports()
    assert "dlrm_platform.ingest.pipeline" in graph["dlrm_platform.tuner.job_pipelines"]
    assert _cycles(graph) == []
