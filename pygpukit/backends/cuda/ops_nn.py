"""softmax, norms and swiglu through the template row launchers (kernels/). Inputs that
are not rows (unit inner stride, one row stride) are copied into that layout first; a softmax
over another axis runs on a permuted copy and returns a permuted view."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from . import ew
from .context import Context, contiguous, numel
from .kernels import activation, layer_norm, rms_norm, softmax
from .materialize import as_rows, contiguous_as
from .value import DeviceValue

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_softmax(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
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


def plan_norm(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """rms_norm(x, g), layer_norm(x, g, b), and rms_norm(x, g, r; has_residual): the norm of
    x + r rounded to x's dtype in one launch of pgk_rms_norm_add (no h_out: the sum has no
    other reader)."""
    x = ins[0]
    dtype, eps = step.dtype, float(step.attrs["eps"])
    fix, rows, cols, rs = as_rows(ctx, x, tag)
    has_res = step.op == "rms_norm" and bool(step.attrs.get("has_residual", False))
    n_params = len(ins) - 1 - has_res
    res_fix, _, _, res_rs = as_rows(ctx, ins[-1], tag) if has_res else (None, 0, 0, 0)
    # Weights may be wider than x (an upcast gain): the kernels take one weight dtype.
    wd = ins[1].dtype
    params = [contiguous_as(ctx, p, wd, tag, (cols,)) for p in ins[1 : 1 + n_params]]
    shape, op = step.shape, step.op

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        xv = fix(v[0])
        ps = [f(p) for f, p in zip(params, v[1 : 1 + n_params], strict=True)]
        rv = res_fix(v[-1]) if res_fix is not None else None
        y = ctx.alloc_out(shape, dtype, op)
        if rows and cols:
            if op == "rms_norm":
                rms_norm.rms_norm(
                    xv.ptr,
                    ps[0].ptr,
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
            else:
                layer_norm.layer_norm(
                    xv.ptr,
                    ps[0].ptr,
                    ps[1].ptr,
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


def plan_swiglu(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
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
