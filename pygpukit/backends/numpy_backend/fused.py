"""Reference of generated fused kernels: evaluate the expression IR in one precision."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType
from pygpukit.ir.dtypes import as_dtype
from pygpukit.ir.expr import Expr

from .compute import compute_dtype, down
from .elementwise import BINARY, UNARY, gelu
from .reduce import reduce


def _eval(e: Expr, ins: list[np.ndarray]) -> np.ndarray:
    head = e[0]
    if head == "in":
        x = ins[e[1]]
        return x.astype(compute_dtype(x.dtype), copy=False)
    if head == "const":
        d = as_dtype(e[2]).np
        return np.asarray(e[1], dtype=compute_dtype(d))
    if head == "cast":
        d = as_dtype(e[1]).np
        # Round through the target type, as the unfused cast would, then keep computing wide.
        return _eval(e[2], ins).astype(d).astype(compute_dtype(d), copy=False)
    if head == "gelu":
        return gelu(_eval(e[2], ins), e[1])
    args = [_eval(k, ins) for k in e[1:]]
    if head == "where":
        return np.where(*args)
    if head in UNARY:
        return UNARY[head](args[0])
    return BINARY[head](*args)


def fused_elementwise(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        r = _eval(attrs["expr"], ins)
    return np.broadcast_to(down(r, dtype), attrs["out_shape"])


def fused_reduce(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        r = np.broadcast_to(_eval(attrs["expr"], ins), attrs["out_shape"])
    if attrs["reduce"] in ("max", "min", "argmax"):
        r = r.astype(dtype.np if attrs["reduce"] != "argmax" else r.dtype, copy=False)
    return reduce(attrs["reduce"], r, attrs, dtype)
