"""matmul and linear: f16/bf16 multiply in f32, integers wrap like NumPy's."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType
from pygpukit.ir.dtypes import as_dtype, result_type
from pygpukit.ir.ops import linear_extras
from pygpukit.ir.reference import gelu, sigmoid

from . import nn
from .compute import down, up


def matmul(a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    a, b = a.astype(dtype.np, copy=False), b.astype(dtype.np, copy=False)
    if dtype.is_int:
        return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(dtype.np)
    return down(np.matmul(up(a), up(b)), dtype)


def activation(y: np.ndarray, name: str) -> np.ndarray:
    if name == "none":
        return y
    if name in ("gelu_tanh", "gelu_erf"):
        return gelu(y, "tanh" if name == "gelu_tanh" else "none")
    if name == "silu":
        return y * sigmoid(y)
    raise KeyError(f"unknown activation {name}")


def linear(ins: list[np.ndarray], attrs: dict[str, Any], dtype: DType) -> np.ndarray:
    """act(prologue(x) @ w.T + bias) + residual, rounded to dtype once at the end."""
    x, w, *extra = ins
    has_bias, has_res, prologue = linear_extras(attrs, len(extra))
    if prologue == "rms_norm":
        x = nn.rms_norm(x, extra[-1], attrs, as_dtype(x.dtype))
    elif prologue == "swiglu":
        x = nn.swiglu(x, extra[-1], result_type(as_dtype(x.dtype), as_dtype(extra[-1].dtype)))
    y = np.matmul(up(x.astype(dtype.np, copy=False)), up(w.astype(dtype.np, copy=False)).T)
    if has_bias:
        y = y + up(extra[0])
    y = activation(y, attrs.get("activation", "none"))
    if attrs.get("glu", "none") == "swiglu":
        # As the unfused program: the product rounds to dtype before the gate reads it.
        gate, up_ = np.split(down(y, dtype), 2, axis=-1)
        y = up(nn.swiglu(gate, up_, dtype))
    if has_res:
        y = y + up(extra[int(has_bias)])
    return down(y, dtype)
