"""Launcher for sort.cuh: sorted values and/or positions (the first k) of each row."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError, UnsupportedError
from pygpukit.ir import dtypes

from ..codegen.cdtypes import STORAGE
from . import loader
from ._common import int32_range, positive, pow2_at_least

DTYPES = tuple(d.name for d in dtypes.ALL)
MAX_THREADS = 512
DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a block gets without opting in


def key_type(dtype: str) -> str:
    """The C type rows are compared in: each value widened exactly."""
    d = dtypes.as_dtype(dtype)
    if d.is_float:
        return "double" if d.name == "float64" else "float"
    return "long long"


def sort_defines(dtype: str) -> dict[str, object]:
    return {"PGK_T": STORAGE[dtype], "PGK_KEY": key_type(dtype), "PGK_SORT_THREADS": MAX_THREADS}


def smem_bytes(dtype: str, n_pad: int) -> int:
    """Shared memory of a row padded to n_pad: a key and an int position per element."""
    key = 8 if key_type(dtype) != "float" else 4
    return n_pad * (key + 4)


def max_cols(dtype: str, optin: int) -> int:
    """The longest row one block can sort with `optin` bytes of shared memory."""
    n = 1
    while smem_bytes(dtype, n * 2) <= optin:
        n *= 2
    return n


def check_row(dtype: str, cols: int) -> tuple[int, int]:
    """(padded length, shared-memory bytes) of a row of cols elements, or UnsupportedError
    where one block of this GPU cannot hold it."""
    n_pad = max(2, pow2_at_least(cols))
    smem = smem_bytes(dtype, n_pad)
    if smem > DEFAULT_SMEM:
        optin = loader.max_shared_optin()
        if smem > optin:
            longest = max_cols(dtype, optin)
            raise UnsupportedError(
                f"sort: rows of {cols} {dtype} elements are longer than this GPU sorts in one "
                f"block ({longest}: {smem} bytes of shared memory, {optin} available)"
            )
    return n_pad, smem


def sort(
    x: int,
    values: int,
    indices: int,
    rows: int,
    cols: int,
    k: int,
    dtype: str,
    *,
    descending: bool = False,
    x_row_stride: int | None = None,
    stream: Any = None,
) -> None:
    """values[r, :k] (dtype; 0: not written) and indices[r, :k] (int64; 0: not written) of
    x[r, :] sorted ascending, NaN last (descending: reversed, NaN first), stable."""
    loader.check_dtype(dtype, DTYPES, "sort")
    positive("sort", rows=rows, cols=cols, k=k)
    int32_range("sort", cols=cols, rows=rows)
    if k > cols:
        raise ShapeError(f"sort: k={k} exceeds the row length {cols}")
    if rows == 0 or k == 0:
        return
    n_pad, smem = check_row(dtype, cols)
    fn = loader.get_kernel("sort", "pgk_sort", sort_defines(dtype))
    if smem > DEFAULT_SMEM:
        fn.set_dynamic_smem(smem)
    threads = max(32, min(MAX_THREADS, n_pad // 2))
    xs = cols if x_row_stride is None else x_row_stride
    fn.launch((rows,), (threads,), (x, values, indices, cols, n_pad, k, xs, int(descending)),
              smem, stream)  # fmt: skip
