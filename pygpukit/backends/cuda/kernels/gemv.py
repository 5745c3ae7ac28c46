"""Launcher for gemv.cuh: y = x @ W^T for a few rows of x, W [N, K] row-major."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from . import loader
from ._common import cdiv, int32_range, positive

DTYPES = ("float32", "float16", "bfloat16")
WARPS = 8


def gemv(
    x: int,
    w: int,
    y: int,
    n: int,
    k: int,
    dtype: str,
    *,
    m: int = 1,
    bias: int = 0,
    x_stride: int | None = None,
    w_stride: int | None = None,
    y_stride: int | None = None,
    unroll: int = 4,
    stream: Any = None,
) -> None:
    """y[i, :] = W @ x[i, :] (+ bias) for i < m; strides in elements (default dense).

    unroll: 16-byte loads of W in flight per lane before the first multiply."""
    loader.check_dtype(dtype, DTYPES, "gemv")
    positive("gemv", n=n, k=k, m=m)
    int32_range("gemv", n=n, k=k)
    if m > 65535:
        raise ShapeError(f"gemv: m={m} rows is a GEMM, not a GEMV (limit 65535)")
    xs = k if x_stride is None else x_stride
    ws = k if w_stride is None else w_stride
    ys = n if y_stride is None else y_stride
    if n == 0 or m == 0:
        return
    vec = loader.vec_width(dtype, xs, ws, ptrs=(x, w))
    defines = {
        **loader.type_defines(dtype),
        "PGK_VEC": vec,
        "PGK_WARPS": WARPS,
        "PGK_UNROLL": unroll,
    }
    fn = loader.get_function("gemv", "pgk_gemv", defines)
    fn.launch(
        (cdiv(n, WARPS), m),
        (WARPS * 32,),
        "PPPPiiqqq",
        (x, w, bias, y, n, k, xs, ws, ys),
        0,
        stream,
    )
