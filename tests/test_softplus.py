"""gpk.softplus against float64 NumPy, lazy, eager and compiled, alone and fused."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close, lazy_and_eager, np_dtype, rand

import pygpukit as gpk

DTYPES = ["float32", "float16", "bfloat16", "float64"]


def _ref(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x.astype(np.float64))  # log(1 + exp(x)), exact in float64


def _inputs(dtype: str, seed: int) -> np.ndarray:
    x = rand(np.random.default_rng(seed), (3, 17), dtype, low=-12.0, high=12.0)
    # Past exp's range on the right (a naive log1p(exp(x)) gives inf) and far left.
    x[0, :4] = np.array([100.0, -100.0, 30.0, -30.0]).astype(np_dtype(dtype))
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_softplus_lazy_and_eager(dtype: str) -> None:
    x = _inputs(dtype, 0)
    lazy, eager = lazy_and_eager(gpk.softplus, x)
    assert lazy.dtype == np_dtype(dtype) and lazy.shape == x.shape
    assert np.isfinite(lazy.astype(np.float64)).all()
    assert_close(lazy, _ref(x), dtype, factor=2)
    np.testing.assert_array_equal(lazy, eager)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softplus_compiled_alone_and_fused(dtype: str) -> None:
    @gpk.compile
    def f(x: gpk.GPUArray, y: gpk.GPUArray) -> tuple[gpk.GPUArray, gpk.GPUArray]:
        return gpk.softplus(x), gpk.softplus(x * y) - y

    for seed in (1, 2):
        x, y = _inputs(dtype, seed), rand(np.random.default_rng(seed + 10), (17,), dtype)
        alone, fused = f(gpk.from_numpy(x), gpk.from_numpy(y))
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        assert_close(alone.to_numpy(), _ref(x), dtype, factor=2)
        assert_close(fused.to_numpy(), _ref(x64 * y64) - y64, dtype, factor=4)
    assert f.stats()["hits"] == 1
    schedule = f._cache[next(iter(f._cache))].program.schedule
    fused_exprs = [str(s.attrs["expr"]) for s in schedule.steps if s.op == "fused_elementwise"]
    assert len(fused_exprs) == 1 and "softplus" in fused_exprs[0]


@pytest.mark.parametrize("dtype", ["int32", "uint8", "bool"])
def test_softplus_takes_floats_only(dtype: str) -> None:
    x = gpk.from_numpy(rand(np.random.default_rng(3), (4,), dtype))
    with pytest.raises(gpk.DTypeError, match="softplus needs a floating-point input") as e:
        gpk.softplus(x)
    assert isinstance(e.value, TypeError)
