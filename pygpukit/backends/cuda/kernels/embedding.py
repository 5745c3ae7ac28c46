"""Launcher for embedding.cuh: bounds-checked row gather."""

from __future__ import annotations

from typing import Any

from . import loader
from ._common import cdiv, int32_range, positive

DTYPES = loader.FLOAT_DTYPES + ("int8", "uint8", "int32", "int64")
ID_DTYPES = ("int32", "int64")


def embedding(
    table: int,
    ids: int,
    out: int,
    n_ids: int,
    dim: int,
    vocab: int,
    dtype: str,
    *,
    id_dtype: str = "int32",
    table_stride: int | None = None,
    out_stride: int | None = None,
    stream: Any = None,
) -> None:
    """out[i, :] = table[ids[i], :]; ids outside [0, vocab) give a zero row."""
    loader.check_dtype(dtype, DTYPES, "embedding")
    loader.check_dtype(id_dtype, ID_DTYPES, "embedding ids")
    positive("embedding", n_ids=n_ids, dim=dim, vocab=vocab)
    int32_range("embedding", dim=dim)
    ts = dim if table_stride is None else table_stride
    os_ = dim if out_stride is None else out_stride
    if n_ids == 0 or dim == 0:
        return
    vec = loader.vec_width(dtype, dim, ts, os_, ptrs=(table, out))
    defines = {
        "PGK_T": loader.ctype(dtype),
        "PGK_IDX": loader.ctype(id_dtype),
        "PGK_VEC": vec,
    }
    fn = loader.get_kernel("embedding", "pgk_embedding", defines)
    nv = cdiv(dim, vec)
    tx = min(256, max(32, cdiv(nv, 32) * 32))
    ty = max(1, 256 // tx)
    fn.launch(
        (cdiv(n_ids, ty),),
        (tx, ty),
        (table, ids, out, n_ids, dim, vocab, ts, os_),
        0,
        stream,
    )
