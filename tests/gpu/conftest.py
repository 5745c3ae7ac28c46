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


@pytest.fixture
def dev() -> Iterator[Any]:
    """Raw device buffers for kernel-level tests: alloc(nbytes, offset) a fresh buffer
    filled with 0xFF (NaN in every float format) and `offset` bytes into it, put(a, offset)
    a copy of a there, get(p, shape, dtype) a copy back (a NumPy dtype); all freed after
    the test."""
    from pygpukit import _native as nv

    bufs: list[int] = []

    class Buffers:
        @staticmethod
        def alloc(nbytes: int, offset: int = 0) -> int:
            p = int(nv.mem_alloc(nbytes + offset + 256))
            bufs.append(p)
            nv.memset(p, 0xFF, nbytes + offset + 256)
            return p + offset

        @staticmethod
        def put(a: np.ndarray, offset: int = 0) -> int:
            raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            p = Buffers.alloc(raw.nbytes, offset)
            nv.memcpy_htod(p, raw, None, raw.nbytes)
            return p

        @staticmethod
        def get(p: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            raw = np.empty(int(np.prod(shape)) * np.dtype(dtype).itemsize, np.uint8)
            nv.synchronize()
            nv.memcpy_dtoh(raw, p, None, raw.nbytes)
            return raw.view(dtype).reshape(shape)

    yield Buffers
    nv.synchronize()
    for p in bufs:
        nv.mem_free(p)
