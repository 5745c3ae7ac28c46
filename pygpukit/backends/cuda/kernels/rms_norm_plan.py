"""Plans rms_norm steps onto rms_norm.py's row launcher (x copied into rows first where
it is not rows: unit inner stride, one row stride)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from ..context import Context
from ..materialize import as_rows, contiguous_as
from ..value import DeviceValue
from . import rms_norm

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_rms_norm(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """rms_norm(x, g), and rms_norm(x, g, r; has_residual): the norm of x + r rounded to
    x's dtype in one launch of pgk_rms_norm_add (no h_out: the sum has no other reader)."""
    x = ins[0]
    dtype, eps = step.dtype, float(step.attrs["eps"])
    fix, rows, cols, rs = as_rows(ctx, x, tag)
    has_res = bool(step.attrs.get("has_residual", False))
    res_fix, _, _, res_rs = as_rows(ctx, ins[-1], tag) if has_res else (None, 0, 0, 0)
    # The gain may be wider than x (an upcast gain): the kernel takes one weight dtype.
    wd = ins[1].dtype
    gain = contiguous_as(ctx, ins[1], wd, tag, (cols,))
    shape = step.shape

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        xv = fix(v[0])
        gv = gain(v[1])
        rv = res_fix(v[-1]) if res_fix is not None else None
        y = ctx.alloc_out(shape, dtype, "rms_norm")
        if rows and cols:
            rms_norm.rms_norm(
                xv.ptr,
                gv.ptr,
                y.ptr,
                rows,
                cols,
                eps,
                dtype.name,
                residual=rv.ptr if rv is not None else 0,
                w_dtype=wd.name,
                x_stride=rs,
                residual_stride=res_rs if rv is not None else None,
                y_stride=cols,
                stream=ctx.stream,
            )
        return y

    return run


PLANNERS = {"rms_norm": plan_rms_norm}
