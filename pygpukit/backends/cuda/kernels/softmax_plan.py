"""Plans softmax and log_softmax steps onto softmax.py's row launcher. Inputs that are not
rows (unit inner stride, one row stride) are copied into that layout first; a softmax
over another axis runs on a permuted copy and returns a permuted view."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from ..context import Context, contiguous
from ..materialize import as_rows
from ..value import DeviceValue
from . import softmax

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_softmax(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """softmax / log_softmax of x over attrs["axis"]."""
    x = ins[0]
    axis, nd, dtype = step.attrs["axis"], len(x.shape), step.dtype
    log = step.op == "log_softmax"
    perm = [d for d in range(nd) if d != axis] + [axis]
    inv = [perm.index(d) for d in range(nd)]
    xp = x.view(tuple(x.shape[p] for p in perm), tuple(x.strides[p] for p in perm), x.offset)
    fix, rows, cols, rs = as_rows(ctx, xp, tag)
    pshape = xp.shape
    pst = contiguous(pshape)
    out_st = tuple(pst[i] for i in inv)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        xv = v[0]
        xv = fix(xv.view(pshape, tuple(xv.strides[p] for p in perm), xv.offset))
        y = ctx.alloc_out(pshape, dtype, step.op)
        if rows and cols:
            softmax.softmax(
                xv.ptr,
                y.ptr,
                rows,
                cols,
                dtype.name,
                log=log,
                x_row_stride=rs,
                y_row_stride=cols,
                stream=ctx.stream,
            )
        return y.view(step.shape, out_st, y.offset)

    return run


PLANNERS = {"softmax": plan_softmax, "log_softmax": plan_softmax}
