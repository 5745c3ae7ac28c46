"""Reductions, accumulating f16/bf16 in f32 as the GPU kernels do."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType

from .compute import down, up


def reduce(op: str, x: np.ndarray, attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    axes = attrs["axes"]
    keep = attrs["keepdims"]
    if op in ("argmax", "argmin"):
        arg: Any = np.argmax if op == "argmax" else np.argmin
        if len(axes) == 1:
            return arg(x, axis=axes[0], keepdims=keep).astype(np.int64)
        flat = arg(x.reshape(-1))
        return np.asarray(flat, np.int64).reshape((1,) * x.ndim if keep else ())
    fn: Any = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod,
               "any": np.any, "all": np.all}[op]  # fmt: skip
    src = up(x) if op in ("sum", "mean", "prod") else x
    if op in ("sum", "prod") and dtype.is_int:
        src = x.astype(np.int64)
    with np.errstate(all="ignore"):
        r = fn(src, axis=axes, keepdims=keep)
    return down(r, dtype)
