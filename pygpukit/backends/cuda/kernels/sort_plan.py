"""Plans sort steps (sort, argsort, topk) onto sort.py's row launcher. The sorted axis is
made the last one (a permuted view), rows that are not unit-stride are copied first, and
the result is written as contiguous rows of k and returned as a view in the step's order."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from ..context import Context, contiguous
from ..materialize import as_rows
from ..value import DeviceValue
from . import sort

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_sort(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """sort of x along attrs["axis"]: the first k values, or with attrs["indices"] their
    int64 positions; attrs["descending"] reverses the order."""
    x = ins[0]
    a = step.attrs
    axis, nd, dtype = a["axis"], len(x.shape), step.dtype
    perm = [d for d in range(nd) if d != axis] + [axis]
    inv = [perm.index(d) for d in range(nd)]
    xp = x.view(tuple(x.shape[p] for p in perm), tuple(x.strides[p] for p in perm), x.offset)
    fix, rows, cols, rs = as_rows(ctx, xp, tag)
    sort.check_row(x.dtype.name, cols)  # a row too long fails here, before any launch
    k = cols if a.get("k") is None else a["k"]
    oshape = xp.shape[:-1] + (k,)
    out_st = tuple(contiguous(oshape)[i] for i in inv)
    want_idx, desc, in_dtype = bool(a.get("indices")), bool(a.get("descending")), x.dtype.name

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        xv = v[0]
        xv = fix(xv.view(xp.shape, tuple(xv.strides[p] for p in perm), xv.offset))
        y = ctx.alloc_out(oshape, dtype, "sort")
        vals, idx = (0, y.ptr) if want_idx else (y.ptr, 0)
        sort.sort(xv.ptr, vals, idx, rows, cols, k, in_dtype, descending=desc, x_row_stride=rs,
                  stream=ctx.stream)  # fmt: skip
        return y.view(step.shape, out_st, y.offset)

    return run


PLANNERS = {"sort": plan_sort}
