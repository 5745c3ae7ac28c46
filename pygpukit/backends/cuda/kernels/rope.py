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
