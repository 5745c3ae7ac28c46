"""The README's test command is what CI runs; the demo the README names works; every file
the README and docs name in backticks exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "results" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]  # fmt: skip
_SUFFIXES = (".json", ".md", ".py", ".sh", ".cuh", ".cpp", ".h", ".rs", ".toml")


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    cmd = next(line.strip() for line in readme.splitlines() if "pytest" in line and "pip" in line)
    assert cmd in ci
    assert "pygpukit demo" in readme


def test_demo_runs_and_checks_itself() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pygpukit", "demo", "--repeats", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "rel. error" in out.stdout and "MISMATCH" not in out.stdout
    assert "rms_norm(" in out.stdout and "# demo.py:" in out.stdout


def test_source_is_ascii() -> None:
    for folder in ("pygpukit", "ir", "passes", "native", "rust", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".rs", ".cpp", ".h", ".cuh", ".toml") and path.is_file():
                data = path.read_bytes()
                assert data.isascii(), f"non-ASCII in {path}"


def _named_paths(text: str) -> list[str]:
    """Backticked tokens that name a repository file or folder: `dir/...` under a top-level
    folder of the repository, or a bare file name with a source/result suffix (placeholders
    such as `<family>.cuh` are not paths)."""
    top = {p.name for p in ROOT.iterdir()}
    found = []
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.split("::")[0]
        if any(c in token for c in "<>$~"):
            continue
        if "/" in token:
            if token.split("/")[0] in top:
                found.append(token.rstrip("/"))
        elif token.endswith(_SUFFIXES):
            found.append(token)
    return found


def _exists(doc: Path, name: str) -> bool:
    """A path from the repository root; a bare file name beside the document, in
    bench/results/ or at the root. A glob must match something."""
    bases = [ROOT] if "/" in name else [doc.parent, ROOT / "bench" / "results", ROOT]
    return any(any(base.glob(name)) if "*" in name else (base / name).exists()
               for base in bases)  # fmt: skip


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_the_docs_name_exist(doc: Path) -> None:
    names = _named_paths(doc.read_text(encoding="utf-8"))
    assert names, f"{doc.name} names no file: the check would be vacuous"
    missing = [n for n in names if not _exists(doc, n)]
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


def test_path_check_catches_a_missing_file(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    names = _named_paths(
        "see `scripts/gone.py`, `bench/results/h200-gone.json`, `gpk.nn`, "
        "`<family>.cuh`, `tests/test_repo.py::test_x` and `h200-kernels.json`"
    )
    assert names == ["scripts/gone.py", "bench/results/h200-gone.json", "tests/test_repo.py",
                     "h200-kernels.json"]  # fmt: skip
    assert [n for n in names if not _exists(doc, n)] == names[:2]
