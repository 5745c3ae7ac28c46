"""Shared test setup: the gpu marker skips without a usable SM80+ GPU."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import pytest

# Every pass's output graph is validated in the tests (off by default for speed: a third
# of the pipeline's time); a test that sets the variable itself still wins.
os.environ.setdefault("PYGPUKIT_VALIDATE_PASSES", "1")


@functools.cache
def gpu_available() -> bool:
    if os.environ.get("PYGPUKIT_BACKEND", "").lower() == "cpu":
        return False
    try:
        from pygpukit import _native

        return bool(_native.driver_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs an SM80+ CUDA GPU")
    for item in items:
        if f"{os.sep}gpu{os.sep}" in str(item.path):
            item.add_marker(pytest.mark.gpu)
        if "gpu" in item.keywords and not gpu_available():
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _settings_follow_the_environment() -> Iterator[None]:
    """Each test starts from the settings the one before it found: gpk.set_* calls made in a
    test (or by a CLI command it runs) are undone, and the settings read once (EAGER, DEBUG,
    SKIP_PASSES) are read again from the environment, which monkeypatch has restored by then
    (this fixture is set up first, so it is torn down last)."""
    from pygpukit import settings

    saved = dict(settings._overrides)
    yield
    settings._overrides.clear()
    settings._overrides.update(saved)
    settings.reload()
