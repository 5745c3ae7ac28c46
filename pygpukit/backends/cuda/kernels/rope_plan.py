"""Plans rope steps onto rope.py's launcher where x is [B, H, S, D] or [H, S, D] rows and
the tables share one layout and dtype; else two generated elementwise kernels (the two
halves of each rotated pair). rope_kv_write (a prefill chunk's rope and its two KV-cache
stores, passes/fuse_rope_kv_write.py) goes to rope.py's fused launcher under the same
rules; else the rope and the two stores it was fused from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from pygpukit.passes import Step

from .. import ew
from ..context import Context, contiguous, numel
from ..ops_movement import store_into
from ..value import DeviceValue
from . import rope

Run = Callable[[Sequence[DeviceValue]], DeviceValue]


def heads_layout(x: DeviceValue) -> tuple[int, int, tuple[int, int, int]] | None:
    """(batch, heads, (batch, head, seq) strides) of [B, H, S, D] or [H, S, D] with unit
    inner stride."""
    if (x.strides[-1] != 1 and x.shape[-1] > 1) or len(x.shape) not in (3, 4):
        return None
    if len(x.shape) == 3:
        return 1, x.shape[0], (0, x.strides[0], x.strides[1])
    return x.shape[0], x.shape[1], (x.strides[0], x.strides[1], x.strides[2])


def tables_fit(cos: DeviceValue, sin: DeviceValue) -> bool:
    """cos/sin are [..., S, D/2] tables the launchers read: one table (leading dims 1),
    unit inner stride, one row stride and one dtype."""
    return (
        all(
            all(d == 1 for d in t.shape[:-2]) and (t.strides[-1] == 1 or t.shape[-1] <= 1)
            for t in (cos, sin)
        )
        and cos.strides[-2] == sin.strides[-2]
        and cos.dtype == sin.dtype
    )


def plan_rope(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """rope(x, cos, sin) in attrs["layout"] (half-split or interleaved)."""
    x, cos, sin = ins
    dtype, shape = step.dtype, step.shape
    inter = step.attrs["layout"] == "interleaved"
    seq, hd = x.shape[-2], x.shape[-1]
    bhs = heads_layout(x)
    tables_ok = tables_fit(cos, sin)
    if dtype.name in rope.DTYPES and bhs is not None and tables_ok and numel(shape):
        b, h, xs = bhs
        ys = (h * seq * hd, seq * hd, hd)
        css, csd = cos.strides[-2], cos.dtype.name

        def run(v: Sequence[DeviceValue]) -> DeviceValue:
            y = ctx.alloc_out(shape, dtype, "rope")
            rope.rope(v[0].ptr, y.ptr, v[1].ptr, v[2].ptr, b, h, seq, hd, dtype.name,
                      interleaved=inter, cs_dtype=csd, x_strides=xs, y_strides=ys,
                      cs_stride=css, stream=ctx.stream)  # fmt: skip
            return y

        return run
    return _rope_ew(ctx, step, ins, tag, inter)


def _rope_ew(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int,
             inter: bool) -> Run:  # fmt: skip
    x, cos, sin = ins
    dtype, shape = step.dtype, step.shape
    half = shape[-1] // 2
    hshape = shape[:-1] + (half,)
    ost = contiguous(shape)
    if inter:
        sub = lambda v, j: v.view(hshape, v.strides[:-1] + (2 * v.strides[-1],),  # noqa: E731
                                  v.offset + j * v.strides[-1])  # fmt: skip
        ost_h = ost[:-1] + (2,)
        offs = (0, 1)
    else:
        sub = lambda v, j: v.view(hshape, v.strides, v.offset + j * half * v.strides[-1])  # noqa: E731
        ost_h = ost
        offs = (0, half)
    a, b_, c, s = ("in", 0), ("in", 1), ("in", 2), ("in", 3)
    first = ("sub", ("mul", a, c), ("mul", b_, s))
    second = ("add", ("mul", b_, c), ("mul", a, s))
    args = [sub(x, 0), sub(x, 1), cos, sin]
    l1 = ew.make(ctx, first, args, hshape, ost_h, dtype, 256, tag=tag)
    l2 = ew.make(ctx, second, args, hshape, ost_h, dtype, 256 + offs[1] * dtype.itemsize,
                 tag=tag)  # fmt: skip
    isz = dtype.itemsize

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        y = ctx.alloc_out(shape, dtype, "rope")
        ptrs = [sub(v[0], 0).ptr, sub(v[0], 1).ptr, v[1].ptr, v[2].ptr]
        l1(y.ptr, ptrs)
        l2(y.ptr + offs[1] * isz, ptrs)
        return y

    return run


def _rows(v: DeviceValue) -> tuple[int, int, int] | None:
    """(batch, head, seq) strides of a [B, H, S, D] value with unit inner stride."""
    if len(v.shape) != 4 or (v.strides[-1] != 1 and v.shape[-1] > 1):
        return None
    return v.strides[0], v.strides[1], v.strides[2]


def _heads(v: DeviceValue, lo: int, hi: int) -> DeviceValue:
    """v[:, lo:hi] of a [B, H, S, D] value, as a view."""
    return v.view((v.shape[0], hi - lo) + v.shape[2:], v.strides, v.offset + lo * v.strides[1])


def plan_rope_kv_write(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    """q = rope(x)[:, :q_heads], with rope(x)[:, q_heads:] and v stored into the caches at
    pos..pos+T-1 in their own memory (ir op rope_kv_write): one launch where the layouts
    fit, else the rope and the two stores."""
    x, cos, sin, k_cache, v_cache, v, pos = ins
    dtype, shape = step.dtype, step.shape
    inter = step.attrs["layout"] == "interleaved"
    hq = step.attrs["q_heads"]
    b, h, t, d = x.shape
    xs, ks, vcs, vs = (_rows(a) for a in (x, k_cache, v_cache, v))
    if (
        dtype.name in rope.DTYPES and xs is not None and ks is not None and vcs is not None
        and vs is not None and tables_fit(cos, sin) and pos.dtype.name in ("int32", "int64")
        and numel(shape)
    ):  # fmt: skip
        qs = contiguous(shape)
        strides = (xs, (qs[0], qs[1], qs[2]), ks, vcs, vs)
        css, csd, pdt = cos.strides[-2], cos.dtype.name, pos.dtype.name
        kvh, s_len = h - hq, k_cache.shape[2]

        def run(vals: Sequence[DeviceValue]) -> DeviceValue:
            q = ctx.alloc_out(shape, dtype, "rope_kv_write")
            xv, cv, sv, kc, vc, vv, pv = vals
            rope.rope_kv_write(xv.ptr, q.ptr, kc.ptr, vc.ptr, vv.ptr, cv.ptr, sv.ptr, pv.ptr,
                               pdt, s_len, b, hq, kvh, t, d, dtype.name, interleaved=inter,
                               cs_dtype=csd, strides=strides, cs_stride=css,
                               err=ctx.err_addr, tag=tag, stream=ctx.stream)  # fmt: skip
            return q

        return run
    return _rope_kv_write_composed(ctx, step, ins, tag)


def _rope_kv_write_composed(ctx: Context, step: Step, ins: Sequence[DeviceValue],
                            tag: int) -> Run:  # fmt: skip
    x, cos, sin, k_cache, v_cache, v, pos = ins
    hq, h, t = step.attrs["q_heads"], x.shape[1], x.shape[2]
    k_shape = (x.shape[0], h - hq) + x.shape[2:]
    rope_step = replace(step, op="rope", attrs={"layout": step.attrs["layout"]})
    rot_q = plan_rope(ctx, rope_step, [_heads(x, 0, hq), cos, sin], tag)
    rot_k = plan_rope(ctx, replace(rope_step, shape=k_shape), [_heads(x, hq, h), cos, sin], tag)
    full = [("slice", 0, n, 1) for n in k_cache.shape]
    spec = (full[0], full[1], ("dslice", 0, t), full[3])
    k_rot = DeviceValue(x.storage, k_shape, contiguous(k_shape), 0, x.dtype)
    store_k = store_into(ctx, k_cache, k_rot, spec, [pos], tag)
    store_v = store_into(ctx, v_cache, v, spec, [pos], tag)

    def run(vals: Sequence[DeviceValue]) -> DeviceValue:
        xv, cv, sv, kc, vc, vv, pv = vals
        with ctx.scratch_only():
            kr = rot_k([_heads(xv, hq, h), cv, sv])
        store_k(kc, kr, [pv])
        store_v(vc, vv, [pv])
        return rot_q([_heads(xv, 0, hq), cv, sv])

    return run


PLANNERS = {"rope": plan_rope, "rope_kv_write": plan_rope_kv_write}
