"""Planner for the reductions (ir.ops.REDUCTIONS) and fused_reduce steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.ir.ops import REDUCTIONS
from pygpukit.passes import Step

from . import compiler
from .codegen.reduce import BLOCK, ReduceSpec, generate
from .context import Context, cdiv, numel
from .kernels import argmax_topk, loader
from .layout import broadcast_strides, collapse
from .value import DeviceValue

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_reduce(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    rows = _argmax_rows(ctx, step, ins)
    if rows is not None:
        return rows
    if step.op == "fused_reduce":
        expr, op, full = step.attrs["expr"], step.attrs["reduce"], tuple(step.attrs["out_shape"])
    else:
        expr, op, full = ("in", 0), step.op, ins[0].shape
    axes = set(step.attrs["axes"])
    bst = [broadcast_strides(v.shape, v.strides, full) for v in ins]
    kept = [d for d in range(len(full)) if d not in axes]
    red = [d for d in range(len(full)) if d in axes]
    ksz, kst = collapse([full[d] for d in kept], *[[s[d] for d in kept] for s in bst])
    rsz, rst = collapse([full[d] for d in red], *[[s[d] for d in red] for s in bst])
    if not ins:
        kst, rst = [], []
    n_out = numel(tuple(full[d] for d in kept))
    r_total = numel(tuple(full[d] for d in red))
    inner_contig = bool(rsz) and all(s[-1] in (0, 1) for s in rst)
    block = r_total >= 64 and (inner_contig or n_out <= 4 * ctx.sm_count)
    spec = ReduceSpec(expr, tuple(v.dtype for v in ins), op, step.dtype, len(ksz), len(rsz),
                      "block" if block else "thread")  # fmt: skip
    src = generate(spec)
    fn = compiler.function(src)
    args: list[int] = [n_out, r_total, *ksz, *rsz]
    for k in range(len(ins)):
        args += kst[k] + rst[k]
    if block:
        grid = (max(1, min(n_out, ctx.sm_count * 32)),)
    else:
        grid = (max(1, min(cdiv(n_out, BLOCK), ctx.sm_count * 16)),)
    tail = (*args, ctx.err_addr, tag)
    shape, dtype, fmt = step.shape, step.dtype, src.fmt

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, op)
        if n_out:
            fn.launch(
                grid,
                (BLOCK,),
                fmt,
                (out.ptr, *[v.ptr for v in vals], *tail),
                0,
                ctx.stream,
                pdl=loader.pdl_enabled(),
            )
        return out

    return run


REDUCE_OPS = {*REDUCTIONS, "fused_reduce"}


def _argmax_rows(ctx: Context, step: Step, ins: Sequence[DeviceValue]) -> Run | None:
    """argmax over the last, unit-stride axis (a sampler's logits): the tuned kernel, one
    1024-thread block per row; the generated reduction gives a 32000-wide row one block
    of BLOCK threads (32 us on an H200 where this takes a few)."""
    if step.op != "argmax" or not ins:
        return None
    x = ins[0]
    nd = len(x.shape)
    if nd == 0 or tuple(step.attrs["axes"]) not in ((nd - 1,), (-1,)) or x.shape[-1] == 0:
        return None
    if x.dtype.name not in argmax_topk.DTYPES or (x.shape[-1] > 1 and x.strides[-1] != 1):
        return None
    rows = numel(x.shape[:-1])
    rshape, rst = collapse(list(x.shape[:-1]), list(x.strides[:-1]))
    if len(rshape) > 1:
        return None  # the rows do not fold into one stride
    row_stride = rst[0][0] if rshape else x.shape[-1]
    cols, shape, dtype = x.shape[-1], step.shape, step.dtype  # argmax gives int64 (ir/ops)

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "argmax")
        if rows:
            argmax_topk.argmax(vals[0].ptr, out.ptr, rows, cols, x.dtype.name,
                               row_stride=row_stride, stream=ctx.stream)  # fmt: skip
        return out

    return run
