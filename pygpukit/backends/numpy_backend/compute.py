"""Shared helpers: the precision each dtype computes in, like the GPU kernels do."""

from __future__ import annotations

import numpy as np

from pygpukit.ir import DType

_F32 = np.dtype(np.float32)


def compute_dtype(d: np.dtype) -> np.dtype:
    """f16 and bf16 compute in f32 (the kernels accumulate in f32); others as they are."""
    if d.itemsize == 2 and d.kind in "fV" or d.name == "bfloat16":
        return _F32
    return d


def up(a: np.ndarray) -> np.ndarray:
    ct = compute_dtype(a.dtype)
    return a if a.dtype == ct else a.astype(ct)


def down(a: np.ndarray | np.generic, dtype: DType) -> np.ndarray:
    return np.asarray(a).astype(dtype.np, copy=False)
