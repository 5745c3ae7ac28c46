"""Launchers for softmax.cuh: softmax / log-softmax over the last axis."""

from __future__ import annotations

from typing import Any

from . import loader
from ._common import int32_range, positive, row_config

DTYPES = loader.FLOAT_DTYPES


def softmax(
    x: int,
    y: int,
    rows: int,
    cols: int,
    dtype: str,
    *,
    log: bool = False,
    x_row_stride: int | None = None,
    y_row_stride: int | None = None,
    block_threads: int | None = None,
    stream: Any = None,
) -> None:
    """y[r, :] = softmax(x[r, :]) (or log_softmax); strides in elements, default cols."""
    loader.check_dtype(dtype, DTYPES, "softmax")
    positive("softmax", rows=rows, cols=cols)
    int32_range("softmax", cols=cols, rows=rows)
    xs = cols if x_row_stride is None else x_row_stride
    ys = cols if y_row_stride is None else y_row_stride
    if rows == 0 or cols == 0:
        return
    vec = loader.vec_width(dtype, cols, xs, ys, ptrs=(x, y))
    threads, items = row_config(cols, vec, 8 if dtype == "float64" else 4, block_threads)
    defines = {**loader.type_defines(dtype), "PGK_VEC": vec, "PGK_ITEMS": items}
    fn = loader.get_kernel("softmax", "pgk_log_softmax" if log else "pgk_softmax", defines)
    fn.launch(
        (rows,),
        (threads,),
        (x, y, cols, xs, ys),
        0,
        stream,
    )


def log_softmax(x: int, y: int, rows: int, cols: int, dtype: str, **kw: Any) -> None:
    softmax(x, y, rows, cols, dtype, log=True, **kw)
