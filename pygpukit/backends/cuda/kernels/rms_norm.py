"""Launcher for rms_norm.cuh: RMSNorm with an optional fused residual add."""

from __future__ import annotations

from typing import Any

from . import loader
from ._common import int32_range, positive, row_config

DTYPES = loader.FLOAT_DTYPES


def rms_norm(
    x: int,
    w: int,
    y: int,
    rows: int,
    cols: int,
    eps: float,
    dtype: str,
    *,
    residual: int = 0,
    h_out: int = 0,
    w_dtype: str | None = None,
    x_stride: int | None = None,
    residual_stride: int | None = None,
    y_stride: int | None = None,
    h_stride: int | None = None,
    block_threads: int | None = None,
    stream: Any = None,
) -> None:
    """y = x' * rsqrt(mean(x'^2) + eps) * w with x' = x + residual when residual is given;
    h_out (optional) receives x' rounded to dtype. w = 0 means no weight."""
    loader.check_dtype(dtype, DTYPES, "rms_norm")
    wd = w_dtype or dtype
    loader.check_dtype(wd, DTYPES, "rms_norm weight")
    positive("rms_norm", rows=rows, cols=cols)
    int32_range("rms_norm", cols=cols, rows=rows)
    xs = cols if x_stride is None else x_stride
    rs = cols if residual_stride is None else residual_stride
    ys = cols if y_stride is None else y_stride
    hs = cols if h_stride is None else h_stride
    if rows == 0 or cols == 0:
        return
    vec = loader.vec_width(dtype, cols, xs, rs, ys, hs, ptrs=(x, y, residual, h_out))
    if w and wd == dtype and w % 16:
        vec = 1
    threads, items = row_config(cols, vec, 8 if dtype == "float64" else 4, block_threads)
    defines = {**loader.type_defines(dtype), **loader.type_defines(wd, "PGK_W")}
    defines.update(PGK_VEC=vec, PGK_ITEMS=items)
    name = "pgk_rms_norm_add" if residual else "pgk_rms_norm"
    fn = loader.get_kernel("rms_norm", name, defines)
    fn.launch(
        (rows,),
        (threads,),
        (x, residual, w, y, h_out, cols, float(eps), xs, rs, ys, hs),
        0,
        stream,
    )
