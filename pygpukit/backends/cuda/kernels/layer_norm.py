"""Launcher for layer_norm.cuh."""

from __future__ import annotations

from typing import Any

from . import loader
from ._common import int32_range, positive, row_config

DTYPES = loader.FLOAT_DTYPES


def layer_norm(
    x: int,
    w: int,
    b: int,
    y: int,
    rows: int,
    cols: int,
    eps: float,
    dtype: str,
    *,
    w_dtype: str | None = None,
    x_stride: int | None = None,
    y_stride: int | None = None,
    block_threads: int | None = None,
    stream: Any = None,
) -> None:
    """y = (x - mean) / sqrt(var + eps) * w + b over the last axis; w or b = 0 omits it."""
    loader.check_dtype(dtype, DTYPES, "layer_norm")
    wd = w_dtype or dtype
    loader.check_dtype(wd, DTYPES, "layer_norm weight")
    positive("layer_norm", rows=rows, cols=cols)
    int32_range("layer_norm", cols=cols, rows=rows)
    xs = cols if x_stride is None else x_stride
    ys = cols if y_stride is None else y_stride
    if rows == 0 or cols == 0:
        return
    vec = loader.vec_width(dtype, cols, xs, ys, ptrs=(x, y))
    if wd == dtype and (w % 16 or b % 16):
        vec = 1
    threads, items = row_config(cols, vec, 8 if dtype == "float64" else 4, block_threads)
    defines = {**loader.type_defines(dtype), **loader.type_defines(wd, "PGK_W")}
    defines.update(PGK_VEC=vec, PGK_ITEMS=items)
    fn = loader.get_kernel("layer_norm", "pgk_layer_norm", defines)
    fn.launch(
        (rows,),
        (threads,),
        (x, w, b, y, cols, float(eps), xs, ys),
        0,
        stream,
    )
