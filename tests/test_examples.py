"""Each script in examples/ runs on the CPU backend and its numbers match NumPy."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")


def test_every_example_is_tested() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == [
        "device_report", "lazy_block", "scheduler_tasks"]  # fmt: skip


def test_lazy_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("lazy_block").main() < 1e-4
    assert "max |error|" in capsys.readouterr().out


def test_scheduler_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("scheduler_tasks").main() < 1e-5
    out = capsys.readouterr().out
    assert out.count("guaranteed  reserved 16000000 bytes, done") == 3
    assert out.count("best_effort reserved") == 3


def test_device_report(capsys: pytest.CaptureFixture[str]) -> None:
    import pygpukit as gpk

    on_gpu = gpk.backend_name() == "cuda"
    assert _load("device_report").main() is on_gpu  # it runs its kernel where there is one
    if not on_gpu:
        assert "the kernel needs a CUDA GPU, not run" in capsys.readouterr().out
