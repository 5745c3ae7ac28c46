"""Plans sort steps (sort, argsort, topk) onto sort.py's row launcher. The sorted axis is
made the last one (a permuted view), rows that are not unit-stride are copied first, and
the result is written as contiguous rows of k and returned as a view in the step's order.

A descending top-k of at most 64 floats (f32/f16/bf16, a sampler's top-k over logits) runs on
argmax_topk's radix select instead: rows of any length (the bitonic kernel holds a row in
shared memory), the same order (NaN largest, ties by lower index) except that it ranks -0.0
below +0.0. It writes values and indices together; the one the step does not return goes
to scratch."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.ir import dtypes
from pygpukit.passes import Step

from ..context import Context, contiguous
from ..materialize import as_rows
from ..value import DeviceValue
from . import argmax_topk, sort

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
    k = cols if a.get("k") is None else a["k"]
    oshape = xp.shape[:-1] + (k,)
    out_st = tuple(contiguous(oshape)[i] for i in inv)
    want_idx, desc, in_dtype = bool(a.get("indices")), bool(a.get("descending")), x.dtype.name
    radix = desc and a.get("k") is not None and 1 <= k <= 64 and in_dtype in argmax_topk.DTYPES
    if not radix:
        sort.check_row(in_dtype, cols)  # a row too long fails here, before any launch
    other_dtype = x.dtype if want_idx else dtypes.int64  # the output the step does not return

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        xv = v[0]
        xv = fix(xv.view(xp.shape, tuple(xv.strides[p] for p in perm), xv.offset))
        y = ctx.alloc_out(oshape, dtype, "sort")
        if radix and rows:
            other = ctx.alloc(oshape, other_dtype, "topk")
            vals, idx = (other.ptr, y.ptr) if want_idx else (y.ptr, other.ptr)
            argmax_topk.topk(xv.ptr, vals, idx, rows, cols, k, in_dtype, row_stride=rs,
                             stream=ctx.stream)  # fmt: skip
        elif not radix:
            vals, idx = (0, y.ptr) if want_idx else (y.ptr, 0)
            sort.sort(xv.ptr, vals, idx, rows, cols, k, in_dtype, descending=desc,
                      x_row_stride=rs, stream=ctx.stream)  # fmt: skip
        return y.view(step.shape, out_st, y.offset)

    return run


PLANNERS = {"sort": plan_sort}
