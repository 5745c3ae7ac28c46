"""Plans the paged KV-cache ops: paged_write (codegen/paged.py) stores rows at block slots
of a pool (in the pool's own memory when the memory plan lets the store happen in place,
else into a copy, as setitem); paged_sdpa attends through per-row block tables, on the
split-K kernel (paged_decode.cuh) where its rules hold, else on codegen/paged.py's simple
one (int64 tables or lengths, other head sizes). With one query per row in bf16 / f16
(the serving engine's steps), the decode rows run on that kernel's tensor-core body and
the rows of prompt pieces -- consecutive rows whose block tables agree -- go to
paged_prefill.cuh's tensor-core kernel, launched after the split one, which leaves them
to it: which rows those are is decided on the device, so one
captured graph serves every mix of decode rows and pieces. paged_sdpa with rope (q rotated
by the rows' tables) has those two kernels rotate q as they read it, else the rope op's
plan runs first."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from pygpukit import errors
from pygpukit.ir import dtypes
from pygpukit.passes import Step

from .. import compiler, ew
from ..codegen import paged
from ..context import Context, capturing, cdiv, contiguous
from ..value import DeviceValue
from . import loader, paged_decode, paged_prefill, rope_plan

Run = Callable[[Sequence[DeviceValue]], DeviceValue]
MaybeRun = Callable[[Sequence[DeviceValue]], DeviceValue | None]  # None: launched nothing
COPY = ("in", 0)
MAX_SMEM = 48 << 10  # the dynamic shared memory a launch gets without opting in


# Elements of a row each thread of paged_write stores where D is a multiple and the store
# still has a block of threads an SM (else one): its 64-bit index arithmetic, five
# divisions an element, had made the serving engine's 1024-token store (1 MB of keys and
# values) take 7.5 us a layer on an H200; 5.2 us with 8 a thread. The 64-row decode step's
# store (32 K elements) took 3.7 us with 8 a thread (16 blocks) against 2.5 with one.
WRITE_VEC = 8


def write_vec(n: int, d: int, sms: int) -> int:
    """Elements a thread of paged_write stores for n elements of rows of d on sms SMs."""
    return WRITE_VEC if d % WRITE_VEC == 0 and n // WRITE_VEC >= sms * 256 else 1


def _store_rows(ctx: Context, step: Step, ins: Sequence[DeviceValue],
                tag: int) -> Callable[[int, Sequence[DeviceValue]], None]:  # fmt: skip
    """paged_write's launch: store(pool_ptr, values) writes the new rows into the pool at
    pool_ptr (contiguous, step.shape), the values as ins (pool, new, slots[, cos, sin])."""
    pool, new, slots = ins[:3]
    shape, dtype = step.shape, step.dtype
    rope = step.attrs.get("rope", "none")
    n_blocks, kv, bs, d = shape
    t = new.shape[0]
    vec = write_vec(t * kv * d, d, ctx.sm_count)
    src = paged.write_kernel(paged.WriteSpec(dtype, new.dtype, slots.dtype, rope, vec))
    fn = compiler.function(src)
    n = t * kv * d // vec
    tail: tuple[object, ...] = (t, kv, d, bs, n_blocks * bs, *new.strides, slots.strides[0],
                                ctx.err_addr, tag)  # fmt: skip
    rope_tail = (step.attrs["rope_heads"], *ins[3].strides) if rope != "none" else ()
    if rope != "none" and ins[3].strides != ins[4].strides:
        raise errors.GPUKitValueError(f"paged_write: cos and sin strides differ "
                                      f"({ins[3].strides}, {ins[4].strides})")  # fmt: skip
    grid = (max(1, min(cdiv(n, 256), ctx.sm_count * 16)),)

    def store(out: int, v: Sequence[DeviceValue]) -> None:
        tables = (v[3].ptr, v[4].ptr, *rope_tail) if rope_tail else ()
        if n:
            fn.launch(grid, (256,), src.fmt, (out, v[1].ptr, v[2].ptr, *tail, *tables), 0,
                      ctx.stream, pdl=loader.pdl_enabled())  # fmt: skip

    return store


def plan_paged_write(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    shape, dtype = step.shape, step.dtype
    copy = ew.make(ctx, COPY, [ins[0]], shape, contiguous(shape), dtype, 256, tag=tag)
    store = _store_rows(ctx, step, ins, tag)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "paged_write")
        if out.storage is not v[0].storage or out.ptr != v[0].ptr:
            copy(out.ptr, [v[0].ptr])  # not in place: the rows go into a fresh copy
        store(out.ptr, v)
        return out

    return run


# Rows up to which paged_sdpa_append runs fused (the decode kernel storing the new rows);
# above it, paged_write's launch and then the attention. H200, TinyLlama shape, serving
# decode step (serve_load --step-times, two alternating runs each, fused / unfused, ms):
# 1 row 0.924 / 0.932 against 0.956 / 0.958, 16 rows 1.257 / 1.240 against 1.262 / 1.265,
# 64 rows 1.500 / 1.497 against 1.455 / 1.457. At 64 rows the fused attention took 17.6 us
# a layer against the store's 2.6 and the attention's 14.2: after cuBLASLt's QKV GEMM
# (no early trigger) its 256 blocks launch only then, where unfused they were resident
# and waiting behind the store. With the kernel after a decode GEMM started early
# (cublaslt.EARLY_MAX_ROWS), fused up to 80 rows: 32 rows 1.304 ms against 1.320-1.332
# (so fused to 32), 64 rows still slower, 1.479 against 1.455 (three alternating rounds of
# 40 steps each).
APPEND_MAX_ROWS = 32


def plan_paged_sdpa_append(ctx: Context, step: Step, ins: Sequence[DeviceValue],
                           tag: int) -> Run:  # fmt: skip
    """paged_sdpa_append: the tensor-core decode kernel stores each row's new key (rotated)
    and value into the pool itself (paged_decode.attend's append) where its rules hold, up
    to APPEND_MAX_ROWS rows; else paged_write's launch into the pool's own memory, then
    paged_sdpa over its halves. The pool is the compiled step's own (the fusing pass's
    rule): written in place either way."""
    q, pool, new, slots = ins[:4]
    rope = step.attrs.get("rope", "none")
    n_blocks, kv2, bs, d = pool.shape
    kv = kv2 // 2
    if pool.strides != contiguous(pool.shape):
        raise errors.GPUKitValueError(f"paged_sdpa_append: the pool must be contiguous, got "
                                      f"strides {pool.strides}")  # fmt: skip
    half_shape = (n_blocks, kv, bs, d)

    def halves(p: DeviceValue) -> list[DeviceValue]:
        return [p.view(half_shape, p.strides, p.offset),
                p.view(half_shape, p.strides, p.offset + kv * p.strides[1])]  # fmt: skip

    write = replace(step, op="paged_write", shape=pool.shape, dtype=pool.dtype,
                    attrs={"rope": rope, "rope_heads": kv})  # fmt: skip
    store = _store_rows(ctx, write, [pool, new, slots, *ins[6:8]], tag)
    attn = replace(step, op="paged_sdpa", attrs={**step.attrs, "pieces": False})
    attn_ins = [q, *halves(pool), *ins[4:8]]
    attend = plan_paged_sdpa(ctx, attn, attn_ins, tag)
    fused = None
    if (
        q.shape[0] <= APPEND_MAX_ROWS and rope == "half" and new.dtype == pool.dtype
        and slots.dtype in (dtypes.int32, dtypes.int64)
        and new.strides[1:] == (d, 1) and ins[6].dtype == step.dtype
        and ins[7].dtype == step.dtype and ins[6].strides == ins[7].strides
        and (ins[6].strides[1] == 1 or d // 2 <= 1)
    ):  # fmt: skip
        fused = _plan_split(ctx, attn, attn_ins, tag, _scale(step, d), rope=True,
                            append=True)  # fmt: skip

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        pv = v[1]
        ins_ = [v[0], *halves(pv), *v[4:8]]
        if fused is not None and paged_decode.rope_fits(v[6].ptr, v[7].ptr, v[6].strides[0]):
            got = fused([*ins_, v[2], v[3]])
            if got is not None:
                return got
        store(pv.ptr, [pv, v[2], v[3], v[6], v[7]])
        return attend(ins_)

    return run


def plan_paged_sdpa(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    rope = step.attrs.get("rope", "none")
    if rope != "none":
        return _plan_rotated(ctx, step, ins, tag, rope)
    return _plan_attend(ctx, step, ins, tag)


def _plan_rotated(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int,
                  layout: str) -> Run:  # fmt: skip
    """paged_sdpa with q rotated by the rows' tables (attrs rope): the tensor-core kernels
    rotate q as they read it (half-split, tables of q's dtype with unit inner stride and
    4-byte aligned rows, q in 4-byte pairs), one launch fewer than the rope op; else the
    rope op's own plan into scratch, then the attention on its result."""
    q, kp, vp, table, lens, cos, sin = ins
    b, h, _, d = q.shape
    plain = replace(step, attrs={k: v for k, v in step.attrs.items() if k != "rope"})
    # The rotated q: rope's [1, H, B, D] (the rows as its sequence, table row b for row b),
    # read back as [B, H, 1, D].
    rot_step = replace(step, op="rope", shape=(1, h, b, d), attrs={"layout": layout})
    q_seq = q.view((1, h, b, d), (0, q.strides[1], q.strides[0], q.strides[3]), q.offset)
    rot = rope_plan.plan_rope(ctx, rot_step, [q_seq, cos, sin], tag)
    rq_strides = (d, b * d, d, 1)
    rq = DeviceValue(q.storage, q.shape, rq_strides, 0, q.dtype)
    composed = _plan_attend(ctx, plain, [rq, kp, vp, table, lens], tag)
    fused = None
    if (
        layout == "half" and cos.dtype == step.dtype and sin.dtype == step.dtype
        and cos.strides == sin.strides and (cos.strides[1] == 1 or d // 2 <= 1)
    ):  # fmt: skip
        fused = _plan_split(ctx, plain, ins[:5], tag, _scale(step, d), rope=True)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        if fused is not None and paged_decode.rope_fits(v[5].ptr, v[6].ptr, v[5].strides[0]):
            got = fused(v)
            if got is not None:
                return got
        with ctx.scratch_only():
            y = rot([v[0].view((1, h, b, d), q_seq.strides, v[0].offset), v[5], v[6]])
        return composed([y.view(q.shape, rq_strides, y.offset), *v[1:5]])

    return run


def _scale(step: Step, d: int) -> float:
    scale = step.attrs.get("scale")
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _plan_attend(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    q, kp, vp, table, lens = ins
    shape, dtype = step.shape, step.dtype
    b, h, t, d = q.shape
    n_blocks, kv, bs, _ = kp.shape
    p_sb = kp.strides[0]
    for name, p in (("k_pool", kp), ("v_pool", vp)):
        # A block's heads contiguous; blocks apart by any stride the two pools share (the
        # key and value halves of one pool [n_blocks, 2 KV, block, D] are such views).
        inner = contiguous(p.shape)
        if p.strides[1:] != inner[1:] or p.strides[0] != p_sb or p_sb < inner[0]:
            raise errors.GPUKitValueError(f"paged_sdpa: {name} must have contiguous blocks "
                                          f"apart by the other pool's stride, got strides "
                                          f"{p.strides} (k_pool {kp.strides})")  # fmt: skip
    m = table.shape[1]
    scale = _scale(step, d)
    fast = _plan_split(ctx, step, ins, tag, scale)
    if fast is not None:
        return cast(Run, fast)  # gives None only with rope
    smem = m * bs * 4
    if smem > MAX_SMEM:
        raise errors.GPUKitValueError(f"paged_sdpa: {m} blocks of {bs} keys need {smem} bytes "
                                      f"of shared memory (at most {MAX_SMEM})")  # fmt: skip
    src = paged.attend_kernel(paged.AttendSpec(dtype, table.dtype, lens.dtype))
    fn = compiler.function(src)
    tail = (h, t, d, kv, bs, n_blocks, p_sb, m, *q.strides, *table.strides, lens.strides[0],
            scale, ctx.err_addr, tag)  # fmt: skip
    grid = (b * h * t,)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        out = ctx.alloc_out(shape, dtype, "paged_sdpa")
        if b * h * t:
            fn.launch(grid, (paged.THREADS,), src.fmt,
                      (out.ptr, v[0].ptr, v[1].ptr, v[2].ptr, v[3].ptr, v[4].ptr, *tail), smem,
                      ctx.stream, pdl=loader.pdl_enabled())  # fmt: skip
        return out

    return run


def _plan_split(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int, scale: float,
                rope: bool = False, append: bool = False) -> MaybeRun | None:  # fmt: skip
    """paged_sdpa on paged_decode.cuh, or None where its rules do not hold: float pools
    of head size 64 or 128 (blocks a multiple of D elements apart), int32 tables and
    lengths, q rows contiguous in D. rope: the values' 6th and 7th are q's tables (cos,
    sin [B, D/2], rope_fits), rotated by the tensor-core kernels as they read q; the run
    then gives None, launching nothing, where q's operands do not suit that body (the
    caller rotates q first). append (with rope, pieces False): the values' 8th and 9th
    are new_kv [B, 2 KV, D] and slots [B] (int32 / int64), stored by the kernel first
    (paged_decode attend's append)."""
    q, kp, vp, table, lens = ins[:5]
    if rope and not paged_decode.uses_mma(step.dtype.name, q.shape[2]):
        return None
    b, h, t, d = q.shape
    n_blocks, kv, bs, _ = kp.shape
    dt = step.dtype.name
    if (
        not paged_decode.supports(dt, d, h, kv, b, t) or kp.dtype != step.dtype
        or vp.dtype != step.dtype or table.dtype != dtypes.int32 or lens.dtype != dtypes.int32
        or q.strides[3] != 1 or t * b == 0 or kp.strides[0] % d
    ):  # fmt: skip
        return None
    p_sb = kp.strides[0]
    m = table.shape[1]
    splits = paged_decode.splits_for(b, h, kv, t, m * bs, ctx.sm_count, dt)
    ws = paged_decode.workspace_floats(b, h, splits, d)
    q_strides = (q.strides[0], q.strides[1], q.strides[2])
    shape, dtype = step.shape, step.dtype
    t_strides = (table.strides[0], table.strides[1])
    # A step that says it has no prompt pieces (attrs pieces False: the engine's decode-only
    # steps) skips the piece kernel's launch; its decode kernel then takes every row.
    pieces = (t == 1 and step.attrs.get("pieces", True)
              and paged_prefill.supports(dt, d, h, kv, b))  # fmt: skip

    def run(v: Sequence[DeviceValue]) -> DeviceValue | None:
        tables = (v[5].ptr, v[6].ptr, v[5].strides[0]) if rope else None
        if rope and not paged_decode.mma_fits(dt, t, v[0].ptr, q_strides):
            return None
        stores = (v[7].ptr, v[7].strides[0], v[8].ptr, v[8].strides[0]) if append else None
        out = ctx.alloc_out(shape, dtype, "paged_sdpa")
        work = ctx.alloc((ws,), dtypes.float32, "paged_sdpa") if ws else None
        tiles = pieces and paged_prefill.fits(v[0].ptr, q_strides[:2], v[1].ptr, v[2].ptr,
                                              out.ptr)  # fmt: skip
        paged_decode.attend(v[0].ptr, v[1].ptr, v[2].ptr, v[3].ptr, v[4].ptr, out.ptr,
                            work.ptr if work is not None else 0, rows=b, heads=h, kv_heads=kv,
                            n_q=t, head_dim=d, block_size=bs, n_blocks=n_blocks, max_blocks=m,
                            dtype=dt, splits=splits, scale=scale, q_strides=q_strides,
                            table_strides=t_strides, lens_stride=lens.strides[0],
                            err=ctx.err_addr, tag=tag, pieces=tiles,
                            pool_block_stride=p_sb, rope=tables, append=stores,
                            append_slot64=append and v[8].dtype == dtypes.int64,
                            decode_rows=step.attrs.get("decode_rows"),
                            # The pool is the compiled step's own (paged_sdpa_append's
                            # rule): the graph writes no key of it but this step's, which
                            # the kernel patches itself, so in a capture (the kernel ahead
                            # is the graph's own) it may read the pool early.
                            kv_early=append and capturing(ctx), stream=ctx.stream)  # fmt: skip
        if tiles:
            paged_prefill.attend(v[0].ptr, v[1].ptr, v[2].ptr, v[3].ptr, v[4].ptr, out.ptr,
                                 rows=b, heads=h, kv_heads=kv, head_dim=d, block_size=bs,
                                 n_blocks=n_blocks, max_blocks=m, dtype=dt, scale=scale,
                                 q_strides=q_strides[:2], table_strides=t_strides,
                                 lens_stride=lens.strides[0], err=ctx.err_addr, tag=tag,
                                 pool_block_stride=p_sb, rope=tables,
                                 stream=ctx.stream)  # fmt: skip
        return out

    return run


PLANNERS = {"paged_write": plan_paged_write, "paged_sdpa": plan_paged_sdpa,
            "paged_sdpa_append": plan_paged_sdpa_append}  # fmt: skip
