"""matmul and linear: f16/bf16 multiply in f32, integers wrap like NumPy's."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.ir import DType
from pygpukit.ir.dtypes import as_dtype, result_type
from pygpukit.ir.linear import LinearSpec
from pygpukit.ir.quant import dequantize
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
    spec = LinearSpec.of(attrs, len(ins))
    p = spec.split(ins)
    x, w = p.x, p.w
    if p.prologue is not None:
        if spec.prologue == "rms_norm":
            x = nn.rms_norm(x, p.prologue, attrs, as_dtype(x.dtype))
        else:
            x = nn.swiglu(x, p.prologue, result_type(as_dtype(x.dtype), as_dtype(p.prologue.dtype)))
    if spec.quant is not None:
        assert p.scale is not None
        # The weight it stands for (ir/quant.py's reference), in float32 as the kernels
        # multiply: not rounded to x's dtype first.
        wf = dequantize(spec.quant, w, p.scale, p.zero, x.shape[-1]).astype(np.float32)
    else:
        wf = up(w.astype(dtype.np, copy=False))
    y = np.matmul(up(x.astype(dtype.np, copy=False)), wf.T)
    if p.bias is not None:
        y = y + up(p.bias)
    y = activation(y, spec.activation)
    if spec.glu == "swiglu":
        # As the unfused program: the product rounds to dtype before the gate reads it.
        gate, up_ = np.split(down(y, dtype), 2, axis=-1)
        y = up(nn.swiglu(gate, up_, dtype))
    if p.residual is not None:
        y = y + up(p.residual)
    return down(y, dtype)
