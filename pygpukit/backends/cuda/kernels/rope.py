"""Launcher for rope.cuh: rotary embedding, half-split or interleaved layout."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from . import loader
from ._common import cdiv, int32_range, positive

DTYPES = ("float32", "float16", "bfloat16")


def rope(
    x: int,
    y: int,
    cos: int,
    sin: int,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    dtype: str,
    *,
    interleaved: bool = False,
    pos_offset: int = 0,
    cs_dtype: str | None = None,
    x_strides: tuple[int, int, int] | None = None,
    y_strides: tuple[int, int, int] | None = None,
    cs_stride: int | None = None,
    stream: Any = None,
) -> None:
    """Rotates x[b, h, s, :] by the angles of table row (*pos_offset + s) into y (may be x).

    cos/sin: [max_pos, head_dim // 2] tables (row stride cs_stride, default head_dim // 2).
    pos_offset: device pointer to an int32 start position, or 0 for position 0.
    Strides (batch, head, seq) in elements; default contiguous [B, H, S, D].
    """
    loader.check_dtype(dtype, DTYPES, "rope")
    csd = cs_dtype or dtype
    loader.check_dtype(csd, DTYPES, "rope cos/sin")
    positive("rope", batch=batch, heads=heads, seq=seq, head_dim=head_dim)
    if head_dim % 2:
        raise ShapeError(f"rope: head_dim must be even, got {head_dim}")
    half = head_dim // 2
    contiguous = (heads * seq * head_dim, seq * head_dim, head_dim)
    xs = x_strides or contiguous
    ys = y_strides or contiguous
    css = half if cs_stride is None else cs_stride
    rows = batch * heads * seq
    int32_range("rope", rows=rows)
    if rows == 0 or head_dim == 0:
        return
    vec = loader.vec_width(dtype, half, *xs, *ys, ptrs=(x, y))
    if csd == dtype and (cos % 16 or sin % 16 or css % vec):
        vec = 1
    tx = cdiv(half, vec)
    ty = max(1, 256 // tx)
    defines = {**loader.type_defines(dtype), **loader.type_defines(csd, "PGK_CS")}
    defines.update(PGK_VEC=vec, PGK_INTERLEAVED=int(interleaved))
    fn = loader.get_kernel("rope", "pgk_rope", defines)
    fn.launch(
        (cdiv(rows, ty),),
        (tx, ty),
        (x, y, cos, sin, pos_offset, heads, seq, head_dim, rows, *xs, *ys, css),
        0,
        stream,
    )


Strides3 = tuple[int, int, int]


def rope_kv_write(
    x: int,
    q_out: int,
    k_cache: int,
    v_cache: int,
    v: int,
    cos: int,
    sin: int,
    pos: int,
    pos_dtype: str,
    cache_len: int,
    batch: int,
    q_heads: int,
    kv_heads: int,
    seq: int,
    head_dim: int,
    dtype: str,
    *,
    interleaved: bool,
    cs_dtype: str,
    strides: tuple[Strides3, Strides3, Strides3, Strides3, Strides3],
    cs_stride: int,
    err: int = 0,
    tag: int = 0,
    stream: Any = None,
) -> None:
    """A prefill chunk's rope and cache stores in one launch (ir op rope_kv_write).

    x [B, q_heads + kv_heads, seq, D]: the query heads rotated into q_out, the key heads
    rotated into k_cache[:, :, p:p + seq]; v [B, kv_heads, seq, D] copied to
    v_cache[:, :, p:p + seq]. p: the int32/int64 (pos_dtype) at device pointer pos, wrapped
    and checked against the cache_len - seq + 1 starts (a bad one is recorded in the error
    word `err` with `tag`; nothing is stored). Token s uses table row s of cos/sin (row
    stride cs_stride). strides: (batch, head, seq) element strides of x, q_out, k_cache,
    v_cache and v, each with a unit inner stride.
    """
    loader.check_dtype(dtype, DTYPES, "rope_kv_write")
    loader.check_dtype(cs_dtype, DTYPES, "rope_kv_write cos/sin")
    positive("rope_kv_write", batch=batch, q_heads=q_heads, kv_heads=kv_heads, seq=seq,
             head_dim=head_dim)  # fmt: skip
    if head_dim % 2:
        raise ShapeError(f"rope_kv_write: head_dim must be even, got {head_dim}")
    if pos_dtype not in ("int32", "int64"):
        raise ShapeError(f"rope_kv_write: pos must be int32 or int64, got {pos_dtype}")
    half = head_dim // 2
    rows = batch * (q_heads + 2 * kv_heads) * seq
    int32_range("rope_kv_write", rows=rows)
    flat = [s for st in strides for s in st]
    vec = loader.vec_width(dtype, half, *flat, ptrs=(x, q_out, k_cache, v_cache, v))
    if cs_dtype == dtype and (cos % 16 or sin % 16 or cs_stride % vec):
        vec = 1
    tx = cdiv(half, vec)
    ty = max(1, 256 // tx)
    defines = {**loader.type_defines(dtype), **loader.type_defines(cs_dtype, "PGK_CS")}
    defines.update(PGK_VEC=vec, PGK_INTERLEAVED=int(interleaved))
    fn = loader.get_kernel("rope", "pgk_rope_kv_write", defines)
    fn.launch(
        (cdiv(rows, ty),),
        (tx, ty),
        (x, q_out, k_cache, v_cache, v, cos, sin, pos, int(pos_dtype == "int64"),
         cache_len - seq + 1, batch, q_heads, kv_heads, seq, head_dim, *flat, cs_stride, err,
         tag),
        0,
        stream,
    )  # fmt: skip
