"""Launchers for argmax_topk.cuh: argmax and top-k (k <= 64) over the last axis."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from . import loader
from ._common import int32_range, positive

DTYPES = ("float32", "float16", "bfloat16")
TOPK_THREADS = 512


def argmax(
    x: int,
    out_idx: int,
    rows: int,
    cols: int,
    dtype: str,
    *,
    row_stride: int | None = None,
    stream: Any = None,
) -> None:
    """out_idx[r] (int64) = first index of the largest x[r, :] (NaN counts as largest)."""
    loader.check_dtype(dtype, DTYPES, "argmax")
    positive("argmax", rows=rows, cols=cols)
    int32_range("argmax", cols=cols)
    if cols == 0:
        raise ShapeError("argmax: empty rows have no maximum")
    if rows == 0:
        return
    rs = cols if row_stride is None else row_stride
    vec = 16 // loader.itemsize(dtype)  # 16-byte loads where every row starts aligned
    vec = vec if x % 16 == 0 and rs % vec == 0 else 1
    fn = loader.get_kernel("argmax_topk", "pgk_argmax",
                           {**loader.type_defines(dtype), "PGK_AVEC": vec})  # fmt: skip
    threads = 1024 if cols >= 8192 else 256
    fn.launch(
        (rows,),
        (threads,),
        (x, out_idx, cols, rs),
        0,
        stream,
    )


def topk(
    x: int,
    out_val: int,
    out_idx: int,
    rows: int,
    cols: int,
    k: int,
    dtype: str,
    *,
    row_stride: int | None = None,
    stream: Any = None,
) -> None:
    """The k largest values of each row, sorted descending, and their int64 indices
    (ties: lower index first). out_val [rows, k] in dtype, out_idx [rows, k] int64."""
    loader.check_dtype(dtype, DTYPES, "topk")
    positive("topk", rows=rows, cols=cols, k=k)
    int32_range("topk", cols=cols)
    if not 1 <= k <= 64:
        raise ShapeError(f"topk: k must be in [1, 64], got {k}")
    if k > cols:
        raise ShapeError(f"topk: k={k} exceeds the row length {cols}")
    if rows == 0:
        return
    rs = cols if row_stride is None else row_stride
    defines = {**loader.type_defines(dtype), "PGK_TOPK_THREADS": TOPK_THREADS}
    fn = loader.get_kernel("argmax_topk", "pgk_topk", defines)
    fn.launch(
        (rows,),
        (TOPK_THREADS,),
        (x, out_val, out_idx, cols, k, rs),
        0,
        stream,
    )
