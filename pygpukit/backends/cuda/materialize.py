"""Plan-time helpers that give a kernel the layout it needs: a value as it is when it
already fits, else a contiguous (and, if asked, cast) copy made at run time."""

from __future__ import annotations

from collections.abc import Callable

from pygpukit.ir import DType

from . import ew
from .context import Context, contiguous
from .layout import is_contiguous, reshape_strides
from .value import DeviceValue

Fix = Callable[[DeviceValue], DeviceValue]


def contiguous_as(ctx: Context, x: DeviceValue, dtype: DType, tag: int,
                  shape: tuple[int, ...] | None = None) -> Fix:  # fmt: skip
    """x (broadcast to `shape` if given) as a contiguous array of `dtype`."""
    target = shape or x.shape
    if target == x.shape and dtype == x.dtype and is_contiguous(x.shape, x.strides):
        return lambda v: v
    expr = ("cast", dtype.name, ("in", 0))
    launch = ew.make(ctx, expr, [x], target, contiguous(target), dtype, 256, tag=tag)
    cst = contiguous(target)

    def run(v: DeviceValue) -> DeviceValue:
        out = ctx.alloc(target, dtype, "copy")
        launch(out.ptr, [v.ptr])
        return out.view(target, cst, out.offset)

    return run


def as_rows(ctx: Context, x: DeviceValue, tag: int) -> tuple[Fix, int, int, int]:
    """(fix, rows, cols, row_stride): x as rows with unit inner stride and one row stride."""
    cols = x.shape[-1] if x.shape else 1
    rows = x.size // cols if cols else 0
    st = reshape_strides(x.shape, x.strides, (rows, cols)) if x.shape else None
    if st is not None and (st[1] == 1 or cols <= 1):
        return (lambda v: v), rows, cols, st[0] if rows > 1 else cols
    return contiguous_as(ctx, x, x.dtype, tag), rows, cols, cols
