"""Launchers for activation.cuh: GELU (tanh, erf), SiLU, SwiGLU."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from .. import toolchain
from . import loader
from ._common import cdiv, positive

DTYPES = loader.FLOAT_DTYPES
_KERNELS = {"gelu_tanh": "pgk_gelu_tanh", "gelu_erf": "pgk_gelu_erf", "silu": "pgk_silu"}


def unary(kind: str, x: int, y: int, n: int, dtype: str, *, stream: Any = None) -> None:
    """y = act(x) over n contiguous elements; kind in gelu_tanh, gelu_erf, silu."""
    if kind not in _KERNELS:
        raise ShapeError(f"activation: unknown kind {kind!r} (one of {', '.join(_KERNELS)})")
    loader.check_dtype(dtype, DTYPES, kind)
    positive(kind, n=n)
    if n == 0:
        return
    vec = loader.vec_width(dtype, ptrs=(x, y))
    fn = loader.get_kernel(
        "activation", _KERNELS[kind], {**loader.type_defines(dtype), "PGK_VEC": vec}
    )
    blocks = max(1, min(cdiv(n // vec, 256), toolchain.sm_count() * 16))
    fn.launch((blocks,), (256,), (x, y, n), 0, stream)


def gelu_tanh(x: int, y: int, n: int, dtype: str, *, stream: Any = None) -> None:
    unary("gelu_tanh", x, y, n, dtype, stream=stream)


def gelu_erf(x: int, y: int, n: int, dtype: str, *, stream: Any = None) -> None:
    unary("gelu_erf", x, y, n, dtype, stream=stream)


def silu(x: int, y: int, n: int, dtype: str, *, stream: Any = None) -> None:
    unary("silu", x, y, n, dtype, stream=stream)


def swiglu(
    gate: int,
    up: int,
    y: int,
    rows: int,
    cols: int,
    dtype: str,
    *,
    gate_stride: int | None = None,
    up_stride: int | None = None,
    y_stride: int | None = None,
    stream: Any = None,
) -> None:
    """y[r, c] = silu(gate[r, c]) * up[r, c]; row strides in elements (default cols), so the
    halves of a fused [rows, 2 * cols] projection pass as (p, p + cols * itemsize, 2 * cols)."""
    loader.check_dtype(dtype, DTYPES, "swiglu")
    positive("swiglu", rows=rows, cols=cols)
    gs = cols if gate_stride is None else gate_stride
    us = cols if up_stride is None else up_stride
    ys = cols if y_stride is None else y_stride
    if rows == 0 or cols == 0:
        return
    vec = loader.vec_width(dtype, cols, gs, us, ys, ptrs=(gate, up, y))
    defines = {**loader.type_defines(dtype), "PGK_VEC": vec}
    fn = loader.get_kernel("activation", "pgk_swiglu", defines)
    nv = cdiv(cols, vec)
    tx = min(256, max(32, cdiv(nv, 32) * 32))
    ty = max(1, 256 // tx)
    grid = (cdiv(nv, tx), min(65535, cdiv(rows, ty)))
    fn.launch(
        grid,
        (tx, ty),
        (gate, up, y, rows, cols, gs, us, ys),
        0,
        stream,
    )
