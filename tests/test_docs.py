"""Documents the code cites exist, and ARCHITECTURE.md names only files and sections that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "platform" / "dlrm_platform"
SCANNED = ("platform", "tests", "benchmarks", "scripts", "infra", "configs", "Makefile", ".ci")
SUFFIXES = {".py", ".yaml", ".yml", ".sh", ".toml", ""}


def _sources() -> list[Path]:
    out = []
    for name in SCANNED:
        root = REPO / name
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        out += [p for p in files if p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return out


def test_every_cited_markdown_file_exists():
    basenames = {p.name for p in REPO.rglob("*.md") if ".venv" not in p.parts and ".git" not in p.parts}
    missing = []
    for path in _sources():
        for name in re.findall(r"[\w./-]*\w\.md\b", path.read_text(errors="replace")):
            here = [REPO / name, path.parent / name]
            if not any(p.is_file() for p in here) and Path(name).name not in basenames:
                missing.append(f"{path.relative_to(REPO)}: {name}")
    assert not missing, f"cited documents that are not in the repository: {missing}"


def test_cited_architecture_sections_exist():
    sections = set(re.findall(r"^- \*\*(.+?)\.\*\*", (REPO / "ARCHITECTURE.md").read_text(), re.MULTILINE))
    assert {"CPU budget", "At-least-once consumption", "Private Ray Data hooks"} <= sections
    cited = []
    for path in _sources():
        for section in re.findall(r'ARCHITECTURE\.md, \\?"([^"\\]+)\\?"', path.read_text(errors="replace")):
            cited.append(section)
            assert section in sections, f"{path.relative_to(REPO)} cites ARCHITECTURE.md section {section!r}"
    assert cited, "no code cites an ARCHITECTURE.md section (the scan is broken)"


def test_architecture_names_only_files_that_exist():
    text = (REPO / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`([\w/]+\.py)`", text)) | set(re.findall(r"`((?:ingest|train|tuner|api)/)`", text))
    assert len(named) > 20
    for name in sorted(named):
        found = (PACKAGE / name).exists() or (REPO / name).exists() or ("/" not in name and any(PACKAGE.rglob(name)))
        assert found, f"ARCHITECTURE.md names {name}, which does not exist"
