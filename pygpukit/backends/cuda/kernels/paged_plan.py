"""Plans the paged KV-cache ops (codegen/paged.py): paged_write stores rows at block
slots of a pool (in the pool's own memory when the memory plan lets the store happen in
place, else into a copy, as setitem), paged_sdpa attends through per-row block tables."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pygpukit import errors
from pygpukit.passes import Step

from .. import compiler, ew
from ..codegen import paged
from ..context import Context, cdiv, contiguous
from ..value import DeviceValue
from . import loader

Run = Callable[[Sequence[DeviceValue]], DeviceValue]
COPY = ("in", 0)
MAX_SMEM = 48 << 10  # the dynamic shared memory a launch gets without opting in


def plan_paged_write(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    pool, new, slots = ins
    shape, dtype = step.shape, step.dtype
    copy = ew.make(ctx, COPY, [pool], shape, contiguous(shape), dtype, 256, tag=tag)
    src = paged.write_kernel(paged.WriteSpec(dtype, new.dtype, slots.dtype))
    fn = compiler.function(src)
    n_blocks, kv, bs, d = shape
    t = new.shape[0]
    n = t * kv * d
    tail = (t, kv, d, bs, n_blocks * bs, *new.strides, slots.strides[0], ctx.err_addr, tag)
    grid = (max(1, min(cdiv(n, 256), ctx.sm_count * 16)),)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "paged_write")
        if out.storage is not v[0].storage or out.ptr != v[0].ptr:
            copy(out.ptr, [v[0].ptr])  # not in place: the rows go into a fresh copy
        if n:
            fn.launch(grid, (256,), src.fmt, (out.ptr, v[1].ptr, v[2].ptr, *tail), 0,
                      ctx.stream, pdl=loader.pdl_enabled())  # fmt: skip
        return out

    return run


def plan_paged_sdpa(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    q, kp, vp, table, lens = ins
    shape, dtype = step.shape, step.dtype
    b, h, t, d = q.shape
    n_blocks, kv, bs, _ = kp.shape
    for name, p in (("k_pool", kp), ("v_pool", vp)):
        if p.strides != contiguous(p.shape):
            raise errors.GPUKitValueError(f"paged_sdpa: {name} must be contiguous, got strides "
                                          f"{p.strides}")  # fmt: skip
    m = table.shape[1]
    smem = m * bs * 4
    if smem > MAX_SMEM:
        raise errors.GPUKitValueError(f"paged_sdpa: {m} blocks of {bs} keys need {smem} bytes "
                                      f"of shared memory (at most {MAX_SMEM})")  # fmt: skip
    src = paged.attend_kernel(paged.AttendSpec(dtype, table.dtype, lens.dtype))
    fn = compiler.function(src)
    scale = step.attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    tail = (h, t, d, kv, bs, n_blocks, m, *q.strides, *table.strides, lens.strides[0], scale,
            ctx.err_addr, tag)  # fmt: skip
    grid = (b * h * t,)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "paged_sdpa")
        if b * h * t:
            fn.launch(grid, (paged.THREADS,), src.fmt,
                      (out.ptr, v[0].ptr, v[1].ptr, v[2].ptr, v[3].ptr, v[4].ptr, *tail), smem,
                      ctx.stream, pdl=loader.pdl_enabled())  # fmt: skip
        return out

    return run


PLANNERS = {"paged_write": plan_paged_write, "paged_sdpa": plan_paged_sdpa}
