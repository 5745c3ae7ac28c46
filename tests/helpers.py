"""Test helpers: random inputs per dtype, tolerances, running lazy and eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

import pygpukit as gpk

FLOATS = ["float32", "float16", "bfloat16"]
INTS = ["int8", "uint8", "int32", "int64"]
ALL = FLOATS + ["float64"] + INTS + ["bool"]

# rtol for one rounding of the result; reductions and matmul get a looser factor.
RTOL = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, positive: bool = False,
         low: float = -3.0, high: float = 3.0) -> np.ndarray:  # fmt: skip
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in INTS:
        lo = 0 if dtype == "uint8" or positive else -9
        return rng.integers(lo + (1 if positive else 0), 10, size=shape).astype(dtype)
    if positive:
        x = rng.uniform(0.1, high, size=shape)
    else:
        x = rng.uniform(low, high, size=shape)
    return x.astype(np_dtype(dtype))


def to64(a: Any) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.bool_ or a.dtype.kind in "iu":
        return a.astype(np.float64)
    return a.astype(np.float64)


def assert_close(out: Any, ref: np.ndarray, dtype: str, factor: float = 1.0,
                 atol: float | None = None) -> None:  # fmt: skip
    out = np.asarray(out)
    if dtype in RTOL:
        rtol = RTOL[dtype] * factor
        scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
        np.testing.assert_allclose(
            to64(out), ref, rtol=rtol, atol=atol if atol is not None else rtol * scale
        )
    else:
        np.testing.assert_array_equal(to64(out), ref)


def lazy_and_eager(fn: Callable[..., Any], *inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run fn on GPUArrays lazily (one realize at the end), then eagerly op by op."""
    lazy = fn(*[gpk.from_numpy(i) for i in inputs])
    lazy_out = lazy.to_numpy()
    with gpk.eager():
        eager = fn(*[gpk.from_numpy(i) for i in inputs])
        assert eager.is_realized
        eager_out = eager.to_numpy()
    return lazy_out, eager_out
