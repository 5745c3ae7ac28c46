"""Launcher for matmul_simple.cuh: strided batched matmul for every dtype."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pygpukit.errors import ShapeError

from . import loader
from ._common import cdiv, int32_range, positive

DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64")
TILE = 64


def _collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Drops size-1 batch dims and merges dims that are contiguous for every operand."""
    dims: list[int] = []
    sts: list[list[int]] = [[] for _ in strides]
    for i, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(st[-1] == s[i] * size for st, s in zip(sts, strides, strict=True)):
            dims[-1] *= size
            for st, s in zip(sts, strides, strict=True):
                st[-1] = s[i]
            continue
        dims.append(size)
        for st, s in zip(sts, strides, strict=True):
            st.append(s[i])
    return dims, sts


def matmul(
    a: int,
    b: int,
    c: int,
    m: int,
    n: int,
    k: int,
    dtype: str,
    *,
    batch_shape: Sequence[int] = (),
    a_strides: tuple[int, int] | None = None,
    b_strides: tuple[int, int] | None = None,
    c_strides: tuple[int, int] | None = None,
    a_batch_strides: Sequence[int] | None = None,
    b_batch_strides: Sequence[int] | None = None,
    c_batch_strides: Sequence[int] | None = None,
    stream: Any = None,
) -> None:
    """C[...] = A[...] @ B[...]: A [..., M, K], B [..., K, N], C [..., M, N].

    (row, col) strides and batch strides in elements; defaults are dense row-major. A batch
    stride of 0 broadcasts that operand. Integer types accumulate in integers and wrap like
    NumPy; float16/bfloat16 accumulate in float32; float64 in float64.
    """
    loader.check_dtype(dtype, DTYPES, "matmul")
    positive("matmul", m=m, n=n, k=k)
    int32_range("matmul", m=m, n=n, k=k)
    bs = list(batch_shape)
    nb = len(bs)
    ast = a_strides or (k, 1)
    bst = b_strides or (n, 1)
    cst = c_strides or (n, 1)

    def dense(inner: int) -> list[int]:
        out, acc = [], inner
        for size in reversed(bs):
            out.append(acc)
            acc *= size
        return out[::-1]

    abs_ = list(a_batch_strides) if a_batch_strides is not None else dense(m * k)
    bbs = list(b_batch_strides) if b_batch_strides is not None else dense(k * n)
    cbs = list(c_batch_strides) if c_batch_strides is not None else dense(m * n)
    if not (len(abs_) == len(bbs) == len(cbs) == nb):
        raise ShapeError("matmul: batch strides must match batch_shape in length")
    dims, (sa, sb, sc) = _collapse(bs, abs_, bbs, cbs)
    if len(dims) > 3:
        raise ShapeError(f"matmul: at most 3 non-mergeable batch dims, got {len(dims)}")
    while len(dims) < 3:
        dims.insert(0, 1)
        for s in (sa, sb, sc):
            s.insert(0, 0)
    nbatch = dims[0] * dims[1] * dims[2]
    if nbatch > 65535:
        raise ShapeError(f"matmul: batch {nbatch} exceeds 65535")
    if m == 0 or n == 0 or nbatch == 0:
        return
    fn = loader.get_kernel("matmul_simple", "pgk_matmul", loader.type_defines(dtype))
    fn.launch(
        (cdiv(n, TILE), cdiv(m, TILE), nbatch),
        (256,),
        (a, b, c, m, n, k, dims[1], dims[2], *ast, *bst, *cst, *sa, *sb, *sc),
        0,
        stream,
    )
