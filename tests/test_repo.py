"""The README's test command is what CI runs; the demo the README names works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
