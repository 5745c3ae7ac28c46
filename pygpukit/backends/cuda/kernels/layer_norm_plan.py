"""Plans layer_norm steps onto layer_norm.py's row launcher (x copied into rows first
where it is not rows: unit inner stride, one row stride)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from ..context import Context
from ..materialize import as_rows, contiguous_as
from ..value import DeviceValue
from . import layer_norm

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_layer_norm(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """layer_norm(x, w, b) over the last axis."""
    x = ins[0]
    dtype, eps = step.dtype, float(step.attrs["eps"])
    fix, rows, cols, rs = as_rows(ctx, x, tag)
    # Weights may be wider than x (an upcast gain): the kernel takes one weight dtype.
    wd = ins[1].dtype
    params = [contiguous_as(ctx, p, wd, tag, (cols,)) for p in ins[1:3]]
    shape = step.shape

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        xv = fix(v[0])
        w, b = (f(p) for f, p in zip(params, v[1:3], strict=True))
        y = ctx.alloc_out(shape, dtype, "layer_norm")
        if rows and cols:
            layer_norm.layer_norm(
                xv.ptr,
                w.ptr,
                b.ptr,
                y.ptr,
                rows,
                cols,
                eps,
                dtype.name,
                w_dtype=wd.name,
                x_stride=rs,
                y_stride=cols,
                stream=ctx.stream,
            )
        return y

    return run


PLANNERS = {"layer_norm": plan_layer_norm}
