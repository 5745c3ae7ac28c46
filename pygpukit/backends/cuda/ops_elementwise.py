"""Planners for elementwise steps: every op of ir/elementwise.py, full, arange and
fused_elementwise. All but arange go through the one expression generator."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pygpukit import _native
from pygpukit.ir import dtypes, elementwise
from pygpukit.passes import Step

from . import compiler, ew
from .codegen import fill
from .codegen.expr import step_expr
from .context import Context, cdiv, contiguous, numel
from .kernels import loader
from .value import DeviceValue

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_expr(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    if is_zero_fill(step):
        return _plan_zero_fill(ctx, step)
    if step.op == "fused_elementwise":
        expr = step.attrs["expr"]
    elif step.op == "full":
        expr = ("const", step.attrs["value"], step.dtype.name)
    else:
        expr = step_expr(step.op, step.attrs, len(ins))
    shape, dtype = step.shape, step.dtype
    launch = ew.make(ctx, expr, ins, shape, contiguous(shape), dtype, 256, tag=tag)
    what = f"{step.op}"

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, what)
        launch(out.ptr, [v.ptr for v in vals])
        return out

    return run


def zero_bytes(value: object) -> bool:
    """Whether a fill value is all zero bytes in every dtype (0, 0.0, False; not -0.0)."""
    return isinstance(value, int | float) and value == 0 and math.copysign(1.0, value) > 0


def is_zero_fill(step: Step) -> bool:
    """Whether the step is planned as a memset (_plan_zero_fill), not a kernel launch: the
    dispatch recorder sees launches only, so a schedule holding one is never recorded."""
    return step.op == "full" and zero_bytes(step.attrs["value"])


def _plan_zero_fill(ctx: Context, step: Step) -> Run:
    """A fill with zeros as a memset (the copy engine's, captured as a memset node): no
    kernel to compile. A new generator's KV cache is its first fill: its generated fill
    kernel's compile was most of the 97-103 ms a cold first prefill call spent making it
    on the H200."""
    shape, dtype = step.shape, step.dtype
    nbytes = numel(shape) * dtype.itemsize

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "full")
        if nbytes:
            _native.memset(out.ptr, 0, nbytes, ctx.stream)
        return out

    return run


def plan_arange(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    start, stp = step.attrs["start"], step.attrs["step"]
    integral = isinstance(start, int) and isinstance(stp, int)
    src = fill.generate(fill.ArangeSpec(step.dtype, integral))
    fn = compiler.function(src)
    shape, dtype = step.shape, step.dtype
    n = numel(shape)
    grid = (max(1, min(cdiv(n, 256), ctx.sm_count * 16)),)
    args = (n, start, stp) if integral else (n, float(start), float(stp))

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "arange")
        if n:
            fn.launch(
                grid, (256,), src.fmt, (out.ptr, *args), 0, ctx.stream, pdl=loader.pdl_enabled()
            )
        return out

    return run


# The ops plan_expr takes: the registry's, a constant, and fused expressions.
ELEMENTWISE_OPS = {*elementwise.OPS, "fused_elementwise", "full"}


def arange_values(ctx: Context, n: int, shape: tuple[int, ...]) -> DeviceValue:
    """A small int64 0..n-1 array made at plan time and kept by the plan (mask indices)."""
    src = fill.generate(fill.ArangeSpec(dtypes.int64, True))
    out = ctx.alloc(shape, dtypes.int64, "arange")
    if n:
        grid = (max(1, min(cdiv(n, 256), ctx.sm_count * 16)),)
        compiler.function(src).launch(
            grid, (256,), src.fmt, (out.ptr, n, 0, 1), 0, ctx.stream, pdl=loader.pdl_enabled()
        )
    return out
