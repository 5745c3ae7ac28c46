"""Array factories: zeros, ones, full, empty, arange, from_numpy, asarray, random."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit import errors
from pygpukit.ir import dtypes
from pygpukit.ir.dtypes import DType

from . import runtime
from .array import GPUArray
from .backends import get_backend

DEFAULT_FLOAT = dtypes.float32  # like torch and JAX; from_numpy keeps float64 as float64


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(d, int | np.integer) or d < 0 for d in dims):
        raise errors.ShapeError(f"invalid shape {shape!r}: dims must be non-negative ints")
    return tuple(int(d) for d in dims)


def _dtype(dtype: Any, default: DType) -> DType:
    if dtype is None:
        return default
    try:
        return dtypes.as_dtype(dtype)
    except dtypes.UnsupportedDType as e:
        raise errors.DTypeError(str(e)) from None


def full(shape: int | Sequence[int], fill_value: Any, dtype: Any = None) -> GPUArray:
    default = dtypes.scalar_dtype(fill_value) if isinstance(fill_value, int | float | bool) \
        else DEFAULT_FLOAT  # fmt: skip
    d = _dtype(dtype, default)
    value = d.np.type(fill_value).item()
    return GPUArray(runtime.record("full", (), {"shape": _shape(shape), "dtype": d.name,
                                                "value": value}))  # fmt: skip


def zeros(shape: int | Sequence[int], dtype: Any = None) -> GPUArray:
    return full(shape, 0, _dtype(dtype, DEFAULT_FLOAT))


def ones(shape: int | Sequence[int], dtype: Any = None) -> GPUArray:
    return full(shape, 1, _dtype(dtype, DEFAULT_FLOAT))


def zeros_like(x: GPUArray, dtype: Any = None) -> GPUArray:
    return zeros(x.shape, dtype or x.dtype)


def ones_like(x: GPUArray, dtype: Any = None) -> GPUArray:
    return ones(x.shape, dtype or x.dtype)


def empty(shape: int | Sequence[int], dtype: Any = None) -> GPUArray:
    """Uninitialised memory straight from the pool."""
    d = _dtype(dtype, DEFAULT_FLOAT)
    s = _shape(shape)
    backend = get_backend()
    return GPUArray(runtime.leaf(backend.empty(s, d), s, d))  # type: ignore[attr-defined]


def arange(start: float, stop: float | None = None, step: float = 1, dtype: Any = None) -> GPUArray:
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise errors.GPUKitValueError("arange: step must not be zero")
    n = max(0, math.ceil((stop - start) / step))
    all_int = all(isinstance(v, int) for v in (start, stop, step))
    d = _dtype(dtype, dtypes.int64 if all_int else DEFAULT_FLOAT)
    return GPUArray(runtime.record("arange", (), {"shape": (n,), "dtype": d.name, "start": start,
                                                  "step": step}))  # fmt: skip


def from_numpy(array: np.ndarray) -> GPUArray:
    """Copy a NumPy array to the backend (dtype kept; float64 stays float64)."""
    d = _dtype(array.dtype, DEFAULT_FLOAT)
    # np.ascontiguousarray would turn a 0-d array into 1-d
    value = get_backend().from_numpy(array if array.flags.c_contiguous else array.copy(order="C"))
    return GPUArray(runtime.leaf(value, tuple(array.shape), d))


def asarray(x: Any, dtype: Any = None) -> GPUArray:
    if isinstance(x, GPUArray):
        return x if dtype is None else x.astype(dtype)
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        from .interop import from_dlpack

        arr = from_dlpack(x)
        return arr if dtype is None else arr.astype(dtype)
    if isinstance(x, np.ndarray | np.generic):
        a = np.asarray(x)
    else:
        a = np.asarray(x)
        if a.dtype == np.float64:
            a = a.astype(DEFAULT_FLOAT.np)  # Python floats default to float32
    if dtype is not None:
        a = a.astype(_dtype(dtype, DEFAULT_FLOAT).np)
    if a.dtype.kind in "OUSV" and a.dtype.name != "bfloat16":
        raise errors.DTypeError(f"asarray: cannot make an array of {a.dtype} data")
    return from_numpy(a)


array = asarray
