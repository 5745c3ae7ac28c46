"""Scans (cumsum, cumprod) and sorts along one axis, computed as the CUDA kernels do:
f16/bf16 accumulate in float32, integers and bools in int64; sorts are stable, NaN last
ascending and first descending."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType

from .compute import down, up


def scan(x: np.ndarray, attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """cumsum (kind "add") or cumprod ("mul") along attrs["axis"]."""
    src = x.astype(np.int64) if dtype.is_int else up(x)
    fn = np.cumsum if attrs["kind"] == "add" else np.cumprod
    with np.errstate(all="ignore"):
        return down(fn(src, axis=attrs["axis"]), dtype)


def sort(x: np.ndarray, attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """Sorted values or their int64 indices along attrs["axis"], the first k of them."""
    ax = attrs["axis"] % x.ndim
    k = attrs.get("k")
    # Keys in the compute dtype: ml_dtypes' bfloat16 sorts NaN anywhere; float32 is exact.
    key = up(x)
    if attrs.get("descending"):
        # Descending is the ascending order reversed, except that equal values keep their
        # index order: a stable ascending sort of the reversed row, mapped back.
        n = x.shape[ax]
        rev = np.flip(key, axis=ax)
        idx = (n - 1) - np.flip(np.argsort(rev, axis=ax, kind="stable"), axis=ax)
    else:
        idx = np.argsort(key, axis=ax, kind="stable")
    if k is not None:
        idx = np.take(idx, np.arange(k), axis=ax)
    if attrs.get("indices"):
        return idx.astype(np.int64)
    return np.take_along_axis(x, idx, axis=ax).astype(dtype.np, copy=False)
