"""Reference of generated fused kernels: evaluate the expression IR in one precision."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType
from pygpukit.ir.evaluate import down, evaluate_expr

from .reduce import reduce


def fused_elementwise(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        r = evaluate_expr(attrs["expr"], ins)
    return np.broadcast_to(down(r, dtype), attrs["out_shape"])


def fused_reduce(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        r = np.broadcast_to(evaluate_expr(attrs["expr"], ins), attrs["out_shape"])
    if attrs["reduce"] in ("max", "min", "argmax"):
        r = r.astype(dtype.np if attrs["reduce"] != "argmax" else r.dtype, copy=False)
    return reduce(attrs["reduce"], r, attrs, dtype)
