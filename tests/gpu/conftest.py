"""What the GPU tests share: the CUDA backend, or a skip where it is not active."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
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


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs per test; the seed is printed and PGK_TEST_SEED replays it."""
    env = os.environ.get("PGK_TEST_SEED")
    seed = int(env) if env else int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
    print(f"PGK_TEST_SEED={seed}")
    return np.random.default_rng(seed)
