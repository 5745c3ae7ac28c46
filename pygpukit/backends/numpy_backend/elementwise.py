"""Elementwise ops, casts and where: NumPy references of the generated GPU kernels."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit.ir import DType, dtypes

from .compute import down, up

_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray) -> np.ndarray:
    # NumPy has no erf ufunc; this is the reference, exact to double precision.
    return _erf(x).astype(x.dtype, copy=False) if x.size else x.copy()


def gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        c = np.asarray(math.sqrt(2.0 / math.pi), x.dtype)
        return 0.5 * x * (1.0 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x**3)))
    return 0.5 * x * (1.0 + erf(x / np.asarray(math.sqrt(2.0), x.dtype)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


UNARY: dict[str, Any] = {
    "neg": np.negative,
    "abs": np.absolute,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": sigmoid,
    "erf": erf,
    "silu": lambda x: x * sigmoid(x),
    "logical_not": np.logical_not,
}

BINARY: dict[str, Any] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
}


def unary(op: str, x: np.ndarray, attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    x = x.astype(dtype.np) if dtype.kind == "f" and x.dtype != dtype.np else x
    with np.errstate(all="ignore"):
        if op == "gelu":
            r = gelu(up(x), attrs.get("approximate", "none"))
        else:
            r = UNARY[op](up(x))
    return down(r, dtype)


def binary(op: str, a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    if op in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"):
        ct = dtypes.result_type(dtypes.as_dtype(a.dtype), dtypes.as_dtype(b.dtype)).np
        a, b = a.astype(ct, copy=False), b.astype(ct, copy=False)
    else:
        a, b = a.astype(dtype.np, copy=False), b.astype(dtype.np, copy=False)
    if op == "pow" and dtype.is_int and (b < 0).any():
        raise ValueError("Integers to negative integer powers are not allowed.")
    with np.errstate(all="ignore"):
        r = BINARY[op](up(a), up(b))
    return down(r, dtype)


def where(c: np.ndarray, x: np.ndarray, y: np.ndarray, dtype: DType) -> np.ndarray:
    return np.where(c, x.astype(dtype.np, copy=False), y.astype(dtype.np, copy=False))


def cast(x: np.ndarray, dtype: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(dtype.np)
