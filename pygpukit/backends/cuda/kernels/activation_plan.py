"""Plans swiglu steps onto activation.py's SwiGLU launcher where gate and up are rows of
one shape and dtype; broadcasting or mixed dtypes run the same math as one generated
elementwise kernel."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from .. import ew
from ..context import Context, contiguous, numel
from ..materialize import as_rows
from ..value import DeviceValue
from . import activation

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_swiglu(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """silu(gate) * up."""
    g, u = ins
    dtype, shape = step.dtype, step.shape
    if (
        g.shape == u.shape == shape
        and g.dtype == u.dtype == dtype
        and dtype.name in (activation.DTYPES)
    ):
        fg, rows, cols, gs = as_rows(ctx, g, tag)
        fu, _, _, us = as_rows(ctx, u, tag)

        def run(v: Sequence[DeviceValue]) -> DeviceValue:
            gv, uv = fg(v[0]), fu(v[1])
            y = ctx.alloc_out(shape, dtype, "swiglu")
            if numel(shape):
                activation.swiglu(
                    gv.ptr,
                    uv.ptr,
                    y.ptr,
                    rows,
                    cols,
                    dtype.name,
                    gate_stride=gs,
                    up_stride=us,
                    y_stride=cols,
                    stream=ctx.stream,
                )
            return y

        return run
    # Broadcasting or mixed dtypes: the same math as one generated kernel.
    expr = ("mul", ("silu", ("in", 0)), ("in", 1))
    launch = ew.make(ctx, expr, ins, shape, contiguous(shape), dtype, 256, tag=tag)

    def run_ew(v: Sequence[DeviceValue]) -> DeviceValue:
        y = ctx.alloc_out(shape, dtype, "swiglu")
        launch(y.ptr, [x.ptr for x in v])
        return y

    return run_ew


PLANNERS = {"swiglu": plan_swiglu}
