"""matmul and linear: a few rows (decode) of bf16/f16 against a weight stored [N, K] go to
the tensor-core GEMV (bias and activation fused) for the shapes where it measured faster
than cuBLASLt (gemv.beats_gemm); folded linears (RMSNorm prologue, residual) take it for
M <= 16. A decode batch of a few dozen rows goes to the skinny GEMM where it measured
faster (gemm_skinny.beats_gemm: bias, activation and residual fused).
Quantized weights: see _linear_quant.
Otherwise cuBLASLt for f32/tf32/f16/bf16 when it loads (linear's bias and tanh-GELU as its
epilogue), else the template launchers (kernels/): the mma.sync GEMM for f16/bf16 when its
layout rules hold, else the strided matmul_simple kernel (every dtype)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from pygpukit.ir import DType, ops, shapes
from pygpukit.ir.linear import LinearSpec
from pygpukit.passes import Step

from .. import ew
from ..context import Context, capturing, contiguous, numel
from ..cublaslt import LT_DTYPES, GemmLaunch, lt_launcher, lt_operand
from ..layout import broadcast_strides, collapse, reshape_strides
from ..materialize import contiguous_as
from ..value import DeviceValue
from . import (
    activation_plan,
    dequant,
    fp8_quant,
    gemm_mma,
    gemm_skinny,
    gemv,
    gemv_quant,
    loader,
    matmul_simple,
    rms_norm_plan,
)

Run = Callable[[Sequence[DeviceValue]], DeviceValue]
_ACT_EXPR = {"gelu_tanh": ("gelu", "tanh"), "gelu_erf": ("gelu", "none"), "silu": ("silu",)}


class QuantGemmWeight(Protocol):
    """A quantized weight whose own GEMM serves a linear's float plan (_quant_gemm_linear):
    fp8_quant.Fp8Weight (FP8 tensor cores) and gemm_skinny.Int8Weight (w8a16)."""

    min_rows: int  # fewer rows of x keep the quantized GEMV where it applies

    def bind(self, scale_ptr: int, zero_ptr: int = 0, w_early: bool = False) -> None: ...

    def launcher(self, dtype: str, m: int, a_op: tuple[bool, int], epilogue: str,
                 ptrs: Sequence[int], ldc: int = 0) -> GemmLaunch | None: ...  # fmt: skip


class QuantGemmUnavailable(Exception):
    """The float plan reached a GEMM the quantized weight has none for (the caller
    dequantizes instead)."""


# While a quantized linear is planned on its weight's own GEMM (_quant_gemm_linear), its
# float plan holds a stand-in weight and every GEMM of it is this weight's: the GEMV and
# the NVRTC GEMMs never read the stand-in.
_QUANT_WEIGHT: ContextVar[QuantGemmWeight | None] = ContextVar("quant_weight", default=None)


@contextmanager
def _quant_weight(weight: QuantGemmWeight) -> Iterator[None]:
    token = _QUANT_WEIGHT.set(weight)
    try:
        yield
    finally:
        _QUANT_WEIGHT.reset(token)


def _gemm_launcher(ctx: Context, dtype: str, m: int, n: int, k: int, a_op: tuple[bool, int],
                   b_op: tuple[bool, int], epilogue: str, ptrs: Sequence[int],
                   ldc: int = 0) -> GemmLaunch | None:  # fmt: skip
    """A linear's cuBLASLt GEMM (tuned on its first run), or the own GEMM of the quantized
    weight being planned (_QUANT_WEIGHT)."""
    quant = _QUANT_WEIGHT.get()
    if quant is not None:
        return quant.launcher(dtype, m, a_op, epilogue, ptrs, ldc)
    return lt_launcher(ctx, dtype, m, n, k, a_op, b_op, epilogue=epilogue, ptrs=ptrs, ldc=ldc,
                       tune=True)  # fmt: skip


def _mm_launcher(ctx: Context, a: DeviceValue, b: DeviceValue
                 ) -> tuple[GemmLaunch, tuple[int, ...]]:  # fmt: skip
    """(launch(a_ptr, b_ptr, c_ptr), out shape incl. batch) for a [.., M, K] @ b [.., K, N]
    of one dtype; C is contiguous."""
    if _QUANT_WEIGHT.get() is not None:
        raise QuantGemmUnavailable("no quantized GEMM for this matmul")
    dtype = a.dtype.name
    a_shape, a_st = (a.shape, a.strides) if len(a.shape) > 1 else ((1,) + a.shape, (0,) + a.strides)
    b_shape, b_st = (b.shape, b.strides) if len(b.shape) > 1 else (b.shape + (1,), b.strides + (0,))
    m, k, n = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = shapes.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    abs_ = broadcast_strides(a_shape[:-2], a_st[:-2], batch)
    bbs = broadcast_strides(b_shape[:-2], b_st[:-2], batch)
    cbs = contiguous(batch + (m, n))[:-2]
    dims, (ca, cb, cc) = collapse(batch, abs_, bbs, cbs)
    a_op = lt_operand(m, k, a_st[-2], a_st[-1])
    b_op = lt_operand(k, n, b_st[-2], b_st[-1])
    if a_op and b_op and len(dims) <= 1 and min(ca + cb, default=0) >= 0:
        lt = lt_launcher(ctx, dtype, m, n, k, a_op, b_op, dims[0] if dims else 1,
                         ca[0] if dims else 0, cb[0] if dims else 0, "none",
                         (a.ptr, b.ptr))  # fmt: skip
        if lt is not None:
            return lt, batch + (m, n)
    lda, ldb = a_st[-2], b_st[-1]
    # Pointer alignment is checked per launch, so a view at an odd offset falls back to
    # matmul_simple instead of needing its own plan.
    use_mma = (
        dtype in gemm_mma.DTYPES and len(dims) <= 1 and a_st[-1] == 1 and b_st[-2] == 1
        and gemm_mma.supported(m, n, k, 0, 0, lda, ldb)
        and all(s % 8 == 0 for s in ca + cb)
    )  # fmt: skip
    nb = dims[0] if dims else 1
    sa, sb = (ca[0], cb[0]) if dims else (0, 0)

    def simple(pa: int, pb: int, pc: int) -> None:
        matmul_simple.matmul(pa, pb, pc, m, n, k, dtype, batch_shape=batch,
                             a_strides=(a_st[-2], a_st[-1]), b_strides=(b_st[-2], b_st[-1]),
                             c_strides=(n, 1), a_batch_strides=abs_, b_batch_strides=bbs,
                             c_batch_strides=cbs, stream=ctx.stream)  # fmt: skip

    def mma(pa: int, pb: int, pc: int) -> None:
        if pa % 16 or pb % 16:
            simple(pa, pb, pc)
            return
        gemm_mma.gemm(pa, pb, pc, m, n, k, dtype, lda=lda, ldb=ldb, ldc=n, batch=nb,
                      a_batch_stride=sa, b_batch_stride=sb, c_batch_stride=m * n,
                      stream=ctx.stream)  # fmt: skip

    if use_mma:
        return mma, batch + (m, n)
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
    launch = _matmul_gemv(ctx, a2, b2)
    if launch is None:
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
    """act(prologue(x) @ w.T + bias) + residual (see ir/linear.py)."""
    spec = LinearSpec.of(step.attrs, len(ins))
    if spec.quant is not None:
        return _linear_quant(ctx, step, ins, tag, spec)
    if spec.glu != "none":
        return _linear_gated(ctx, step, ins, tag, spec)
    if spec.has_residual or spec.prologue != "none":
        return _linear_folded(ctx, step, ins, tag, spec)
    x, w, bias = ins[0], ins[1], spec.split(ins).bias
    act = spec.activation
    dtype, shape = step.dtype, step.shape
    skinny = _skinny(ctx, step, ins, spec)
    if skinny is not None:
        return skinny

    fx, x2 = _as_dtype(ctx, x, dtype, tag)
    k = x2.shape[-1]
    rows = x2.size // k if k else 0
    rst = reshape_strides(x2.shape, x2.strides, (rows, k)) if len(x2.shape) > 2 else None
    if rst is not None:
        # Leading dims fold into M: one large GEMM instead of a batch of small ones.
        x2 = x2.view((rows, k), rst, x2.offset)
    fw, w = _as_dtype(ctx, w, dtype, tag)
    wt = w.view((w.shape[1], w.shape[0]), (w.strides[1], w.strides[0]), w.offset)
    launch, lt_bias, lt_act = _linear_gemv(ctx, x2, w, bias, act, only_if_faster=True)
    if launch is None:
        launch, lt_bias, lt_act = _linear_lt(ctx, x2, wt, bias, act)
    if launch is None:
        launch, _ = _mm_launcher(ctx, x2, wt)
    if lt_bias:
        bias = None  # the GEMM's epilogue adds it
    if lt_act:
        act = "none"
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
    ew_bias = bias is not None

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        vx = fx(v[0])
        y = (ctx.alloc_out if epilogue is None else ctx.alloc)(shape, dtype, "linear")
        if numel(shape):
            if lt_bias:
                launch(vx.ptr, fw(v[1]).ptr, y.ptr, v[2].ptr)
            else:
                launch(vx.ptr, fw(v[1]).ptr, y.ptr)
        if epilogue is None:
            return y
        out = ctx.alloc_out(shape, dtype, "linear")
        epilogue(out.ptr, [y.ptr] + ([v[2].ptr] if ew_bias else []))
        return out

    return run


def _linear_lt(ctx: Context, x: DeviceValue, wt: DeviceValue, bias: DeviceValue | None,
               act: str) -> tuple[GemmLaunch | None, bool, bool]:  # fmt: skip
    """(cuBLASLt launch or None, bias in its epilogue, activation in its epilogue) for a
    2-D x [M, K] @ wt [K, N]: bias (same dtype, unit stride) and tanh-GELU fuse into the
    GEMM; erf-GELU and SiLU have no cuBLASLt epilogue and stay an elementwise kernel."""
    if len(x.shape) != 2 or x.dtype.name not in LT_DTYPES or numel(x.shape + wt.shape) == 0:
        return None, False, False
    (m, k), n = x.shape, wt.shape[1]
    a_op = lt_operand(m, k, x.strides[0], x.strides[1])
    b_op = lt_operand(k, n, wt.strides[0], wt.strides[1])
    if a_op is None or b_op is None:
        return None, False, False
    use_bias = (
        bias is not None and bias.dtype == x.dtype and bias.shape == (n,)
        and (n == 1 or bias.strides == (1,))
    )  # fmt: skip
    use_act = act == "gelu_tanh"
    epi = {(False, False): "none", (True, False): "bias", (False, True): "gelu",
           (True, True): "gelu_bias"}[(use_bias, use_act)]  # fmt: skip
    ptrs = [x.ptr, wt.ptr] + ([bias.ptr] if use_bias and bias is not None else [])
    launch = _gemm_launcher(ctx, x.dtype.name, m, n, k, a_op, b_op, epi, ptrs)
    if launch is None:
        return None, False, False
    return launch, use_bias, use_act


# -- GEMV (decode) -------------------------------------------------------------------------
def _rows_view(x: DeviceValue) -> DeviceValue | None:
    """x [..., K] as a [M, K] view with unit column stride, or None when the leading dims do
    not fold into one row stride."""
    if not x.shape:
        return None
    k = x.shape[-1]
    rows = x.size // k if k else 0
    if len(x.shape) == 1:
        return x.view((1, k), (0, x.strides[0]), x.offset)
    st = reshape_strides(x.shape, x.strides, (rows, k))
    if st is None:
        return None
    return x.view((rows, k), st, x.offset)


def _gemv_launcher(ctx: Context, x: DeviceValue, w: DeviceValue, act: str,
                   only_if_faster: bool = False) -> GemmLaunch | None:  # fmt: skip
    """launch(x, w, y[, bias]) of y [M, N] = act(x [.., K] @ w [N, K]^T + bias) on the GEMV
    kernel, or None where it does not apply: dtype not bf16/f16, more than 16 rows, a column
    stride that is not 1, rows that do not fold. The launcher takes the scalar kernel at
    run time for unaligned pointers, so the plan holds for any address."""
    dtype = x.dtype.name
    if dtype not in loader.HALF_DTYPES or w.dtype != x.dtype or len(w.shape) != 2:
        return None
    if _QUANT_WEIGHT.get() is not None:
        return None  # w is a stand-in
    xr = _rows_view(x)
    if xr is None:
        return None
    (m, k), n = xr.shape, w.shape[0]
    if not 1 <= m <= gemv.MMA_ROWS or k == 0 or n == 0 or w.shape[1] != k:
        return None
    if k > 1 and (xr.strides[1] != 1 or w.strides[1] != 1):
        return None
    if only_if_faster and not gemv.beats_gemm(m, n, k):
        return None  # measured: cuBLASLt is faster for this shape (see gemv.beats_gemm)
    xs, ws = xr.strides[0], w.strides[0]
    if xs < 0 or ws < 0:
        return None

    def launch(px: int, pw: int, py: int, pbias: int = 0, **folded: Any) -> None:
        ys = n // 2 if folded.get("glu") else n
        gemv.gemv(px, pw, py, n, k, dtype, m=m, bias=pbias, activation=act, x_stride=xs,
                  w_stride=ws, y_stride=ys, stream=ctx.stream, **folded)  # fmt: skip

    return launch


def _matmul_gemv(ctx: Context, a: DeviceValue, b: DeviceValue) -> GemmLaunch | None:
    """The GEMV for a [.., M, K] @ b [K, N] where b is a transposed [N, K] weight (unit
    stride down its columns) and the rows of a number at most 16."""
    if len(b.shape) != 2 or len(a.shape) < 1 or (b.shape[0] > 1 and b.strides[0] != 1):
        return None
    w = b.view((b.shape[1], b.shape[0]), (b.strides[1], b.strides[0]), b.offset)
    return _gemv_launcher(ctx, a, w, "none", only_if_faster=True)


def _linear_gemv(ctx: Context, x: DeviceValue, w: DeviceValue, bias: DeviceValue | None,
                 act: str, only_if_faster: bool = False
                 ) -> tuple[GemmLaunch | None, bool, bool]:  # fmt: skip
    """(GEMV launch or None, bias fused, activation fused) for linear with few rows. The
    activation fuses only with the bias (it applies after it), so a bias the kernel cannot
    read (other dtype or stride) leaves both to the elementwise epilogue."""
    use_bias = (
        bias is not None
        and bias.dtype == x.dtype
        and bias.shape == (w.shape[0],)
        and (w.shape[0] == 1 or bias.strides == (1,))
    )
    fuse_act = bias is None or use_bias
    launch = _gemv_launcher(ctx, x, w, act if fuse_act else "none", only_if_faster)
    if launch is None:
        return None, False, False
    return launch, use_bias, fuse_act


# -- linear with a folded prologue / residual (passes/fold_into_linear.py) -------------------
def _linear_folded(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int,
                   spec: LinearSpec) -> Run:  # fmt: skip
    """One GEMV with the prologue and residual where it takes them; else the prologue
    kernel into scratch, then the linear with the residual (fused again if it can be,
    otherwise an add): the kernels the unfolded program would run."""
    fused = _gemv_folded(ctx, step, ins, spec)
    if fused is not None:
        return fused
    x, w = ins[0], ins[1]
    dtype, shape = step.dtype, step.shape
    res_at = spec.residual_at
    if spec.prologue != "none":
        attrs = {"eps": step.attrs["eps"]} if spec.prologue == "rms_norm" else {}
        specs = [(x.shape, x.dtype), (ins[-1].shape, ins[-1].dtype)]
        pshape, pdtype = ops.infer(spec.prologue, specs, attrs)
        pstep = Step(spec.prologue, attrs, (), -1, tuple(pshape), pdtype, step.loc)
        planner = (rms_norm_plan.plan_rms_norm if spec.prologue == "rms_norm"
                   else activation_plan.plan_swiglu)  # fmt: skip
        pro_run = planner(ctx, pstep, [x, ins[-1]], tag)
        xp = DeviceValue(x.storage, tuple(pshape), contiguous(tuple(pshape)), 0, pdtype)
        rest = list(ins[2 : res_at + spec.has_residual])  # bias, residual
        rest_attrs = {k: v for k, v in step.attrs.items() if k not in ("prologue", "eps")}
        after = plan_linear(ctx, Step("linear", rest_attrs, (), -1, shape, dtype, step.loc),
                            [xp, w, *rest], tag)  # fmt: skip

        def run_pro(v: Sequence[DeviceValue]) -> DeviceValue:
            with ctx.scratch_only():
                xv = pro_run([v[0], v[-1]])
            return after([xv, v[1], *v[2 : res_at + spec.has_residual]])

        return run_pro
    skinny = _skinny(ctx, step, ins, spec)
    if skinny is not None:
        return skinny
    lt_res = _linear_lt_residual(ctx, step, ins, spec)
    if lt_res is not None:
        return lt_res
    base_ins = [x, w] + ([ins[2]] if spec.has_bias else [])
    base_attrs = {"activation": spec.activation, "has_bias": spec.has_bias}
    base = plan_linear(ctx, Step("linear", base_attrs, (), -1, shape, dtype, step.loc),
                       base_ins, tag)  # fmt: skip
    y_plan = DeviceValue(x.storage, shape, contiguous(shape), 0, dtype)
    add = ew.make(ctx, ("add", ("in", 0), ("in", 1)), [y_plan, ins[res_at]], shape,
                  contiguous(shape), dtype, 256, tag=tag)  # fmt: skip

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        with ctx.scratch_only():
            y = base([v[0], v[1]] + ([v[2]] if spec.has_bias else []))
        out = ctx.alloc_out(shape, dtype, "linear")
        if numel(shape):
            add(out.ptr, [y.ptr, v[res_at].ptr])
        return out

    return run


def _linear_lt_residual(ctx: Context, step: Step, ins: Sequence[DeviceValue],
                        spec: LinearSpec) -> Run | None:  # fmt: skip
    """x @ w.T (+ bias) + residual as one cuBLASLt GEMM that adds the residual in its
    epilogue (C = residual, beta = 1) instead of a GEMM into scratch and an add kernel
    reading both back (prefill's attention-out and MLP-down projections). None where its
    rules do not hold: a prologue or an activation (cuBLASLt adds C before the activation,
    the residual comes after it), mixed dtypes, x or the residual not foldable into
    [M, K] / [M, N] matrices of unit column stride, or at most 16 rows (decode batches)."""
    if spec.activation != "none" or spec.prologue != "none" or not spec.has_residual:
        return None
    x, w, res = ins[0], ins[1], ins[spec.residual_at]
    dtype, shape = step.dtype, step.shape
    bias = ins[2] if spec.has_bias else None
    if dtype.name not in LT_DTYPES or any(
        v.dtype != dtype for v in (x, w, res, *([bias] if bias is not None else []))
    ):
        return None
    xr, rr = _rows_view(x), _rows_view(res)
    if xr is None or rr is None or len(w.shape) != 2 or not numel(shape):
        return None
    (m, k), n = xr.shape, w.shape[0]
    if k == 0 or w.shape[1] != k or rr.shape != (m, n) or (n > 1 and rr.strides[1] != 1):
        return None
    if m <= gemv.MMA_ROWS:
        return None  # a decode step's few rows keep their measured GEMM + add
    ldc = rr.strides[0] if m > 1 else n
    if ldc < n:
        return None
    wt = w.view((k, n), (w.strides[1], w.strides[0]), w.offset)
    a_op = lt_operand(m, k, xr.strides[0], xr.strides[1])
    b_op = lt_operand(k, n, wt.strides[0], wt.strides[1])
    if a_op is None or b_op is None:
        return None
    if bias is not None and not (bias.shape == (n,) and (n == 1 or bias.strides == (1,))):
        return None
    ptrs = [x.ptr, w.ptr, res.ptr] + ([bias.ptr] if bias is not None else [])
    epi = "none" if bias is None else "bias"
    launch = _gemm_launcher(ctx, dtype.name, m, n, k, a_op, b_op, epi, ptrs, ldc)
    if launch is None:
        return None
    res_at, has_bias = spec.residual_at, bias is not None

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        y = ctx.alloc_out(shape, dtype, "linear")
        launch(v[0].ptr, v[1].ptr, y.ptr, v[2].ptr if has_bias else 0, c=v[res_at].ptr)
        return y

    return run


def _gemv_folded(ctx: Context, step: Step, ins: Sequence[DeviceValue], spec: LinearSpec
                 ) -> Run | None:  # fmt: skip
    """One tensor-core GEMV reading x through the RMSNorm prologue and adding the
    residual, or None where its rules do not hold (then the composed path runs)."""
    if spec.prologue == "swiglu":
        # silu costs an exp and a divide per element of x, redone by every block for all
        # 16 row slots of the MMA tile: measured compute-bound (the decode step's GEMVs
        # ran 5x slower than bandwidth), so SwiGLU stays one small kernel before the GEMV.
        return None
    x, w = ins[0], ins[1]
    dtype, shape = step.dtype, step.shape
    res_at = spec.residual_at
    pro = ins[-1] if spec.prologue != "none" else None
    res = ins[res_at] if spec.has_residual else None
    if any(v.dtype != dtype for v in (x, w, *(v for v in (pro, res) if v is not None))):
        return None
    xr = _rows_view(x)
    rr = _rows_view(res) if res is not None else None
    if xr is None or (res is not None and rr is None):
        return None
    (m, k), n = xr.shape, w.shape[0]
    if m > gemv.MMA_STAGED_ROWS and not gemv.beats_gemm(m, n, k):
        # Measured (batch-16 decode): with x unstaged the folded GEMV ran 2x slower than
        # cuBLASLt plus separate norm and add kernels.
        return None
    if spec.prologue == "rms_norm" and (pro is None or pro.shape != (k,) or pro.strides != (1,)):
        return None
    if rr is not None and rr.strides[1] != 1:
        return None
    row_strides = (xr.strides[0] if xr.shape[0] > 1 else 0, w.strides[0])
    ptrs = (x.ptr, w.ptr) + ((pro.ptr,) if pro is not None else ())
    if not gemv.uses_mma(dtype.name, k, row_strides, ptrs):
        return None
    bias = ins[2] if spec.has_bias else None
    act = spec.activation
    launch, use_bias, fuse_act = _linear_gemv(ctx, x, w, bias, act)
    if launch is None or (bias is not None and not use_bias) or not fuse_act:
        return None
    eps = spec.eps
    rs = rr.strides[0] if rr is not None else 0

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        y = ctx.alloc_out(shape, dtype, "linear")
        if numel(shape):
            launch(v[0].ptr, v[1].ptr, y.ptr, v[2].ptr if spec.has_bias else 0,
                   prologue=spec.prologue, pro=v[-1].ptr if pro is not None else 0, eps=eps,
                   residual=v[res_at].ptr if spec.has_residual else 0, residual_stride=rs,
                   glu=spec.glu == "swiglu", w_early=_settled(ctx, v[1]))  # fmt: skip
        return y

    return run


def _skinny(ctx: Context, step: Step, ins: Sequence[DeviceValue], spec: LinearSpec
            ) -> Run | None:  # fmt: skip
    """act(x @ w.T + bias) + residual as one skinny GEMM (a decode batch of a few dozen
    rows, gemm_skinny.beats_gemm), or None where its rules do not hold: a prologue or
    SwiGLU, mixed dtypes, rows that do not fold, column strides other than 1."""
    if spec.prologue != "none" or spec.glu != "none" or _QUANT_WEIGHT.get() is not None:
        return None
    x, w = ins[0], ins[1]
    dtype, shape = step.dtype, step.shape
    bias = ins[2] if spec.has_bias else None
    res = ins[spec.residual_at] if spec.has_residual else None
    if any(v.dtype != dtype for v in (x, w, *(v for v in (bias, res) if v is not None))):
        return None
    xr = _rows_view(x)
    rr = _rows_view(res) if res is not None else None
    if xr is None or len(w.shape) != 2 or (res is not None and rr is None):
        return None
    (m, k), n = xr.shape, w.shape[0]
    if w.shape[1] != k or not gemm_skinny.beats_gemm(m, n, k) or not numel(shape):
        return None
    if rr is not None and rr.shape != (m, n):
        return None  # a residual broadcast over the rows keeps the composed path
    if xr.strides[1] != 1 or w.strides[1] != 1 or (rr is not None and rr.strides[1] != 1):
        return None
    if not gemm_skinny.supported(dtype.name, m, k, (xr.strides[0], w.strides[0])):
        return None
    if bias is not None and (bias.shape != (n,) or bias.strides != (1,)):
        return None
    xs, ws, rs = xr.strides[0], w.strides[0], rr.strides[0] if rr is not None else 0
    act, res_at = spec.activation, spec.residual_at

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        y = ctx.alloc_out(shape, dtype, "linear")
        gemm_skinny.gemm(v[0].ptr, v[1].ptr, y.ptr, m, n, k, dtype.name,
                         bias=v[2].ptr if bias is not None else 0, activation=act,
                         residual=v[res_at].ptr if res is not None else 0, x_stride=xs,
                         w_stride=ws, residual_stride=rs, w_early=_settled(ctx, v[1]),
                         stream=ctx.stream)  # fmt: skip
        return y

    return run


def _settled(ctx: Context, w: DeviceValue) -> bool:
    """Whether a kernel may read w before the kernel ahead of it on the stream finishes:
    w is read-only (no kernel writes it) and the launch is captured into a CUDA graph (so
    the kernel ahead is the graph's own, not one that made w before it was marked)."""
    return bool(getattr(w.storage, "readonly", False)) and capturing(ctx)


def _linear_gated(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int,
                  spec: LinearSpec) -> Run:  # fmt: skip
    """linear with glu="swiglu": one GEMV writing silu(gate) * up where it applies; else the
    full-width linear into scratch, the SwiGLU kernel on its halves, then the residual."""
    fused = _gemv_folded(ctx, step, ins, spec)
    if fused is not None:
        return fused
    dtype, shape = step.dtype, step.shape
    half = shape[-1]
    full = shape[:-1] + (2 * half,)
    res_at = spec.residual_at
    attrs = {k: v for k, v in step.attrs.items() if k not in ("glu", "has_residual")}
    base_ins = list(ins[:res_at]) + ([ins[-1]] if spec.prologue != "none" else [])
    base = plan_linear(ctx, Step("linear", attrs, (), -1, full, dtype, step.loc), base_ins, tag)
    y_plan = DeviceValue(ins[0].storage, full, contiguous(full), 0, dtype)

    def halves(y: DeviceValue) -> list[DeviceValue]:
        return [y.view(shape, y.strides, y.offset + i * half) for i in (0, 1)]

    gate_step = Step("swiglu", {}, (), -1, shape, dtype, step.loc)
    gate = activation_plan.plan_swiglu(ctx, gate_step, halves(y_plan), tag)
    add = None
    if spec.has_residual:
        g_plan = DeviceValue(ins[0].storage, shape, contiguous(shape), 0, dtype)
        add = ew.make(ctx, ("add", ("in", 0), ("in", 1)), [g_plan, ins[res_at]], shape,
                      contiguous(shape), dtype, 256, tag=tag)  # fmt: skip

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        with ctx.scratch_only():
            y = base(list(v[:res_at]) + ([v[-1]] if spec.prologue != "none" else []))
        if add is None:
            return gate(halves(y))
        with ctx.scratch_only():
            g = gate(halves(y))
        out = ctx.alloc_out(shape, dtype, "linear")
        if numel(shape):
            add(out.ptr, [g.ptr, v[res_at].ptr])
        return out

    return run


# -- quantized weights (ir/quant.py's layouts) ---------------------------------------------
def _linear_quant(ctx: Context, step: Step, ins: Sequence[DeviceValue], tag: int,
                  spec: LinearSpec) -> Run:  # fmt: skip
    """A few rows of bf16/f16 x: the quantized GEMV, dequantizing in registers, with the
    RMSNorm prologue, bias, activation, SwiGLU and residual fused as the bf16 GEMV fuses
    them (a launch per group of rows, gemv_quant.row_groups). From the weight's min_rows,
    or where the GEMV does not apply (prefill, a SwiGLU prologue, layouts it does not take,
    unaligned pointers at run time), the weight's own GEMM where it has one
    (_quant_gemm_linear): FP8 and int4 g128 weights on the FP8 tensor cores, int8 weights
    of a decode batch on the skinny GEMM. Else the weight dequantized into a scratch
    weight of x's dtype; then the float linear with the same flags on it."""
    q = spec.quant
    assert q is not None
    p = spec.split(ins)
    dtype, shape = step.dtype, step.shape
    assert p.scale is not None
    n = p.w.shape[0]
    k = ins[0].shape[-1]
    wshape = (n, k)
    w_plan = DeviceValue(p.w.storage, wshape, contiguous(wshape), 0, dtype)
    rest = [v for v in (p.bias, p.residual, p.prologue) if v is not None]
    attrs = {key: v for key, v in step.attrs.items() if key != "quant"}
    float_step = Step("linear", attrs, (), -1, shape, dtype, step.loc)
    scale_numel = numel(p.scale.shape)
    n_w = spec.n_weight
    fused = _gemv_quant(ctx, step, ins, spec)
    rows = numel(p.x.shape[:-1])
    weight: QuantGemmWeight | None = None
    if fp8_quant.fp8_gemm_possible(q, n, k, dtype.name, scale_numel):
        weight = fp8_quant.Fp8Weight(ctx, q, p.scale, n, k)
    elif gemm_skinny.int8_possible(q, k, dtype.name, rows, scale_numel, n):
        weight = gemm_skinny.Int8Weight(ctx, n, k)
    own = None
    if weight is not None:
        own = _quant_gemm_linear(ctx, float_step, [p.x, w_plan, *rest], tag, spec, weight)
    if own is not None and weight is not None:
        if fused is None or rows >= weight.min_rows:
            return own
        own_run = own

        def run_own(v: Sequence[DeviceValue]) -> DeviceValue:
            y = fused(v)
            return y if y is not None else own_run(v)

        return run_own
    after = plan_linear(ctx, float_step, [p.x, w_plan, *rest], tag)

    def dequantized(v: Sequence[DeviceValue]) -> DeviceValue:
        wv = ctx.alloc(wshape, dtype, "dequantized weight")
        vp = spec.split(v)
        assert vp.scale is not None
        dequant.dequantize(vp.w.ptr, vp.scale.ptr, wv.ptr, q, n, k, dtype.name,
                           scale_numel=scale_numel, zero=vp.zero.ptr if vp.zero else 0,
                           stream=ctx.stream)  # fmt: skip
        return after([v[0], wv, *v[1 + n_w :]])

    if fused is None:
        return dequantized

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        y = fused(v)
        return y if y is not None else dequantized(v)

    return run


def _quant_gemm_linear(ctx: Context, float_step: Step, float_ins: Sequence[DeviceValue],
                       tag: int, spec: LinearSpec, weight: QuantGemmWeight
                       ) -> Run | None:  # fmt: skip
    """The quantized linear on its weight's own GEMM: its float plan (float_step on
    float_ins, a stand-in weight second) with every GEMM the weight's, or None where one
    has none (its launcher's rules, no cuBLASLt algorithm). The run hands the float plan
    the quantized data as its weight."""
    try:
        with _quant_weight(weight):
            after = plan_linear(ctx, float_step, float_ins, tag)
    except QuantGemmUnavailable:
        return None

    def run(v: Sequence[DeviceValue]) -> DeviceValue:
        vp = spec.split(v)
        assert vp.scale is not None
        early = all(_settled(ctx, a) for a in vp.weight)
        weight.bind(vp.scale.ptr, vp.zero.ptr if vp.zero is not None else 0, early)
        return after([v[0], vp.w, *v[1 + spec.n_weight :]])

    return run


def _gemv_quant(ctx: Context, step: Step, ins: Sequence[DeviceValue], spec: LinearSpec
                ) -> Callable[[Sequence[DeviceValue]], DeviceValue | None] | None:  # fmt: skip
    """The quantized GEMV's run (None at run time for pointers it cannot take), or None
    where its rules do not hold."""
    q = spec.quant
    assert q is not None
    p = spec.split(ins)
    assert p.scale is not None
    dtype, shape = step.dtype, step.shape
    if dtype.name not in loader.HALF_DTYPES or spec.prologue == "swiglu":
        return None
    if any(v.dtype != dtype for v in (p.x, p.bias, p.residual, p.prologue) if v is not None):
        return None
    xr = _rows_view(p.x)
    rr = _rows_view(p.residual) if p.residual is not None else None
    if xr is None or (p.residual is not None and rr is None):
        return None
    (m, k), n = xr.shape, p.w.shape[0]
    if not gemv_quant.supported(q, k):
        return None
    groups = gemv_quant.row_groups(m, gemv_quant.rows_a_launch(q, k, dtype.name, m, n))
    if groups is None:
        return None
    if k > 1 and xr.strides[1] != 1 or (m > 1 and xr.strides[0] % 8):
        return None
    if any(not contiguous_view(v) for v in p.weight):
        return None
    if p.prologue is not None and (p.prologue.shape != (k,) or p.prologue.strides != (1,)):
        return None
    if p.bias is not None and (p.bias.shape != (n,) or (n > 1 and p.bias.strides != (1,))):
        return None
    if rr is not None and rr.strides[1] != 1:
        return None
    xs, rs = xr.strides[0], rr.strides[0] if rr is not None else 0
    ys, size = shape[-1], dtype.itemsize  # y: dense rows of the step's last dim
    scale_numel = numel(p.scale.shape)
    glu = spec.glu == "swiglu"
    settled = all(getattr(v.storage, "readonly", False) for v in p.weight)
    # The RMSNorm gain read before the predecessor wait too where it is a weight (read-only).
    gain_settled = p.prologue is not None and bool(getattr(p.prologue.storage, "readonly", False))

    def run(v: Sequence[DeviceValue]) -> DeviceValue | None:
        vp = spec.split(v)
        assert vp.scale is not None
        ptrs = (vp.x.ptr, vp.w.ptr) + ((vp.prologue.ptr,) if vp.prologue is not None else ())
        if any(a % 16 for a in ptrs):
            return None
        y = ctx.alloc_out(shape, dtype, "linear")
        if not numel(shape):
            return y
        for r0, rows in groups:  # rows are independent: each group is a launch of its own
            gemv_quant.gemv_quant(
                vp.x.ptr + r0 * xs * size, vp.w.ptr, vp.scale.ptr, y.ptr + r0 * ys * size, q,
                n, k, dtype.name, scale_numel=scale_numel,
                zero=vp.zero.ptr if vp.zero is not None else 0, m=rows,
                bias=vp.bias.ptr if vp.bias is not None else 0, activation=spec.activation,
                x_stride=xs, prologue=spec.prologue,
                pro=vp.prologue.ptr if vp.prologue is not None else 0, eps=spec.eps,
                residual=vp.residual.ptr + r0 * rs * size if vp.residual is not None else 0,
                residual_stride=rs, glu=glu, w_early=settled and capturing(ctx),
                pro_early=gain_settled, stream=ctx.stream,
            )  # fmt: skip
        return y

    return run


def contiguous_view(v: DeviceValue) -> bool:
    """Whether v is dense, row-major (a quantized weight's arrays as the kernels read them)."""
    return v.strides == contiguous(v.shape) or numel(v.shape) <= 1


PLANNERS = {"matmul": plan_matmul, "linear": plan_linear}
