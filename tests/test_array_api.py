"""GPUArray properties, factories, printing, interop, laziness and the schedule cache."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ALL, np_dtype, rand

import pygpukit as gpk
from pygpukit import runtime


@pytest.mark.parametrize("dtype", ALL)
def test_properties_and_roundtrip(dtype: str) -> None:
    x = rand(np.random.default_rng(), (3, 4, 5), dtype)
    g = gpk.from_numpy(x)
    assert g.shape == x.shape and g.ndim == 3 and g.size == x.size
    assert g.nbytes == x.nbytes and g.dtype.np == x.dtype and g.strides == x.strides
    assert g.T.shape == x.T.shape and len(g) == 3
    np.testing.assert_array_equal(g.to_numpy(), x)
    np.testing.assert_array_equal(np.asarray(g), x)
    assert g.astype("float32").dtype == gpk.float32


def test_factories() -> None:
    np.testing.assert_array_equal(gpk.zeros((2, 3)).to_numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(gpk.ones(4, dtype="bf16").to_numpy(),
                                  np.ones(4, np_dtype("bfloat16")))  # fmt: skip
    np.testing.assert_array_equal(gpk.full((2, 2), 7).to_numpy(), np.full((2, 2), 7))
    assert gpk.full((2,), 7).dtype == gpk.int64 and gpk.full((2,), 0.5).dtype == gpk.float32
    np.testing.assert_array_equal(gpk.arange(5).to_numpy(), np.arange(5))
    np.testing.assert_allclose(gpk.arange(0.0, 1.0, 0.25).to_numpy(), np.arange(0, 1, 0.25))
    np.testing.assert_array_equal(gpk.arange(10, 2, -3).to_numpy(), np.arange(10, 2, -3))
    e = gpk.empty((5, 7), dtype="int32")
    assert e.shape == (5, 7) and e.is_realized
    assert gpk.asarray([1.5, 2.5]).dtype == gpk.float32
    assert gpk.asarray([1, 2]).dtype == gpk.int64
    assert gpk.asarray(np.arange(3.0)).dtype == gpk.float64  # NumPy's dtype is kept
    np.testing.assert_array_equal(gpk.zeros_like(gpk.ones((2, 2))).to_numpy(), np.zeros((2, 2)))


def test_random_is_seeded_and_distributed() -> None:
    a = gpk.random.normal((1000,), seed=3).to_numpy()
    b = gpk.random.normal((1000,), seed=3).to_numpy()
    c = gpk.random.normal((1000,), seed=4).to_numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert abs(a.mean()) < 0.15 and 0.85 < a.std() < 1.15
    u = gpk.random.uniform((1000,), low=2, high=3, dtype="bf16").to_numpy().astype(np.float64)
    assert u.min() >= 2 and u.max() <= 3
    gpk.random.seed(11)
    r1 = gpk.random.normal((4,)).to_numpy()
    gpk.random.seed(11)
    np.testing.assert_array_equal(gpk.random.normal((4,)).to_numpy(), r1)


def test_lazy_until_needed_and_realize_many() -> None:
    x = gpk.random.normal((8, 8))
    y = gpk.exp(x * 2)
    z = y.sum(axis=0)
    assert not y.is_realized and not z.is_realized
    gpk.realize(y, z)
    assert y.is_realized and z.is_realized
    np.testing.assert_allclose(z.to_numpy(), np.exp(x.to_numpy() * 2).sum(0), rtol=1e-5)


def test_printing() -> None:
    x = gpk.from_numpy(np.array([[1.5, 2.0], [3.0, 4.25]], dtype=np.float32))
    assert repr(x).startswith("GPUArray([[1.5") and "dtype=float32" in repr(x)
    assert str(x) == str(x.to_numpy())
    assert float(x[1, 1]) == 4.25 and int(gpk.asarray(np.array(3))) == 3
    assert x[0, 0].item() == 1.5 and x.tolist() == [[1.5, 2.0], [3.0, 4.25]]


def test_schedule_cache_hits_in_a_loop() -> None:
    w = gpk.random.normal((16, 16))
    x = gpk.random.normal((4, 16))
    before = dict(runtime.stats)
    for _ in range(10):
        x = gpk.nn.gelu(x @ w) * 0.1
        x.realize()
    assert runtime.stats["schedule_misses"] - before["schedule_misses"] <= 1
    assert runtime.stats["schedule_hits"] - before["schedule_hits"] >= 9


def test_numpy_interop_both_ways() -> None:
    a = np.random.default_rng().standard_normal((3, 3)).astype(np.float32)
    g = gpk.from_numpy(a)
    r = a + g  # NumPy defers to GPUArray
    assert isinstance(r, gpk.GPUArray)
    np.testing.assert_allclose(r.to_numpy(), 2 * a)
    np.testing.assert_allclose(np.exp(np.asarray(g)), np.exp(a))


def test_pool_backs_every_buffer() -> None:
    stats0 = gpk.pool_stats()
    xs = [gpk.random.normal((256, 256)) for _ in range(4)]
    stats1 = gpk.pool_stats()
    assert stats1["in_use_bytes"] - stats0["in_use_bytes"] >= 4 * 256 * 256 * 4
    del xs
    import gc

    gc.collect()
    assert gpk.pool_stats()["in_use_bytes"] <= stats0["in_use_bytes"]


def test_to_numpy_async_gives_the_array() -> None:
    rng = np.random.default_rng()
    host = rng.standard_normal((5, 6)).astype(np.float32)
    t = (gpk.asarray(host) * 2).T.to_numpy_async()
    np.testing.assert_allclose(t.result(), (host.astype(np.float64) * 2).T, rtol=1e-6)
    assert t.done()
    x = gpk.asarray(host)
    x.realize()
    x.free()
    with pytest.raises(gpk.errors.FreedArrayError, match="to_numpy_async"):
        x.to_numpy_async()
