"""Planners for views (reshape, permute, expand, static index: no copies), dynamic index
(offsets read on the device), concat, take and setitem."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.passes import Step

from . import compiler, ew
from .codegen import gather, mask
from .context import Context, cdiv, contiguous, numel
from .kernels import loader
from .layout import broadcast_strides, collapse, index_view, reshape_strides
from .value import DeviceValue

Run = Callable[[Sequence[DeviceValue]], DeviceValue]
COPY = ("in", 0)


def plan_view(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    x = ins[0]
    op, a, shape = step.op, step.attrs, step.shape
    if op == "after":  # the caches an sdpa_append or rope_kv_write stored into, as they now are
        return lambda v: v[0]
    if op == "permute":
        perm = a["perm"]
        strides = tuple(x.strides[p] for p in perm)
        return lambda v: v[0].view(shape, strides, v[0].offset)
    if op == "expand":
        strides = broadcast_strides(x.shape, x.strides, shape)
        return lambda v: v[0].view(shape, strides, v[0].offset)
    if op == "reshape":
        st = reshape_strides(x.shape, x.strides, shape)
        if st is not None:
            return lambda v: v[0].view(shape, st, v[0].offset)
        launch = ew.make(ctx, COPY, [x], x.shape, contiguous(x.shape), x.dtype, 256, tag=tag)
        cst = contiguous(shape)

        def run_copy(v: Sequence[DeviceValue]) -> DeviceValue:
            # The step's slot has the reshaped shape (same bytes, contiguous): asked for by
            # the input's shape, alloc_out would hand out scratch and the executor would
            # copy it into the slot afterwards.
            out = ctx.alloc_out(shape, v[0].dtype, "reshape")
            launch(out.ptr, [v[0].ptr])
            return out.view(shape, cst, out.offset)

        return run_copy
    return _plan_index(ctx, step, ins, tag)


def _plan_index(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    x = ins[0]
    shape, strides, delta, dyn = index_view(x.shape, x.strides, step.attrs["spec"])
    if not dyn:
        return lambda v: v[0].view(shape, strides, v[0].offset + delta)
    src_view = x.view(shape, strides, x.offset + delta)
    terms = [(0, ins[1 + k].dtype, size, st) for k, size, st in dyn]
    order = [1 + k for k, _, _ in dyn]
    launch = ew.make(ctx, COPY, [src_view], shape, contiguous(shape), x.dtype, 256, terms, tag)
    isz = x.dtype.itemsize

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, step.dtype, "index")
        launch(out.ptr, [v[0].ptr + delta * isz], [v[i].ptr for i in order])
        return out

    return run


def plan_concat(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    axis, shape, dtype = step.attrs["axis"], step.shape, step.dtype
    cst = contiguous(shape)
    parts = []
    start = 0
    for x in ins:
        sub_shape = shape[:axis] + (x.shape[axis],) + shape[axis + 1 :]
        off = start * cst[axis]
        cast = ("cast", dtype.name, COPY)
        launch = ew.make(ctx, cast, [x], sub_shape, cst, dtype, 256 + off * dtype.itemsize,
                         tag=tag)  # fmt: skip
        parts.append((launch, off * dtype.itemsize))
        start += x.shape[axis]

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "concat")
        for (launch, off), x in zip(parts, v, strict=True):
            launch(out.ptr + off, [x.ptr])
        return out

    return run


def plan_take(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    x, idx = ins
    axis, shape = step.attrs["axis"], step.shape
    ni = len(idx.shape)
    # Output dims: x's dims before axis, idx's dims, x's dims after axis.
    xst = list(x.strides[:axis]) + [0] * ni + list(x.strides[axis + 1 :])
    ibs = broadcast_strides(idx.shape, idx.strides, idx.shape)
    ist = [0] * axis + list(ibs) + [0] * (len(x.shape) - axis - 1)
    sizes, (cx, ci) = collapse(shape, xst, ist)
    if not sizes:
        sizes, cx, ci = [1], [0], [0]
    src = gather.generate(gather.TakeSpec(x.dtype, idx.dtype, len(sizes)))
    fn = compiler.function(src)
    n = numel(shape)
    tail = (n, *sizes, *cx, *ci, x.shape[axis], x.strides[axis], ctx.err_addr, tag)
    grid = (max(1, min(cdiv(n, 256), ctx.sm_count * 16)),)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, step.dtype, "take")
        if n:
            fn.launch(
                grid,
                (256,),
                src.fmt,
                (out.ptr, v[0].ptr, v[1].ptr, *tail),
                0,
                ctx.stream,
                pdl=loader.pdl_enabled(),
            )
        return out

    return run


def plan_mask_scan(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """flatnonzero (the True positions of a 1-D mask) and mask_rank (the True elements
    before each element): one block's scan of the mask (codegen/mask.py)."""
    (m,) = ins
    mode = "positions" if step.op == "flatnonzero" else "ranks"
    src = mask.generate(mask.MaskSpec(mode))
    fn = compiler.function(src)
    n, stride = m.shape[0], m.strides[0]
    count = step.attrs.get("count", n)
    shape = step.shape

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, step.dtype, step.op)
        if n and count:
            fn.launch((1,), (mask.THREADS,), src.fmt, (out.ptr, v[0].ptr, n, stride, count),
                      0, ctx.stream, pdl=loader.pdl_enabled())  # fmt: skip
        return out

    return run


def plan_setitem(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    x = ins[0]
    shape, dtype = step.shape, step.dtype
    cst = contiguous(shape)
    copy = ew.make(ctx, COPY, [x], shape, cst, dtype, 256, tag=tag)
    out_t = DeviceValue(x.storage, shape, cst, 0, dtype)
    store = store_into(ctx, out_t, ins[1], step.attrs["spec"], ins[2:], tag)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "setitem")
        if out.storage is not v[0].storage or out.ptr != v[0].ptr:
            copy(out.ptr, [v[0].ptr])  # not in place: the store goes to a fresh copy
        store(out, v[1], v[2:])
        return out

    return run


Store = Callable[[DeviceValue, DeviceValue, Sequence[DeviceValue]], None]


def store_into(ctx: Context, base: DeviceValue, val: DeviceValue, spec: tuple,
               dyn_ins: Sequence[DeviceValue], tag: int) -> Store:  # fmt: skip
    """base[spec] = val in base's own memory (layouts as the templates'): a launcher taking
    (base, val, dynamic index values)."""
    dtype = base.dtype
    rshape, rstrides, delta, dyn = index_view(base.shape, base.strides, spec)
    terms = [(-1, dyn_ins[k].dtype, size, st) for k, size, st in dyn]
    order = [k for k, _, _ in dyn]
    store = ew.make(ctx, ("cast", dtype.name, COPY), [val], rshape, rstrides, dtype,
                    256 + delta * dtype.itemsize, terms, tag)  # fmt: skip
    off = delta * dtype.itemsize

    def run(b: DeviceValue, v: DeviceValue, dyn_vals: Sequence[DeviceValue]) -> None:
        store(b.ptr + off, [v.ptr], [dyn_vals[i].ptr for i in order])

    return run


VIEW_OPS = {"reshape", "permute", "expand", "index", "after"}
