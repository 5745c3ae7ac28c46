"""Launchers for scan.cuh: cumsum and cumprod over the last axis of [rows, cols]."""

from __future__ import annotations

from typing import Any

from pygpukit.ir import dtypes

from ..codegen.cdtypes import STORAGE
from . import loader
from ._common import int32_range, positive, round_up

DTYPES = tuple(d.name for d in dtypes.ALL)
MAX_THREADS = 512


def scan_defines(dtype: str) -> dict[str, object]:
    """The template's types for input `dtype`: its storage, the result's (int64 for integers
    and bools) and the accumulator's."""
    d = dtypes.as_dtype(dtype)
    if d.is_float:
        out, acc = d.name, ("double" if d.name == "float64" else "float")
    else:
        out, acc = "int64", "long long"
    return {"PGK_T": STORAGE[d.name], "PGK_OUT": STORAGE[out], "PGK_SACC": acc,
            "PGK_SCAN_THREADS": MAX_THREADS}  # fmt: skip


def scan(
    x: int,
    y: int,
    rows: int,
    cols: int,
    dtype: str,
    *,
    kind: str = "add",
    x_row_stride: int | None = None,
    y_row_stride: int | None = None,
    stream: Any = None,
) -> None:
    """y[r, :] = cumsum(x[r, :]) (kind "add") or cumprod ("mul"); strides in elements,
    default cols. y's dtype is x's for floats, int64 for integers and bools."""
    loader.check_dtype(dtype, DTYPES, "scan")
    positive("scan", rows=rows, cols=cols)
    int32_range("scan", cols=cols, rows=rows)
    if kind not in ("add", "mul"):
        raise ValueError(f"scan: kind must be 'add' or 'mul', got {kind!r}")
    if rows == 0 or cols == 0:
        return
    xs = cols if x_row_stride is None else x_row_stride
    ys = cols if y_row_stride is None else y_row_stride
    name = "pgk_cumsum" if kind == "add" else "pgk_cumprod"
    fn = loader.get_kernel("scan", name, scan_defines(dtype))
    threads = min(MAX_THREADS, round_up(cols, 32))
    fn.launch((rows,), (threads,), (x, y, cols, xs, ys), 0, stream)
