"""Plans scan steps (cumsum, cumprod) onto scan.py's row launcher. The scanned axis is
made the last one (a permuted view), rows that are not unit-stride are copied first, and
the result is written as contiguous rows and returned as a view in the step's order."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from ..context import Context, contiguous
from ..materialize import as_rows
from ..value import DeviceValue
from . import scan

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_scan(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """scan of x along attrs["axis"] with attrs["kind"] (add: cumsum, mul: cumprod)."""
    x = ins[0]
    axis, nd, dtype, kind = step.attrs["axis"], len(x.shape), step.dtype, step.attrs["kind"]
    perm = [d for d in range(nd) if d != axis] + [axis]
    inv = [perm.index(d) for d in range(nd)]
    xp = x.view(tuple(x.shape[p] for p in perm), tuple(x.strides[p] for p in perm), x.offset)
    fix, rows, cols, rs = as_rows(ctx, xp, tag)
    pshape = xp.shape
    out_st = tuple(contiguous(pshape)[i] for i in inv)
    in_dtype = x.dtype.name

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        xv = v[0]
        xv = fix(xv.view(pshape, tuple(xv.strides[p] for p in perm), xv.offset))
        y = ctx.alloc_out(pshape, dtype, "scan")
        scan.scan(xv.ptr, y.ptr, rows, cols, in_dtype, kind=kind, x_row_stride=rs,
                  y_row_stride=cols, stream=ctx.stream)  # fmt: skip
        return y.view(step.shape, out_st, y.offset)

    return run


PLANNERS = {"scan": plan_scan}
