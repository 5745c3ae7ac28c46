"""matmul and linear through the kernel team's launchers: the mma.sync GEMM for f16/bf16
when its layout rules hold, else the strided matmul_simple kernel (every dtype)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pygpukit.ir import DType, shapes
from pygpukit.passes import Step

from . import ew
from .context import Context, contiguous, numel
from .kernels import gemm_mma, matmul_simple
from .layout import broadcast_strides, collapse, reshape_strides
from .materialize import contiguous_as
from .value import DeviceValue

Run = Callable[[Sequence[DeviceValue]], DeviceValue]
_ACT_EXPR = {"gelu_tanh": ("gelu", "tanh"), "gelu_erf": ("gelu", "none"), "silu": ("silu",)}


def _mm_launcher(ctx: Context, a: DeviceValue, b: DeviceValue
                 ) -> tuple[Callable[[int, int, int], None], tuple[int, ...]]:  # fmt: skip
    """(launch(a_ptr, b_ptr, c_ptr), out shape incl. batch) for a [.., M, K] @ b [.., K, N]
    of one dtype; C is contiguous."""
    dtype = a.dtype.name
    a_shape, a_st = (a.shape, a.strides) if len(a.shape) > 1 else ((1,) + a.shape, (0,) + a.strides)
    b_shape, b_st = (b.shape, b.strides) if len(b.shape) > 1 else (b.shape + (1,), b.strides + (0,))
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = shapes.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    abs_ = broadcast_strides(a_shape[:-2], a_st[:-2], batch)
    bbs = broadcast_strides(b_shape[:-2], b_st[:-2], batch)
    cbs = contiguous(batch + (m, n))[:-2]
    dims, (ca, cb, cc) = collapse(batch, abs_, bbs, cbs)
    stream = ctx.stream
    lda, ldb = a_st[-2], b_st[-1]
    use_mma = (
        dtype in gemm_mma.DTYPES and len(dims) <= 1 and a_st[-1] == 1 and b_st[-2] == 1
        and gemm_mma.supported(m, n, k, a.ptr, b.ptr, lda, ldb)
        and all(s % 8 == 0 for s in ca + cb)
    )  # fmt: skip
    if use_mma:
        nb = dims[0] if dims else 1
        sa, sb = (ca[0], cb[0]) if dims else (0, 0)

        def mma(pa: int, pb: int, pc: int) -> None:
            gemm_mma.gemm(pa, pb, pc, m, n, k, dtype, lda=lda, ldb=ldb, ldc=n, batch=nb,
                          a_batch_stride=sa, b_batch_stride=sb, c_batch_stride=m * n,
                          stream=stream)  # fmt: skip

        return mma, batch + (m, n)

    def simple(pa: int, pb: int, pc: int) -> None:
        matmul_simple.matmul(pa, pb, pc, m, n, k, dtype, batch_shape=batch,
                             a_strides=(a_st[-2], a_st[-1]), b_strides=(b_st[-2], b_st[-1]),
                             c_strides=(n, 1), a_batch_strides=abs_, b_batch_strides=bbs,
                             c_batch_strides=cbs, stream=stream)  # fmt: skip

    return simple, batch + (m, n)


def _as_dtype(ctx: Context, x: DeviceValue, dtype: DType, tag: int
              ) -> tuple[Callable[[DeviceValue], DeviceValue], DeviceValue]:  # fmt: skip
    """A run-time converter and a plan-time stand-in with the converted layout."""
    if x.dtype == dtype:
        return (lambda v: v), x
    stand_in = DeviceValue(x.storage, x.shape, contiguous(x.shape), 0, dtype)
    return contiguous_as(ctx, x, dtype, tag), stand_in


def plan_matmul(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    a, b = ins
    dtype = step.dtype
    fa, a2 = _as_dtype(ctx, a, dtype, tag)
    fb, b2 = _as_dtype(ctx, b, dtype, tag)
    launch, _ = _mm_launcher(ctx, a2, b2)
    shape = step.shape

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        va, vb = fa(v[0]), fb(v[1])
        out = ctx.alloc_out(shape, dtype, "matmul")
        if numel(shape):
            launch(va.ptr, vb.ptr, out.ptr)
        return out

    return run


def plan_linear(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int) -> Run:
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    act = step.attrs.get("activation", "none")
    dtype, shape = step.dtype, step.shape

    fx, x2 = _as_dtype(ctx, x, dtype, tag)
    k = x2.shape[-1]
    rows = x2.size // k if k else 0
    rst = reshape_strides(x2.shape, x2.strides, (rows, k)) if len(x2.shape) > 2 else None
    if rst is not None:
        # Leading dims fold into M: one large GEMM instead of a batch of small ones.
        x2 = x2.view((rows, k), rst, x2.offset)
    wt = w.view((w.shape[1], w.shape[0]), (w.strides[1], w.strides[0]), w.offset)
    launch, _ = _mm_launcher(ctx, x2, wt)
    epilogue = None
    if bias is not None or act != "none":
        expr: tuple = ("in", 0)
        if bias is not None:
            expr = ("add", expr, ("in", 1))
        if act != "none":
            head = _ACT_EXPR[act]
            expr = (head[0], head[1], expr) if len(head) == 2 else (head[0], expr)
        y_plan = DeviceValue(x2.storage, shape, contiguous(shape), 0, dtype)
        args = [y_plan] + ([bias] if bias is not None else [])
        epilogue = ew.make(ctx, expr, args, shape, contiguous(shape), dtype, 256, tag=tag)

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        vx = fx(v[0])
        y = (ctx.alloc_out if epilogue is None else ctx.alloc)(shape, dtype, "linear")
        if numel(shape):
            launch(vx.ptr, v[1].ptr, y.ptr)
        if epilogue is None:
            return y
        out = ctx.alloc_out(shape, dtype, "linear")
        epilogue(out.ptr, [y.ptr] + ([v[2].ptr] if len(v) > 2 else []))
        return out

    return run
