"""What the GPU tests share: the CUDA backend, or a skip where it is not active."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import pygpukit.backends as backends


@pytest.fixture
def cuda() -> Iterator[Any]:
    """The active CUDA backend (the test is skipped without one); queued work is finished
    before the next test, so a kernel error surfaces in the test that caused it."""
    b = backends.get_backend()
    if b.name != "cuda":
        pytest.skip("the CUDA backend is not active")
    yield b
    b.synchronize()
