"""Plans sdpa and sdpa_append steps onto attention.py's prefill and decode launchers where
their layout and dtype rules hold, else the same math from generated kernels and
matmul_simple, accumulating in float32 (float64 for float64) like the NumPy reference."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from pygpukit import _native
from pygpukit.ir import dtypes
from pygpukit.passes import Step

from .. import ew
from ..context import Context, capturing, contiguous, numel
from ..materialize import contiguous_as
from ..ops_elementwise import arange_values
from ..ops_movement import store_into
from ..value import DeviceValue
from . import attention, attention_sm90, matmul_simple, softmax
from .rope_plan import heads_layout, plan_rope

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def plan_sdpa(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    if step.attrs.get("seq_major"):
        return _plan_seq_major(ctx, step, ins, tag)
    q, k, v = ins[:3]
    d = q.shape[-1]
    causal, scale = bool(step.attrs.get("causal")), step.attrs.get("scale")
    # The reference multiplies by the scale rounded to float32, as the kernels do.
    sc = float(np.float32(1.0 / math.sqrt(d) if scale is None else scale))
    if q.shape[-2] == 1:
        dec = _plan_decode(ctx, step, ins, tag, sc, causal)
        if dec is not None:
            return dec
    pre = _plan_prefill(ctx, step, ins, tag, sc, causal)
    if pre is None:
        pre = _plan_padded(ctx, step, ins, tag, sc, causal)
    if pre is not None:
        return pre
    return _sdpa_composed(ctx, step, ins, tag, sc, causal)


def _plan_seq_major(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """sdpa with its output [..., seq, heads, dim] (passes/sdpa_seq_major.py): the fused
    prefill kernels store each row there through their output strides; the other paths
    (decode, padded head dims, the composed math) run into scratch in the heads-major
    layout and one copy swaps it."""
    attrs = {k: v for k, v in step.attrs.items() if k != "seq_major"}
    shape = step.shape
    heads_major = shape[:-3] + (shape[-2], shape[-3], shape[-1])
    base = replace(step, attrs=attrs, shape=heads_major)
    q = ins[0]
    if q.shape[-2] > 1:
        d = q.shape[-1]
        sc = float(np.float32(1.0 / math.sqrt(d) if attrs.get("scale") is None
                              else attrs["scale"]))  # fmt: skip
        fused = _plan_prefill(ctx, base, ins, tag, sc, bool(attrs.get("causal")),
                              seq_major=True)  # fmt: skip
        if fused is not None:
            return fused
    run = plan_sdpa(ctx, base, ins, tag)
    nd = len(shape)
    swapped = list(contiguous(heads_major))
    swapped[nd - 3], swapped[nd - 2] = swapped[nd - 2], swapped[nd - 3]
    src = DeviceValue(q.storage, shape, tuple(swapped), 0, step.dtype)
    swap = ew.make(ctx, ("in", 0), [src], shape, contiguous(shape), step.dtype, 256, tag=tag)

    def run_swapped(vals: Sequence[DeviceValue]) -> DeviceValue:
        with ctx.scratch_only():
            o = run(vals)
        out = ctx.alloc_out(shape, step.dtype, "sdpa")
        swap(out.ptr, [o.view(shape, tuple(swapped), o.offset).ptr])
        return out

    return run_swapped


def _plan_padded(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int, sc: float,
                 causal: bool) -> Run | None:  # fmt: skip
    """A head dim the fused kernels lack (below 128): q, k and v copied into zero-padded
    buffers of the next one (64 or 128), the fused prefill run on them, the output's first
    columns kept. Zero columns add nothing to a score and give zero output columns, and the
    kernels' masking rules hold (a key hidden from a query never reaches it, NaN included,
    which the composed path's P @ V cannot promise). The scale stays the given head dim's."""
    q, k, v = ins[:3]
    d, dtype = q.shape[-1], step.dtype
    if (
        d in attention.HEAD_DIMS or d > max(attention.HEAD_DIMS) or v.shape[-1] != d
        or len(q.shape) != 4 or dtype.name not in attention.DTYPES
        or k.dtype != dtype or v.dtype != dtype or not numel(step.shape)
    ):  # fmt: skip
        return None
    dp = min(h for h in attention.HEAD_DIMS if h > d)
    pads = []
    for t in (q, k, v):
        pshape = t.shape[:-1] + (dp,)
        pst = contiguous(pshape)
        zero = ew.make(ctx, ("const", 0.0, dtype.name), [], pshape, pst, dtype, 256, tag=tag)
        copy = ew.make(ctx, ("in", 0), [t], t.shape, pst, dtype, 256, tag=tag)
        pads.append((pshape, zero, copy))
    planned = [DeviceValue(t.storage, p, contiguous(p), 0, dtype)
               for t, (p, _, _) in zip(ins[:3], pads, strict=True)]  # fmt: skip
    oshape = step.shape[:-1] + (dp,)
    inner = _plan_prefill(ctx, replace(step, shape=oshape), [*planned, *ins[3:]], tag, sc, causal)
    if inner is None:
        return None
    o_view = DeviceValue(q.storage, step.shape, contiguous(oshape), 0, dtype)
    take = ew.make(ctx, ("in", 0), [o_view], step.shape, contiguous(step.shape), dtype, 256,
                   tag=tag)  # fmt: skip

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        bufs = []
        with ctx.scratch_only():
            for t, (pshape, zero, copy) in zip(vals[:3], pads, strict=True):
                b = ctx.alloc(pshape, dtype, "sdpa")
                zero(b.ptr, [])
                copy(b.ptr, [t.ptr])
                bufs.append(b)
            o = inner([*bufs, *vals[3:]])
        out = ctx.alloc_out(step.shape, dtype, "sdpa")
        take(out.ptr, [o.ptr])
        return out

    return run


def _mask_inputs(step: Step, ins: Sequence[DeviceValue], batch: int, n_dims: int
                 ) -> tuple[int, int, int, str, str] | None:  # fmt: skip
    """(index of kv_len in ins or -1, of kv_start or -1, kv_start's element stride, their
    dtypes) where the kernels can read them (int32 / int64; kv_start one per batch row of
    a 4-d q, or one for all), else None."""
    extra = list(ins[3:])
    n_len = n_start = -1
    kvs_stride, len_dt, start_dt = 1, "int32", "int32"
    if step.attrs.get("kv_len"):
        kl = extra.pop(0)
        if kl.dtype.name not in _INDEX_DTYPES or kl.size != 1:
            return None
        n_len, len_dt = 3, kl.dtype.name
    if step.attrs.get("kv_start"):
        st = extra.pop(0)
        if (
            st.dtype.name not in _INDEX_DTYPES or n_dims != 4 or len(st.shape) != 1
            or st.shape[0] not in (1, batch)
        ):  # fmt: skip
            return None
        n_start = 4 if n_len >= 0 else 3
        kvs_stride, start_dt = (st.strides[0] if st.shape[0] > 1 else 0), st.dtype.name
    return n_len, n_start, kvs_stride, len_dt, start_dt


def _plan_prefill(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int, sc: float,
                  causal: bool, seq_major: bool = False) -> Run | None:  # fmt: skip
    """The fused prefill kernels, with kv_len / kv_start read on the device and the
    sliding window: attention_flash.cuh (tensor cores) for bf16 / f16 with 16-byte aligned
    rows, attention_prefill.cuh (CUDA cores) for float32 and unaligned views; None where
    neither takes the layout. seq_major: step.shape is the heads-major [.., H, Sq, D] the
    kernels compute, and the output is allocated and stored as [.., Sq, H, D]."""
    q, k, v = ins[:3]
    dtype, shape = step.dtype, step.shape
    sq, d = q.shape[-2], q.shape[-1]
    sk, h, kvh = k.shape[-2], q.shape[-3], k.shape[-3]
    lay = [heads_layout(t) for t in (q, k, v)]
    if (
        dtype.name not in attention.DTYPES or d not in attention.HEAD_DIMS
        or v.shape[-1] != d or any(x is None for x in lay) or len(q.shape) > 4
        or k.dtype != dtype or v.dtype != dtype or not numel(shape) or h % kvh
    ):  # fmt: skip
        return None
    (bq, _, qs), (bk, _, ks), (bv, _, vs) = lay  # type: ignore[misc]
    if bk not in (1, bq) or bv != bk:
        return None
    if bk == 1:  # one k / v shared by every batch row
        ks, vs = (0,) + ks[1:], (0,) + vs[1:]
    if bq == 1:  # the stride of a size-1 dim is arbitrary: keep it out of alignment checks
        qs = (0,) + qs[1:]
    found = _mask_inputs(step, ins, bq, len(q.shape))
    if found is None:
        return None
    n_len, n_start, kvs_stride, len_dt, start_dt = found
    window = int(step.attrs.get("window") or 0)
    # (batch, head, row) strides of the output
    os_ = (h * sq * d, d, h * d) if seq_major else (h * sq * d, sq * d, d)
    if seq_major:
        shape = shape[:-3] + (sq, h, d)
    flash = dtype.name in attention.FLASH_DTYPES and attention.flash_fits(
        (0, 0, 0), (qs, ks, vs), 0, os_
    )
    # On SM 9.0, the wgmma / tensor-copy kernel where it measured faster (same operands).
    sm90 = flash and attention_sm90.chosen(d)

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        o = ctx.alloc_out(shape, dtype, "sdpa")
        masks = attention.Masks(
            kv_len=vals[n_len].ptr if n_len >= 0 else 0, kv_len_dtype=len_dt,
            kv_start=vals[n_start].ptr if n_start >= 0 else 0, kv_start_stride=kvs_stride,
            kv_start_dtype=start_dt, window=window, err=ctx.err_addr, tag=tag,
        )  # fmt: skip
        ptrs = (vals[0].ptr, vals[1].ptr, vals[2].ptr)
        # A view at an odd element offset takes the CUDA-core kernel (any alignment).
        use_flash = flash and attention.flash_fits(ptrs, (qs, ks, vs), o.ptr, os_)
        if use_flash and sm90:
            attention_sm90.flash_sm90(*ptrs, o.ptr, bq, h, kvh, sq, sk, d, dtype.name,
                                      scale=sc, causal=causal, masks=masks, q_strides=qs,
                                      k_strides=ks, v_strides=vs, o_strides=os_, kv_batch=bk,
                                      stream=ctx.stream)  # fmt: skip
            return o
        launch = attention.flash if use_flash else attention.prefill
        launch(*ptrs, o.ptr, bq, h, kvh, sq, sk, d, dtype.name, scale=sc, causal=causal,
               masks=masks, q_strides=qs, k_strides=ks, v_strides=vs, o_strides=os_,
               stream=ctx.stream)  # fmt: skip
        return o

    return run


_INDEX_DTYPES = ("int32", "int64")


def _plan_decode(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int, sc: float,
                 causal: bool, append: _AppendPlan | None = None) -> Run | None:  # fmt: skip
    """One query row per head (sq == 1) on the split-K decode kernel, with kv_len / kv_start
    read from device memory (the graph replays as they change), or None where the kernel's
    rules do not hold. With sq == 1 the causal mask (bottom-right at kv_len) and the kv_len
    mask are the same: keys [kv_start[b], kv_len) are visible. `append`: the kernel first
    stores the step's key and value (sdpa_append; ins are then q, caches, kv_len, kv_start
    and the append operands come from `append`)."""
    q, k, v = ins[:3]
    dtype, shape = step.dtype, step.shape
    d = q.shape[-1]
    if step.attrs.get("window"):  # the decode kernels have no sliding window
        return None
    if (
        dtype.name not in attention.DTYPES or k.dtype != dtype or v.dtype != dtype
        or d not in attention.HEAD_DIMS or k.shape[-1] != d or v.shape[-1] != d
        or len(q.shape) not in (3, 4) or k.shape[:-1] != v.shape[:-1] or q.shape[-2] != 1
        or len(k.shape) != len(q.shape) or k.shape[-2] == 0 or not numel(shape)
    ):  # fmt: skip
        return None
    lay = [heads_layout(t) for t in (q, k, v)]
    if any(x is None for x in lay):
        return None
    (bq, h, qs), (bk, kvh, ks), (_, _, vs) = lay  # type: ignore[misc]
    if bk not in (1, bq) or h % kvh:
        return None
    if bk == 1:  # one cache shared by every batch row
        ks, vs = (0,) + ks[1:], (0,) + vs[1:]
    if bq == 1:  # the stride of a size-1 dim is arbitrary: keep it out of alignment checks
        qs = (0,) + qs[1:]
    sk = k.shape[-2]
    vec = 16 // dtype.itemsize
    if any(x % vec for x in ks + vs) or qs[0] % 2 or qs[1] % 2:
        return None
    extra = list(ins[3:])
    n_len = n_start = -1
    kvs_stride, kvs_dtype = 1, "int32"
    if step.attrs.get("kv_len"):
        kl = extra.pop(0)
        if kl.dtype.name not in _INDEX_DTYPES or kl.size != 1:
            return None
        n_len = 3
    if step.attrs.get("kv_start"):
        st = extra.pop(0)
        if (
            st.dtype.name not in _INDEX_DTYPES or len(q.shape) != 4 or len(st.shape) != 1
            or st.shape[0] not in (1, bq)
        ):  # fmt: skip
            return None
        n_start = 4 if n_len >= 0 else 3
        kvs_stride, kvs_dtype = (st.strides[0] if st.shape[0] > 1 else 0), st.dtype.name
    if append is not None and (bk != bq or dtype.name not in attention.APPEND_DTYPES):
        return None
    splits = attention.decode_splits(bq, h, kvh, sk, dtype.name)
    ws_elems = attention.decode_workspace_bytes(bq, h, splits, d) // 4
    counters = None
    if attention.decode_last_block_merge(splits):
        counters = _decode_counters(ctx, attention.decode_counters(bq, h, kvh))
    fallback: list[Run] = []

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        pq, pk, pv = vals[0].ptr, vals[1].ptr, vals[2].ptr
        if pk % 16 or pv % 16 or pq % 4:
            # A view at an odd element offset: the composed kernels take any layout.
            if not fallback:
                fallback.append(append.composed() if append is not None
                                else _sdpa_composed(ctx, step, ins, tag, sc, causal))  # fmt: skip
            return fallback[0](vals)
        o = ctx.alloc_out(shape, dtype, "sdpa")
        ws = ctx.alloc((ws_elems,), dtypes.float32, "sdpa") if ws_elems else None
        ws_ptr = ws.ptr if ws is not None else 0
        ctr = counters.ptr if counters is not None else 0
        attention.decode(pq, pk, pv, vals[n_len].ptr if n_len >= 0 else 0, o.ptr, ws_ptr, bq, h,
                         kvh, sk, d, dtype.name, splits=splits, counters=ctr, scale=sc,
                         q_strides=qs[:2], k_strides=ks, v_strides=vs, o_strides=(h * d, d),
                         kv_start=vals[n_start].ptr if n_start >= 0 else 0,
                         kv_start_stride=kvs_stride, kv_start_dtype=kvs_dtype,
                         append=append.bind(vals) if append is not None else None,
                         # In append mode the caches are the compiled step's own
                         # (sdpa_append's rule): the graph writes no row of them but this
                         # step's, which the kernel patches itself, so in a capture (the
                         # kernel ahead is the graph's own) it may read them early.
                         kv_early=append is not None and capturing(ctx),
                         err=ctx.err_addr, tag=tag, stream=ctx.stream)  # fmt: skip
        return o

    return run


class _AppendPlan:
    """sdpa_append's operands for the decode kernel's append mode: new k/v rows [B, KV, 1, D]
    and the table row as (batch, head) strides, dtypes and their places in `vals`."""

    def __init__(self, step: Step, ins: Sequence[DeviceValue],
                 where: tuple[int, int, int, int | None],
                 composed: Callable[[], Run]) -> None:  # fmt: skip
        self.where = where
        self.composed = composed  # the unfused steps, over the same values
        self.rope = step.attrs.get("rope", "none")
        kn, vn, pos = (ins[i] for i in where[:3])
        self.k_strides = (kn.strides[0], kn.strides[1])
        self.v_strides = (vn.strides[0], vn.strides[1])
        self.cs_dtype = ins[where[3]].dtype.name if where[3] is not None else "float32"
        tables = [ins[where[3]], ins[where[3] + 1]] if where[3] is not None else []
        # (The op rule makes each table one row of D/2.)
        self.ok = (
            kn.strides[-1] == 1 and vn.strides[-1] == 1 and pos.dtype.name in _INDEX_DTYPES
            and all(t.strides[-1] == 1 and t.dtype.name in attention.DTYPES for t in tables)
            and len({t.dtype for t in tables}) <= 1  # one table type in the kernel (PGK_CS)
        )  # fmt: skip

    def bind(self, vals: Sequence[DeviceValue]) -> attention.Append:
        k, v, p, t = self.where
        return attention.Append(
            vals[k].ptr, vals[v].ptr, self.k_strides, self.v_strides, vals[p].ptr, self.rope,
            vals[t].ptr if t is not None else 0, vals[t + 1].ptr if t is not None else 0,
            self.cs_dtype,
        )  # fmt: skip


def plan_sdpa_append(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """The decode kernel in append mode where its rules hold; else the same work as the
    steps it was fused from: ropes, the two in-place cache stores, then sdpa."""
    layout = step.attrs.get("rope", "none")
    n_rope = 0 if layout == "none" else 2
    d = ins[0].shape[-1]
    scale = step.attrs.get("scale")
    sc = float(np.float32(1.0 / math.sqrt(d) if scale is None else scale))
    attn = replace(step, op="sdpa", attrs={k: v for k, v in step.attrs.items() if k != "rope"})
    # The decode planner's order: q, caches, kv_len / kv_start, then the append operands.
    n_rest = len(ins) - 6 - n_rope
    order = [0, 1, 2, *range(6 + n_rope, len(ins)), 3, 4, 5, *range(6, 6 + n_rope)]
    sub = [ins[i] for i in order]
    at = 3 + n_rest
    inverse = [order.index(i) for i in range(len(ins))]

    def composed() -> Run:  # over the decode planner's order
        run = _sdpa_append_composed(ctx, step, attn, ins, tag, layout, n_rope)
        return lambda vals: run([vals[i] for i in inverse])

    where = (at, at + 1, at + 2, at + 3 if n_rope else None)
    plan = _AppendPlan(step, sub, where, composed)
    if plan.ok:
        fused = _plan_decode(ctx, attn, sub, tag, sc, bool(step.attrs.get("causal")), plan)
        if fused is not None:
            return lambda vals: fused([vals[i] for i in order])
    return _sdpa_append_composed(ctx, step, attn, ins, tag, layout, n_rope)


def _sdpa_append_composed(ctx: Context, step: Step, attn: Step, ins: Sequence[DeviceValue],
                          tag: int, layout: str, n_rope: int) -> Run:  # fmt: skip
    q, k_cache, v_cache, k_new, v_new, pos = ins[:6]
    half = q.shape[-1] // 2
    tables = [_row(t, half) for t in ins[6 : 6 + n_rope]]
    rot_q = rot_k = None
    if n_rope:
        rope_step = replace(step, op="rope", attrs={"layout": layout})
        rot_q = plan_rope(ctx, replace(rope_step, shape=q.shape), [q, *tables], tag)
        rot_k = plan_rope(ctx, replace(rope_step, shape=k_new.shape), [k_new, *tables], tag)
    spec = (("slice", 0, k_cache.shape[0], 1), ("slice", 0, k_cache.shape[1], 1), ("dyn", 0),
            ("slice", 0, k_cache.shape[3], 1))  # fmt: skip
    k_row = (DeviceValue(k_new.storage, k_new.shape, contiguous(k_new.shape), 0, k_new.dtype)
             if n_rope else k_new)  # fmt: skip
    store_k = store_into(ctx, k_cache, _drop_seq(k_row), spec, [pos], tag)
    store_v = store_into(ctx, v_cache, _drop_seq(v_new), spec, [pos], tag)
    q_t = DeviceValue(q.storage, q.shape, contiguous(q.shape), 0, q.dtype)
    attend = plan_sdpa(ctx, attn, [q_t if n_rope else q, k_cache, v_cache, *ins[6 + n_rope :]],
                       tag)  # fmt: skip

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        tabs = [_row(t, half) for t in vals[6 : 6 + n_rope]]
        qv, kv = vals[0], vals[3]
        with ctx.scratch_only():
            if rot_q is not None and rot_k is not None:
                qv, kv = rot_q([qv, *tabs]), rot_k([kv, *tabs])
        store_k(vals[1], _drop_seq(kv), [vals[5]])
        store_v(vals[2], _drop_seq(vals[4]), [vals[5]])
        return attend([qv, vals[1], vals[2], *vals[6 + n_rope :]])

    return run


def _row(t: DeviceValue, half: int) -> DeviceValue:
    """A rope table row (half elements along the last axis, ir rule) as [1, half]."""
    return t.view((1, half), (0, t.strides[-1]), t.offset)


def _drop_seq(x: DeviceValue) -> DeviceValue:
    """[B, KV, 1, D] -> the row [B, KV, D] a cache store takes."""
    return x.view(x.shape[:2] + x.shape[3:], x.strides[:2] + x.strides[3:], x.offset)


def _decode_counters(ctx: Context, n: int) -> DeviceValue:
    """n zeroed arrival counters (read as uint32) for one planned decode step. The plan
    owns them (every call of the step, eager or in a graph replay, runs after the last one
    finished and finds them zeroed again); steps do not share them, so launches of two
    steps never meet on one counter. Pinned: a captured graph bakes the address in."""
    buf = ctx.alloc((n,), dtypes.int32, "sdpa decode counters")
    buf.storage.pin()
    _native.memset(buf.ptr, 0, 4 * n, ctx.stream)
    return buf


def _sdpa_composed(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int,
                   sc: float, causal: bool) -> Run:  # fmt: skip
    q, k, v = ins[:3]
    dtype, shape = step.dtype, step.shape
    acc = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32
    lead, h, sq, d = q.shape[:-3], q.shape[-3], q.shape[-2], q.shape[-1]
    kvh, sk, dv = k.shape[-3], k.shape[-2], v.shape[-1]
    g = h // kvh

    # GQA: each kv head serves g query heads; a stride-0 view repeats it, the copy below
    # materialises it in the accumulation dtype.
    def grouped(t: DeviceValue) -> tuple[Callable[[DeviceValue], DeviceValue], tuple[int, ...]]:
        gshape = lead + (kvh, g) + t.shape[-2:]

        def view(x: DeviceValue) -> DeviceValue:
            st = x.strides[:-3] + (x.strides[-3], 0) + x.strides[-2:]
            return x.view(gshape, st, x.offset)

        fix = contiguous_as(ctx, view(t), acc, tag)
        return (lambda x: fix(view(x))), lead + (h,) + t.shape[-2:]

    fq = contiguous_as(ctx, q, acc, tag)
    fk, kshape = grouped(k)
    fv, vshape = grouped(v)
    batch = lead + (h,)
    nb = numel(batch)
    sshape = batch + (sq, sk)
    it, cols, rows = ("in", 0), ("in", 1), ("in", 2)
    score: tuple = ("mul", it, ("const", sc, acc.name))
    args_plan: list[DeviceValue] = [DeviceValue(q.storage, sshape, contiguous(sshape), 0, acc)]
    cols_v, rows_v = arange_values(ctx, sk, (1, sk)), arange_values(ctx, sq, (sq, 1))
    args_plan += [cols_v, rows_v]
    extra = list(ins[3:])
    mask: tuple = ("const", False, "bool")
    kv_len: tuple = ("const", sk, "int64")
    if step.attrs.get("kv_len"):
        # Read on the device: a static cache filled up to kv_len, no host sync.
        kv_len = ("cast", "int64", ("in", len(args_plan)))
        args_plan.append(extra.pop(0))
        mask = ("ge", cols, kv_len)
    if causal:
        # Bottom-right aligned at kv_len: key j is masked for query i when j > i + kv_len - sq.
        limit = ("add", ("cast", "int64", rows), ("sub", kv_len, ("const", sq, "int64")))
        mask = ("logical_or", mask, ("gt", cols, limit))
    window = step.attrs.get("window")
    if window:
        # Sliding window at the same alignment: key j is masked once j <= i + kv_len - sq - w.
        edge = ("add", ("cast", "int64", rows),
                ("sub", kv_len, ("const", sq + int(window), "int64")))  # fmt: skip
        mask = ("logical_or", mask, ("le", cols, edge))
    start_view = None
    if step.attrs.get("kv_start"):
        ks = extra.pop(0)
        bshape = (ks.shape[0],) + (1,) * (len(sshape) - 1)
        start_view = (bshape, (ks.strides[0],) + (0,) * (len(sshape) - 1))
        mask = ("logical_or", mask, ("lt", cols, ("cast", "int64", ("in", len(args_plan)))))
        args_plan.append(ks.view(*start_view, ks.offset))
    score = ("where", mask, ("const", float("-inf"), acc.name), score)
    masked = ew.make(ctx, score, args_plan, sshape, contiguous(sshape), acc, 256, tag=tag)
    # A query that sees no key has a NaN softmax row: the reference gives it zeros. Only the
    # masked probabilities are cleared, so a NaN from a visible q, k or v still propagates.
    clear = None if mask == ("const", False, "bool") else ew.make(
        ctx, ("where", mask, ("const", 0.0, acc.name), it), args_plan, sshape,
        contiguous(sshape), acc, 256, tag=tag)  # fmt: skip
    # Keys outside [kv_start, kv_len) are absent for every query, and a static cache's
    # unwritten tail may hold anything (NaN included): P @ V would still multiply their zero
    # probabilities by it, so their V rows are zeroed first.
    n_key_inputs = int(bool(step.attrs.get("kv_len"))) + int(bool(step.attrs.get("kv_start")))
    vshape = batch + (sk, dv)
    vkeys = arange_values(ctx, sk, (sk, 1)) if n_key_inputs else None
    vmask = None
    if vkeys is not None:
        vargs = [DeviceValue(q.storage, vshape, contiguous(vshape), 0, acc), vkeys]
        absent: tuple = ("const", False, "bool")
        if step.attrs.get("kv_len"):
            absent = ("ge", ("in", 1), ("cast", "int64", ("in", len(vargs))))
            vargs.append(ins[3])
        if step.attrs.get("kv_start"):
            ksv = ins[3 + len(vargs) - 2]
            vb = (ksv.shape[0],) + (1,) * (len(vshape) - 1)
            absent = ("logical_or", absent,
                      ("lt", ("in", 1), ("cast", "int64", ("in", len(vargs)))))  # fmt: skip
            vargs.append(ksv.view(vb, (ksv.strides[0],) + (0,) * (len(vshape) - 1), ksv.offset))
        vmask = ew.make(ctx, ("where", absent, ("const", 0.0, acc.name), ("in", 0)), vargs,
                        vshape, contiguous(vshape), acc, 256, tag=tag)  # fmt: skip
    o_plan = DeviceValue(q.storage, shape, contiguous(shape), 0, acc)
    finish = ew.make(ctx, ("cast", dtype.name, it), [o_plan], shape, contiguous(shape),
                     dtype, 256, tag=tag)  # fmt: skip
    n_extra = len(ins) - 3
    dims = list(batch)

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        for i, x in enumerate(vals[3 : 3 + n_extra]):  # reported if outside [0, sk]
            is_start = i == n_extra - 1 and bool(step.attrs.get("kv_start"))
            attention.check_lengths(x.ptr, numel(x.shape), x.strides[0] if x.shape else 0, sk,
                                    x.dtype.name, err=ctx.err_addr, tag=tag, start=is_start,
                                    stream=ctx.stream)  # fmt: skip
        qa, ka, va = fq(vals[0]), fk(vals[1]), fv(vals[2])
        s = ctx.alloc(sshape, acc, "sdpa")
        if nb and sq and sk:
            matmul_simple.matmul(qa.ptr, ka.ptr, s.ptr, sq, sk, d, acc.name, batch_shape=dims,
                                 b_strides=(1, d), stream=ctx.stream)  # fmt: skip
        p = ctx.alloc(sshape, acc, "sdpa")
        mptrs = [s.ptr, cols_v.ptr, rows_v.ptr] + [x.ptr for x in vals[3 : 3 + n_extra]]
        masked(p.ptr, mptrs)
        if nb * sq and sk:
            softmax.softmax(p.ptr, s.ptr, nb * sq, sk, acc.name, stream=ctx.stream)
        probs = s
        if clear is not None:
            clear(p.ptr, [s.ptr, *mptrs[1:]])
            probs = p
        if vmask is not None and vkeys is not None:
            vm = ctx.alloc(vshape, acc, "sdpa")
            vmask(vm.ptr, [va.ptr, vkeys.ptr, *[x.ptr for x in vals[3 : 3 + n_key_inputs]]])
            va = vm
        o = ctx.alloc(shape, acc, "sdpa")
        if numel(shape):
            matmul_simple.matmul(probs.ptr, va.ptr, o.ptr, sq, dv, sk, acc.name, batch_shape=dims,
                                 stream=ctx.stream)  # fmt: skip
        out = ctx.alloc_out(shape, dtype, "sdpa")
        finish(out.ptr, [o.ptr])
        return out

    return run


PLANNERS = {"sdpa": plan_sdpa, "sdpa_append": plan_sdpa_append}
