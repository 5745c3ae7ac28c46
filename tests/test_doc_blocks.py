"""Every ```python block of the README and docs/ runs as written: the blocks of one file
share a namespace, in order, as a reader pastes them into one session. They run on the CPU
backend; a block that needs a GPU or a model checkpoint is fenced ```py instead (shown and
highlighted as Python, not run)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import pygpukit as gpk

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def blocks(path: Path) -> list[str]:
    """The ```python blocks of a Markdown file, in order."""
    return _BLOCK.findall(path.read_text(encoding="utf-8"))


def test_the_readme_has_blocks() -> None:
    assert len(blocks(ROOT / "README.md")) >= 2  # the tour and the compiled function


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_blocks_run_as_written(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pygpukit.backends import devices

    if path.name == "devices.md" and gpk.backend_name() != "cpu" and gpk.device_count() < 2:
        pytest.skip("devices.md uses device 1: two simulated CPU devices, or two GPUs")
    # A page may set environment variables (docs/devices.md asks for two simulated
    # devices) or use a second device: neither may leak into the tests after it.
    env, active = dict(os.environ), devices.ACTIVE[0]
    namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
    try:
        for k, code in enumerate(blocks(path)):
            try:
                exec(compile(code, f"{path.name} block {k}", "exec"), namespace)  # noqa: S102
            except Exception as e:  # name the block that failed
                raise AssertionError(f"{path.name} block {k} failed: {e!r}\n{code}") from e
    finally:
        namespace.clear()
        os.environ.clear()
        os.environ.update(env)
        devices.ACTIVE[0] = active
    capsys.readouterr()
