"""The FP8 tensor-core GEMM of linears with quantized weights (linear_plan._fp8_linear): its
operands from fp8_quant.cuh (rows of bf16/f16 x as e4m3 with float32 scales per 128 columns
or per row; int4 weights as exact e4m3), which weights take it (fp8_modes,
fp8_gemm_possible, MIN_ROWS) and the GEMM's launcher over cuBLASLt (Fp8Weight)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pygpukit import _native, settings
from pygpukit.errors import ShapeError
from pygpukit.ir import dtypes
from pygpukit.ir.quant import FP8_BLOCK, QuantSpec

from .. import ew, toolchain
from ..context import Context, numel
from ..cublaslt import GemmLaunch, lt_launcher
from ..value import DeviceValue
from . import loader
from ._common import cdiv, int32_range, positive, round_up

THREADS = 256
GROUP = 128  # columns per scale of the per-128 form
# cuBLASLt reads every scale tensor with a leading dimension of whole 16 bytes (this many
# floats): the per-128 scales of A [M, K] (or of W) column after column, scale (row r,
# group g) at g * ld + r with ld the rows rounded up; W's 128 x 128 block scales
# [N/128, K/128] (as the loaders keep them) row after row, the columns rounded up.
SCALE_ALIGN = 4


def scale_layout(group: int, m: int, k: int) -> tuple[int, int, int]:
    """(s_col, s_row, count) of the scales of m rows of K: scale (r, g) at g * s_col +
    r * s_row, count the floats to allocate. group GROUP: per 128 columns, column-major with
    the rows padded to SCALE_ALIGN; 0: one a row."""
    if group == GROUP:
        ld = round_up(m, SCALE_ALIGN)
        return ld, 1, ld * cdiv(k, GROUP)
    if group == 0:
        return 0, 1, m
    raise ShapeError(f"fp8_quant: group {group} (128, or 0 for one scale a row)")


def quantize_rows(x: int, q: int, scale: int, m: int, k: int, dtype: str, *, group: int,
                  x_stride: int, q_stride: int, m_x: int | None = None,
                  stream: Any = None) -> None:  # fmt: skip
    """q [m, k] (e4m3 bytes, row stride q_stride, a multiple of 16, 16-byte aligned) and
    float32 scales at `scale` (scale_layout's for m rows) from x [m_x, k] of dtype (row
    stride x_stride; m_x defaults to m): x ~= e4m3(q) * scale, each group's largest
    magnitude 448 exactly; rows m_x .. m - 1 zero (q 0, scale 1)."""
    loader.check_dtype(dtype, loader.HALF_DTYPES, "fp8_quant")
    m_x = m if m_x is None else m_x
    positive("fp8_quant", m=m, k=k, m_x=m_x)
    int32_range("fp8_quant", m=m, k=k)
    if m_x > m:
        raise ShapeError(f"fp8_quant: {m_x} rows of x for {m} rows of q")
    if q % 16 or q_stride % 16 or q_stride < k or x_stride < k:
        raise ShapeError(f"fp8_quant: q at {q:#x} with row stride {q_stride} for K={k} (16-byte"
                         f" aligned rows of at least K), x row stride {x_stride}")  # fmt: skip
    if m == 0 or k == 0:
        return
    s_col, s_row, _ = scale_layout(group, m, k)
    vec = int(x % 16 == 0 and x_stride % 8 == 0)
    fn = loader.get_kernel("fp8_quant", "pgk_fp8_quant",
                           {**loader.type_defines(dtype), "PGK_FQG": group})  # fmt: skip
    grid = cdiv(m * cdiv(k, GROUP), THREADS // 16) if group else m
    int32_range("fp8_quant", blocks=grid)
    fn.launch(
        (grid,),
        (THREADS,),
        (x, q, scale, m, m_x, k, x_stride, q_stride, s_col, s_row, vec),
        0,
        stream,
    )


def int4_as_e4m3(w: int, zero: int, out: int, spec: QuantSpec, n: int, k: int, *,
                 scales: tuple[int, int, int, int] | None = None,
                 stream: Any = None) -> None:  # fmt: skip
    """out [n, k] (e4m3 bytes, dense, 16-byte aligned) = q - zero of the int4 weight at w
    (ir/quant.py's [n, k/2] bytes, 16-byte aligned; uint8 zero points at `zero` when
    spec.has_zero), each exact: the FP8 GEMM's operand, the group scales applying there.
    scales (scale, ld, scale_t, ld_t): also the float32 group scales [n, k/group] at scale
    (row stride ld) transposed to scale_t [k/group, ld_t] (ld_t >= n), as cuBLASLt reads
    them."""
    if spec.format != "int4" or spec.group % 32 or k % 32:
        raise ShapeError(f"int4_as_e4m3: a {spec.label} weight with K={k} (int4, groups "
                         f"and K of 32s)")  # fmt: skip
    positive("int4_as_e4m3", n=n, k=k)
    if w % 16 or out % 16:
        raise ShapeError("int4_as_e4m3: W and out must be 16-byte aligned")
    if n == 0 or k == 0:
        return
    threads = n * (k // 32)
    int32_range("int4_as_e4m3", threads=threads)
    sc, ld, sc_t, ld_t = scales if scales is not None else (0, 0, 0, 0)
    if sc_t and (ld < k // spec.group or ld_t < n):
        raise ShapeError(f"int4_as_e4m3: scale row strides {ld} / {ld_t} for {n} rows of "
                         f"{k // spec.group} groups")  # fmt: skip
    relay = cdiv(n * (k // spec.group), THREADS) if sc_t else 0
    fn = loader.get_kernel("fp8_quant", "pgk_int4_e4m3", {"PGK_QZERO": int(spec.has_zero)})
    fn.launch((relay + cdiv(threads, THREADS),), (THREADS,), (w, zero, out, n, k, spec.group,
              k // spec.group, sc, sc_t, ld, ld_t, relay), 0, stream)  # fmt: skip


# A weight's scale form -> (x's scale mode and group, W's scale mode) of the FP8 GEMM: the
# pairs cuBLASLt 13.1 has algorithms for on SM 9.0 (an H200 refused a per-tensor W with any
# x but a per-tensor one, and per-128 x with a per-row W). An int4 weight of group 128
# takes it as e4m3 q - zero (int4_as_e4m3) with its group scales per 128 of a row: w4a8.
BLOCK_MODES = ("vec128", GROUP, "blk128x128")
ROW_MODES = ("outer_vec", 0, "outer_vec")
GROUP_MODES = ("vec128", GROUP, "vec128")
MIN_CC = (9, 0)
# Rows of x from which a weight takes the FP8 GEMM rather than the quantized GEMV (one
# launch of up to 8 rows, of 16 or two of 8 up to 16: gemv_quant.rows_a_launch), per format.
# int4 first makes its e4m3 operand (1.5 bytes a weight of traffic a call), so it waits for
# the rows the GEMV takes no longer.
MIN_ROWS = {"fp8": 9, "int4": 17}
# ... except fp8 at K up to FP8_SMALL_K, which takes it from FP8_SMALL_K_ROWS: there the
# GEMV's one launch of up to 16 rows (gemv_quant.WIDE_ROWS) beat the FP8 GEMM's 128 x 128
# tiles at a few rows. H200, TinyLlama fp8 decode, ms a step at 9 / 12 / 16 rows, the FP8
# GEMM from 9 rows against the GEMV to 16 at K = 2048 (two alternating rounds): 1.44 / 1.29
# / 1.29 against 1.25 / 1.26 / 1.32 (bf16 0.98 / 0.99 / 1.00).
FP8_SMALL_K = 2048
FP8_SMALL_K_ROWS = 13


def min_rows(spec: QuantSpec, k: int) -> int:
    """Rows of x from which a weight of K columns takes the FP8 GEMM (MIN_ROWS; fp8 at K up
    to FP8_SMALL_K from FP8_SMALL_K_ROWS)."""
    if spec.format == "fp8" and k <= FP8_SMALL_K:
        return FP8_SMALL_K_ROWS
    return MIN_ROWS[spec.format]


# FP8 GEMMs write D in rows of whole 16 bytes: N a multiple of this (cuBLASLt 13.1 on an
# H200 had no algorithm for N = 517, and had for 520, 528 and 1000).
OUT_ROW_ALIGN = 8


def fp8_modes(spec: QuantSpec, n: int, scale_numel: int) -> tuple[str, int, str] | None:
    """(x's scale mode, x's group, W's scale mode) of the FP8 GEMM for a quantized weight
    of n rows with scale_numel scales, or None: per-tensor FP8 scales, FP8 blocks other
    than 128, int4 groups other than 128, int8."""
    if spec.format == "int4":
        return GROUP_MODES if spec.group == GROUP else None
    if spec.format != "fp8":
        return None
    if spec.block == FP8_BLOCK == GROUP:
        return BLOCK_MODES
    if not spec.block and scale_numel == n and n > 1:
        return ROW_MODES
    return None


def fp8_gemm_possible(spec: QuantSpec, n: int, k: int, dtype: str, scale_numel: int) -> bool:
    """Whether a quantized weight [n, k] under x of dtype may take the FP8 tensor cores
    here: the setting allows it, the device is SM 9.0+, x is bf16/f16, K and N whole
    16-byte rows and the scales of a form cuBLASLt takes (the heuristic decides the rest)."""
    return (
        settings.fp8_gemm() and dtype in loader.HALF_DTYPES and k % 16 == 0
        and n % OUT_ROW_ALIGN == 0 and fp8_modes(spec, n, scale_numel) is not None
        and tuple(toolchain.device_info()["compute_capability"]) >= MIN_CC
    )  # fmt: skip


class Fp8Weight:
    """The quantized weight of a linear being planned on the FP8 tensor cores, for the
    GEMMs of its float plan (a stand-in weight there): each GEMM quantizes its x
    (quantize_rows), makes an int4 weight's e4m3 operand (int4_as_e4m3) and multiplies e4m3
    by e4m3 with both operands' scales (cuBLASLt). The run binds the weight's scales and
    zero points (bind) before the float plan's run reads them; its data is the float
    plan's weight argument."""

    def __init__(self, ctx: Context, spec: QuantSpec, scale: DeviceValue, n: int, k: int) -> None:
        modes = fp8_modes(spec, n, numel(scale.shape))
        assert modes is not None
        self.x_mode, self.group, self.w_mode = modes
        self.ctx, self.spec, self.n, self.k = ctx, spec, n, k
        self.min_rows = min_rows(spec, k)  # fewer rows: the quantized GEMV
        self._scale = self._zero = 0
        self._relaid = None  # W's scales copied into the layout cuBLASLt reads, if not theirs
        self._relaid_shape = (0, 0)
        self._scale_ld = 0  # int4: the scales' row stride, relaid by int4_as_e4m3
        rows, cols = scale.shape if len(scale.shape) == 2 else (0, 0)
        if self.w_mode == "blk128x128" and cols % SCALE_ALIGN:
            self._relaid_shape = (rows, round_up(cols, SCALE_ALIGN))
            strides = (self._relaid_shape[1], 1)
        elif self.w_mode == "vec128":  # int4's row-major [N, K/128]: transposed every call
            self._relaid_shape = (cols, round_up(rows, SCALE_ALIGN))
            strides = (1, self._relaid_shape[1])
            if scale.strides[1] == 1 and spec.format == "int4":
                # by int4_as_e4m3 as it converts the weight: no launch of its own
                self._scale_ld = scale.strides[0]
                return
        else:
            return
        self._relaid = ew.make(ctx, ("in", 0), [scale], scale.shape, strides, scale.dtype, 256)

    def bind(self, scale_ptr: int, zero_ptr: int = 0, w_early: bool = False) -> None:
        """The weight's float32 scales (and int4 zero points) for the GEMMs that run next
        (w_early: cuBLASLt's kernels read it after their wait whatever it says)."""
        del w_early
        self._scale, self._zero = scale_ptr, zero_ptr

    def launcher(self, dtype: str, m: int, a_op: tuple[bool, int], epilogue: str,
                 ptrs: Sequence[int], ldc: int = 0) -> GemmLaunch | None:  # fmt: skip
        """launch(x, w, d[, bias][, c=]) of d [m, n] = epilogue(x [m, k] @ W^T) (+ c): x of
        dtype quantized to e4m3 into scratch, then the FP8 GEMM. None where cuBLASLt has no
        algorithm for it (its epilogue or C, say)."""
        trans, lda = a_op
        n, k, ctx = self.n, self.k, self.ctx
        if trans or n % OUT_ROW_ALIGN:
            return None  # the quantizing kernel reads rows of x; D's rows whole 16 bytes
        # Per-128 scales take rows in fours: the GEMM's rows padded (zero rows of q) into
        # a scratch D, its first m rows copied out; an added C would be read past its end.
        mg = round_up(m, SCALE_ALIGN) if self.group == GROUP else m
        if mg != m and ldc:
            return None
        modes = (self.x_mode, self.w_mode)
        lt = lt_launcher(ctx, dtype, mg, n, k, (False, k), (True, k), epilogue=epilogue,
                         ptrs=ptrs, ldc=ldc, tune=True, scales=modes)  # fmt: skip
        if lt is None:
            return None
        count = scale_layout(self.group, mg, k)[2]
        out_bytes = m * n * loader.itemsize(dtype)
        int4 = self.spec.format == "int4"

        def launch(pa: int, pb: int, pd: int, pbias: int = 0, c: int = 0) -> None:
            q = ctx.alloc((mg, k), dtypes.uint8, "fp8 activations")
            xs = ctx.alloc((count,), dtypes.float32, "fp8 activation scales")
            quantize_rows(pa, q.ptr, xs.ptr, mg, k, dtype, group=self.group, x_stride=lda,
                          q_stride=k, m_x=m, stream=ctx.stream)  # fmt: skip
            w_scale, w = self._scale, pb
            scales = None
            if self._relaid is not None or self._scale_ld:
                relaid = ctx.alloc(self._relaid_shape, dtypes.float32, "fp8 weight scales")
                if self._relaid is not None:
                    self._relaid(relaid.ptr, [w_scale])
                else:
                    scales = (w_scale, self._scale_ld, relaid.ptr, self._relaid_shape[1])
                w_scale = relaid.ptr
            if int4:
                w8 = ctx.alloc((n, k), dtypes.uint8, "int4 weight as e4m3")
                int4_as_e4m3(pb, self._zero, w8.ptr, self.spec, n, k, scales=scales,
                             stream=ctx.stream)  # fmt: skip
                w = w8.ptr
            if mg == m:
                lt(q.ptr, w, pd, pbias, c, a_scale=xs.ptr, b_scale=w_scale)
                return
            d = ctx.alloc((mg, n), dtypes.as_dtype(dtype), "fp8 GEMM rows")
            lt(q.ptr, w, d.ptr, pbias, a_scale=xs.ptr, b_scale=w_scale)
            _native.memcpy_dtod_async(pd, d.ptr, out_bytes, ctx.stream)

        return launch
