"""to_numpy_async on the CUDA backend: the copy lands in pinned memory behind an event, so
result() waits for that copy alone; kernel errors still surface at the wait."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import pygpukit as gpk
from pygpukit.backends.cuda import transfers

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_result_matches_numpy(dtype: str) -> None:
    rng = np.random.default_rng()
    host = rng.standard_normal((7, 33)).astype(np.float32)
    x = gpk.asarray(host).astype(dtype)
    y = (x * 3).T  # a strided view: copied contiguous first
    t = y.to_numpy_async()
    got = t.result()
    expect = (x.to_numpy().astype(np.float64) * 3).T
    assert got.shape == expect.shape and got.dtype == x.to_numpy().dtype
    tol = 1e-2 if dtype == "bfloat16" else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), expect, rtol=tol)
    assert t.done() and t.result() is got


def test_wait_does_not_wait_for_later_work() -> None:
    """A token read while a long GEMM chain queued after it still runs: the result arrives
    while the stream is still busy (the legacy to_numpy would wait for everything)."""
    rng = np.random.default_rng()
    tok = gpk.asarray(rng.integers(0, 1000, 8))
    t = tok.to_numpy_async()
    a = gpk.asarray(rng.standard_normal((4096, 4096)).astype(np.float32))
    for _ in range(20):
        a = (a @ a) * 1e-3
    a.realize()
    end = gpk.Event(timing=False).record()
    got = t.result()
    busy = not end.query()
    np.testing.assert_array_equal(got, tok.to_numpy())
    assert busy, "the GEMM chain finished before the token arrived: nothing was overlapped"


def test_kernel_error_surfaces_at_result() -> None:
    rng = np.random.default_rng()
    x = gpk.asarray(rng.standard_normal((10, 4)).astype(np.float32))
    y = gpk.take(x, gpk.asarray(np.array([1, 10, 2], np.int64)), axis=0)
    t = y.to_numpy_async()
    with pytest.raises(gpk.IndexError) as e:
        t.result()
    assert "take" in str(e.value) and "10" in str(e.value)
    # The failed transfer gave its pinned buffers back: later transfers still get their
    # own data (decode loops read one step's token from another's copy when two transfers
    # share a buffer).
    del t, e
    gc.collect()
    a = gpk.asarray(np.arange(5, dtype=np.int64)).to_numpy_async()
    b = gpk.asarray(np.arange(5, 10, dtype=np.int64)).to_numpy_async()
    np.testing.assert_array_equal(b.result(), np.arange(5, 10))
    np.testing.assert_array_equal(a.result(), np.arange(5))
    again = gpk.take(x, gpk.asarray(np.array([3])), axis=0).to_numpy()
    np.testing.assert_array_equal(again, x.to_numpy()[[3]])


def test_pinned_buffers_are_reused() -> None:
    """50 transfers reuse the engine's cached pinned buffers: the cache may still grow by
    the two buffers one transfer holds at once (whether the data copy is reaped before the
    error word's copy takes a buffer depends on timing), never by a buffer per transfer."""
    engine = transfers.engine()
    x = gpk.asarray(np.arange(16, dtype=np.int64))
    x.to_numpy_async().result()
    before = engine.stats()["pinned_bytes"]
    for _ in range(50):
        np.testing.assert_array_equal(x.to_numpy_async().result(), np.arange(16))
    assert 0 <= engine.stats()["pinned_bytes"] - before <= 2 * 256
