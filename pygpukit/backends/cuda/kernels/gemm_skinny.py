"""Launcher for gemm_skinny.cuh: y = act(x @ W^T + bias) + residual for up to MAX_ROWS rows
of bf16/f16 x against W [N, K] (batched decode) of x's dtype or int8 with a scale per row
(w8a16), and the rules that route linears to it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pygpukit.errors import ShapeError
from pygpukit.ir.quant import QuantSpec

from .. import toolchain
from ..context import Context
from ..cublaslt import GemmLaunch
from . import loader
from ._common import cdiv, int32_range, positive

DTYPES = loader.HALF_DTYPES
ACTS = {"none": 0, "gelu_tanh": 1, "gelu_erf": 2, "silu": 3}
MAX_ROWS = 64
BLOCK_N = 128  # rows of W a block (gemm_skinny.cuh PGK_SBN)
BLOCK_K = 64  # columns of K a stage (PGK_SBK)
STAGES = 4
# Split K over clusters of up to MAX_SLICES blocks (a power of two; SM 9.0 only) while the
# grid stays within BLOCKS_PER_SM blocks an SM and each slice holds MIN_SLICE stages.
# H200, us, in CUDA graphs with early weight loads, against torch.matmul (cuBLASLt) on the
# same data: one block per SM or four, a shallower pipeline (3 stages) or eight warps
# splitting each stage's K measured the same or up to 2x slower at 17-64 rows.
BLOCKS_PER_SM = 2
# An int8 W's smaller stages fit three blocks an SM, and the wide weights gain from the
# slices that allows (H200, 64 rows: TinyLlama gate|up 22.6 -> 18.6 us, Llama-2-7B's 72.0
# -> 55.3; the others within 1-7%, 7B QKV at 16 rows 26.8 -> 28.8 the most).
INT8_BLOCKS_PER_SM = 3
MIN_SLICE = 4
MAX_SLICES = 8  # the portable cluster size
# Where it measured faster than cuBLASLt (H200, us, ours against torch.matmul on the same
# data, CUDA graphs): 5-32 rows of the TinyLlama-shape QKV [2560 x 2048] 5.4-6.4 against
# 6.3-7.0, attention output [2048 x 2048] 5.1-6.0 against 6.3-6.6, MLP down [2048 x 5632]
# 9.5-11.1 against 11.1-11.8. Not taken: 64 rows of those (7.7-13.4 against 6.7-12.1),
# the weights of more than SMALL_WEIGHT elements (Llama-2-7B QKV [12288 x 4096] 29.6-31.7
# against 27.8-28.5, down [4096 x 11008] 35-38 against 27-30; the LM head [32000 x 2048]
# 0.87x at 5-16 rows, 1.05x at 17-32), where the weight is long enough for cuBLASLt's
# grid and a tile's x (re-read by every tile) costs more than the split saves.
MIN_ROWS = 5  # fewer: the GEMV (gemv.beats_gemm)
ROUTE_ROWS = 32
SMALL_WEIGHT = 12 << 20  # the largest measured winner: 2048 x 5632


# int8 weights (w8a16): from INT8_MIN_ROWS rows of x the skinny GEMM takes them; fewer
# take the quantized GEMV (one launch), more (prefill) dequantize the weight into a scratch
# bf16 one for cuBLASLt. H200, decode step (bf16 x, 512-token contexts) with the GEMV's
# two launches of up to 8 rows, this GEMM, bf16: TinyLlama at 9 rows 1.66 / 1.10 / 1.00 ms,
# 16 rows 1.82 / 1.12 / 1.05; Llama-2-7B at 9 rows 5.37 / 4.57 / 4.45, 16 rows
# 6.09 / 5.09 / 4.56. At 64 rows (mma.sync bound: it runs 0.7-0.8x cuBLASLt's bf16 GEMM,
# 1.1-1.8x the dequantization and GEMM it replaces) TinyLlama 1.55 ms, 7B 7.29 (bf16 1.24,
# 6.06; 11.1 dequantizing), with INT8_BLOCKS_PER_SM.
INT8_MIN_ROWS = 9
INT8_EPILOGUES = {"none": "none", "bias": "none", "gelu": "gelu_tanh", "gelu_bias": "gelu_tanh"}


def beats_gemm(m: int, n: int, k: int) -> bool:
    """Whether a linear of m rows against W [n, k] should take this kernel over cuBLASLt."""
    return MIN_ROWS <= m <= ROUTE_ROWS and n * k <= SMALL_WEIGHT


def supported(dtype: str, m: int, k: int, strides: tuple[int, ...]) -> bool:
    """Whether the kernel takes m rows of length k with these row strides (elements):
    bf16/f16, 1 <= m <= MAX_ROWS, K % 8 == 0 and row strides that keep 16-byte pieces."""
    return (
        dtype in DTYPES and 1 <= m <= MAX_ROWS and k % 8 == 0 and k > 0
        and all(s % 8 == 0 for s in strides)
    )  # fmt: skip


def geometry(m: int, n: int, k: int, sms: int, clusters: bool = True,
             blocks_per_sm: int = BLOCKS_PER_SM) -> tuple[int, int, int, int]:  # fmt: skip
    """(m16 tiles of x, tiles of W, stages per slice, slices) of a launch. Every slice is
    non-empty: slices <= stages / MIN_SLICE, so (slices - 1) * per < stages."""
    smt = cdiv(m, 16)
    tiles = cdiv(n, BLOCK_N)
    kst = cdiv(k, BLOCK_K)
    slices = 1
    while (clusters and slices < MAX_SLICES and tiles * slices * 2 <= blocks_per_sm * sms
           and kst >= MIN_SLICE * slices * 2):  # fmt: skip
        slices *= 2
    return smt, tiles, cdiv(kst, slices), slices


def smem_bytes(smt: int, stages: int, int8: bool = False) -> int:
    """Dynamic shared memory: the stages of W (bytes for an int8 W) and x (the fp32 tile
    reuses them)."""
    return stages * ((1 if int8 else 2) * BLOCK_N + 32 * smt) * BLOCK_K


def gemm(
    x: int,
    w: int,
    y: int,
    m: int,
    n: int,
    k: int,
    dtype: str,
    *,
    bias: int = 0,
    activation: str = "none",
    residual: int = 0,
    x_stride: int | None = None,
    w_stride: int | None = None,
    y_stride: int | None = None,
    residual_stride: int | None = None,
    scale: int = 0,
    w_early: bool = False,
    stream: Any = None,
) -> None:
    """y[i, :] = act(W @ x[i, :] + bias) + residual[i, :] for i < m (strides in elements,
    default dense). scale: W is int8 and this float32 [N] its row scales (W's values are
    W[n, :] * scale[n]; K and W's row stride multiples of 16). w_early: W may be read
    before the kernel waits for its predecessor (read-only weights in a captured graph). x
    or W not 16-byte aligned take the variant that loads elements (any address works)."""
    loader.check_dtype(dtype, DTYPES, "gemm_skinny")
    positive("gemm_skinny", n=n, k=k, m=m)
    int32_range("gemm_skinny", n=n, k=k)
    if activation not in ACTS:
        raise ShapeError(f"gemm_skinny: unknown activation {activation!r} ({', '.join(ACTS)})")
    xs = k if x_stride is None else x_stride
    wst = k if w_stride is None else w_stride
    ys = n if y_stride is None else y_stride
    rs = n if residual_stride is None else residual_stride
    if not supported(dtype, m, k, (xs if m > 1 else 0, wst)):
        raise ShapeError(f"gemm_skinny: {m} rows of K={k} ({dtype}, row strides {xs}, {wst}) "
                         f"need 1-{MAX_ROWS} rows, K % 8 == 0 and strides % 8 == 0")  # fmt: skip
    if scale and (k % 16 or wst % 16):
        raise ShapeError(f"gemm_skinny: an int8 weight needs K and its row stride multiples "
                         f"of 16, got K={k}, row stride {wst}")  # fmt: skip
    if n == 0:
        return
    clusters = toolchain.device_info()["compute_capability"][0] >= 9
    bps = INT8_BLOCKS_PER_SM if scale else BLOCKS_PER_SM
    smt, tiles, per, slices = geometry(m, n, k, toolchain.sm_count(), clusters, bps)
    defines = {**loader.type_defines(dtype), "PGK_SMT": smt, "PGK_SST": STAGES,
               "PGK_SCL": slices, "PGK_ACT": ACTS[activation],
               "PGK_SALIGN": int(x % 16 == 0 and w % 16 == 0),
               **({"PGK_SQ8": 1} if scale else {})}  # fmt: skip
    fn = loader.get_kernel("gemm_skinny", "pgk_gemm_skinny", defines)
    smem = smem_bytes(smt, STAGES, bool(scale))
    fn.set_dynamic_smem(smem)
    fn.launch(
        (tiles, slices),
        (128,),
        (x, w, scale, bias, y, residual, m, n, k, xs, wst, ys, rs, per, int(w_early)),
        smem,
        stream,
    )


def int8_possible(spec: QuantSpec, k: int, dtype: str, rows: int, scale_numel: int,
                  n: int) -> bool:  # fmt: skip
    """Whether a quantized linear takes the int8 skinny GEMM: int8 weights with a scale per
    row, bf16/f16 x of at most MAX_ROWS rows and K a multiple of 16."""
    return (
        spec.format == "int8" and dtype in DTYPES and 1 <= rows <= MAX_ROWS and k % 16 == 0
        and scale_numel == n
    )  # fmt: skip


class Int8Weight:
    """The int8 weight of a linear planned on the skinny GEMM, for the GEMMs of its float
    plan (which holds a stand-in weight): every GEMM there reads the int8 data it is handed
    as its weight, with the row scales bound before the plan runs (bind)."""

    min_rows = INT8_MIN_ROWS

    def __init__(self, ctx: Context, n: int, k: int) -> None:
        self.ctx, self.n, self.k = ctx, n, k
        self._scale = 0
        self._early = False

    def bind(self, scale_ptr: int, zero_ptr: int = 0, w_early: bool = False) -> None:
        """The weight's float32 row scales for the GEMMs that run next; w_early: its data
        may be read before the kernel ahead finishes (read-only, in a captured graph)."""
        del zero_ptr  # symmetric: no zero points
        self._scale, self._early = scale_ptr, w_early

    def launcher(self, dtype: str, m: int, a_op: tuple[bool, int], epilogue: str,
                 ptrs: Sequence[int], ldc: int = 0) -> GemmLaunch | None:  # fmt: skip
        """launch(x, w, d[, bias][, c=]) of d [m, n] = epilogue(x [m, k] @ W^T) (+ c), or
        None where the kernel does not take it (x's rows transposed, an epilogue it lacks)."""
        del ptrs  # the kernel picks its aligned or element-wise loads per call
        trans, lda = a_op
        n, k = self.n, self.k
        if trans or epilogue not in INT8_EPILOGUES or not supported(dtype, m, k, (lda, k)):
            return None
        act = INT8_EPILOGUES[epilogue]

        def launch(pa: int, pb: int, pd: int, pbias: int = 0, c: int = 0) -> None:
            gemm(pa, pb, pd, m, n, k, dtype, bias=pbias, activation=act, residual=c,
                 x_stride=lda, residual_stride=ldc or n, scale=self._scale,
                 w_early=self._early, stream=self.ctx.stream)  # fmt: skip

        return launch
