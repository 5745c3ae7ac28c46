"""Plans rope steps onto rope.py's launcher where x is [B, H, S, D] or [H, S, D] rows and
the tables share one layout and dtype; else two generated elementwise kernels (the two
halves of each rotated pair)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from .. import ew
from ..context import Context, contiguous, numel
from ..value import DeviceValue
from . import rope

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def heads_layout(x: DeviceValue) -> tuple[int, int, tuple[int, int, int]] | None:
    """(batch, heads, (batch, head, seq) strides) of [B, H, S, D] or [H, S, D] with unit
    inner stride."""
    if (x.strides[-1] != 1 and x.shape[-1] > 1) or len(x.shape) not in (3, 4):
        return None
    if len(x.shape) == 3:
        return 1, x.shape[0], (0, x.strides[0], x.strides[1])
    return x.shape[0], x.shape[1], (x.strides[0], x.strides[1], x.strides[2])


def plan_rope(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """rope(x, cos, sin) in attrs["layout"] (half-split or interleaved)."""
    x, cos, sin = ins
    dtype, shape = step.dtype, step.shape
    inter = step.attrs["layout"] == "interleaved"
    seq, hd = x.shape[-2], x.shape[-1]
    bhs = heads_layout(x)
    tables_ok = (
        all(
            all(d == 1 for d in t.shape[:-2]) and (t.strides[-1] == 1 or t.shape[-1] <= 1)
            for t in (cos, sin)
        )
        and cos.strides[-2] == sin.strides[-2]
        and cos.dtype == sin.dtype
    )
    if dtype.name in rope.DTYPES and bhs is not None and tables_ok and numel(shape):
        b, h, xs = bhs
        ys = (h * seq * hd, seq * hd, hd)
        css, csd = cos.strides[-2], cos.dtype.name

        def run(v: Sequence[DeviceValue]) -> DeviceValue:
            y = ctx.alloc_out(shape, dtype, "rope")
            rope.rope(v[0].ptr, y.ptr, v[1].ptr, v[2].ptr, b, h, seq, hd, dtype.name,
                      interleaved=inter, cs_dtype=csd, x_strides=xs, y_strides=ys,
                      cs_stride=css, stream=ctx.stream)  # fmt: skip
            return y

        return run
    return _rope_ew(ctx, step, ins, tag, inter)


def _rope_ew(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int,
             inter: bool) -> Run:  # fmt: skip
    x, cos, sin = ins
    dtype, shape = step.dtype, step.shape
    half = shape[-1] // 2
    hshape = shape[:-1] + (half,)
    ost = contiguous(shape)
    if inter:
        sub = lambda v, j: v.view(hshape, v.strides[:-1] + (2 * v.strides[-1],),  # noqa: E731
                                  v.offset + j * v.strides[-1])  # fmt: skip
        ost_h = ost[:-1] + (2,)
        offs = (0, 1)
    else:
        sub = lambda v, j: v.view(hshape, v.strides, v.offset + j * half * v.strides[-1])  # noqa: E731
        ost_h = ost
        offs = (0, half)
    a, b_, c, s = ("in", 0), ("in", 1), ("in", 2), ("in", 3)
    first = ("sub", ("mul", a, c), ("mul", b_, s))
    second = ("add", ("mul", b_, c), ("mul", a, s))
    args = [sub(x, 0), sub(x, 1), cos, sin]
    l1 = ew.make(ctx, first, args, hshape, ost_h, dtype, 256, tag=tag)
    l2 = ew.make(ctx, second, args, hshape, ost_h, dtype, 256 + offs[1] * dtype.itemsize,
                 tag=tag)  # fmt: skip
    isz = dtype.itemsize

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        y = ctx.alloc_out(shape, dtype, "rope")
        ptrs = [sub(v[0], 0).ptr, sub(v[0], 1).ptr, v[1].ptr, v[2].ptr]
        l1(y.ptr, ptrs)
        l2(y.ptr + offs[1] * isz, ptrs)
        return y

    return run


PLANNERS = {"rope": plan_rope}
