"""Launcher for gemv_quant.cuh: y = act(p(x) @ dequantize(W)^T + bias) + residual for up to
QUANT_ROWS rows of bf16/f16 x (WIDE_ROWS on the staged path), W in one of ir/quant.py's
layouts (the prefill path's dequantization into a scratch weight is dequant.py)."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError
from pygpukit.ir.quant import FP8_BLOCK, QuantSpec

from .. import toolchain
from . import gemv, loader
from ._common import cdiv, int32_range, positive, pow2_at_least

# Rows of x one launch takes: the lower half of the mma tile (its upper half is zero).
QUANT_ROWS = 8
# ... and on the staged path where shared memory holds that many rows of x beside the stages:
# two n8 tiles of x's rows multiply the same dequantized fragments of W (PGK_QMX 2), so 9-16
# rows read and dequantize W once (wide_rows_config: K = 2048, 4096 and, in fewer stages and
# warps, 5632; not 11008).
# H200, decode at 16 rows, x of bf16 (two launches of 8 -> one of 16; bench quant_llm): int4
# TinyLlama 0.71 -> 0.97, Llama-2-7B 0.90 -> 1.02. int8 and fp8 keep their GEMMs from 9 rows
# (the skinny GEMM, the FP8 GEMM; fp8 at small K from 13: fp8_quant.min_rows): on this GEMV
# at 12 / 16 rows TinyLlama int8 took 1.25 / 1.37 ms a step against 1.14 / 1.15, Llama-2-7B
# fp8 4.39 / 5.49 against 3.67 / 3.82 (and TinyLlama fp8 1.13 / 1.24 against 1.28, 7B int8
# 4.29 / 4.83 against 4.44 / 4.89).
WIDE_ROWS = 16
# Stages per warp of a 16-row launch whose format's own leave no room for x's rows (then
# four warps too): TinyLlama int4 decode at 16 rows, x of bf16, 0.97 -> 0.99 with its down
# projection (K = 5632) in one launch of those instead of two of 8 rows (H200).
WIDE_ROWS_STAGES = 2
FORMATS = {"int8": 0, "fp8": 1, "int4": 2}
# More rows (batched decode): the GEMV once per group of up to QUANT_ROWS rows, each launch
# reading W again, while that is faster than the other path (W dequantized into a scratch
# weight of x's dtype, then multiplied). H200, decode ms a step at 16 / 32 / 64 rows, two
# or more groups against the scratch path (`pygpukit.bench.llm.bench_pygpukit`): Llama-2-7B
# int8 6.22 / 12.42 / - against 9.62 / 10.03 / 11.07, int4 5.58 / 11.12 / 22.06 against
# 9.27 / 9.69 / 10.69; TinyLlama int8 1.82 / 3.56 against 1.85 / 1.85, int4 1.45 / 2.74 /
# 5.42 against 1.83 / 1.83 / 1.91. A launch costs about as much at 4 rows as at 8 (7B int8,
# 8 rows a step: 3.26 ms in one launch, 5.30 in two of 4), so groups are of up to 8; the
# same limit served every format.
MAX_ROW_GROUPS = 2
# A slab is U chunks of each warp's range, U the power of two covering the range up to
# MAX_SLAB (fewer loads in flight past it).
MAX_SLAB = 8
# The register path (PGK_QSTAGES 0: rows of x that do not fit in shared memory beside the
# stages, int4 groups of 64). Per format: (warps, n8 tiles per warp, the next slab's loads
# in flight while the current one is multiplied). H200, batch 1, w_early, summed us over
# the 7 bench shapes (scripts/quant_sweep.py at 4aac5d5, in git history): int8 (4, 2)
# pipelined 111.6 against 121.3 for (4, 1) single-buffered; int4 g128 (4, 2) pipelined
# 93.2 against 101.7; fp8 b128 (4, 1) single-buffered 123.2 against 130-147 pipelined.
FORMAT_CONFIG = {"int8": (4, 2, True), "fp8": (4, 1, False), "int4": (4, 2, True)}
# Its persistent grid under early loads (w_early): one block per tile. The bf16 GEMV's two
# blocks per SM (gemv.EARLY_BLOCKS_PER_SM) left it latency-bound: int8 [22016 x 4096]
# 55.3 us against 34.4, int4 g128 [11264 x 2048] 14.7 against 9.3.
EARLY_BLOCKS_PER_SM = 0
# The staged path (W through shared memory, PGK_QSTAGES > 0), per format: (warps, n8 tiles
# per warp, chunks per stage, stages per warp), and its persistent grid under early loads.
# The register path held one slab per lane in flight: 50-68% of copy bandwidth at the
# Llama-2-7B shapes on an H200 (bench/results/h200-quant.json at 3bc2948, in git history).
# H200, batch 1, w_early, us summed over the 7 bench shapes (a sweep of 17 geometries at
# 22cdab5): int8 (8, 2, 4, 2) on two blocks per SM 102.4 (best 100.9, registers 111.9),
# fp8 86.1 (registers 111.0), fp8 b128 87.0 (123.1); int4 g128 (8, 2, 2, 4) 71.1 (93.4),
# asym 79.2 (116.3). With W as the MMA's A operand and no conversion instructions (H200,
# a sweep of 6 geometries at c8adc08) these stay the best summed over the shapes: int8
# 86.2 us, fp8 84.8, fp8 b128 85.4, int4 g128 58.5, asym 66.5 (the register path 110.0,
# 110.4, 108.1, 69.8, 79.4). Blocks per SM: as many as fit up to three (resident_blocks):
# three took [11264 x 2048] from 12.3 to 9.2 us (int8) and 11.7 to 8.8 (fp8) and changed
# no other bench shape by more than 1% (at 9599d14). int8 and fp8 at K = 4096 missed a third
# block by about 1.5 KiB of shared memory while the partial sums were sized for 8 rows of x
# (red_bytes sizes them by m) and the prologue kept the gain row beside x.
STAGED_CONFIG = {"int8": (8, 2, 4, 2), "fp8": (8, 2, 4, 2), "int4": (8, 2, 2, 4)}
# Warps per SM of the persistent grid (blocks: this over the block's warps, as many as fit):
# three blocks of 8 warps, six of 4. A block per tile instead (so the next GEMV's blocks
# could take an SM as this one's retire) made the decode step slower (H200, batch 1, two
# alternating rounds, ms): Llama-2-7B int8 2.06 -> 2.45, int4 1.65 -> 2.19; TinyLlama
# int8 0.68 -> 0.71, int4 0.56 -> 0.58. Nor did a QKV grid two blocks short of that on 8 or
# 16 SMs, so the decode attention's 32 blocks could start beside it there (Llama-2-7B int8,
# where the attention's own time is 5.0 us a layer against bf16's 3.3): 2.034-2.040 ->
# 2.118-2.122 ms (two alternating rounds).
STAGED_EARLY_WARPS_PER_SM = 24
# Per K (H200, batch 1, w_early; a sweep of 8 geometries per format, then the bench at
# 6b8281a against h200-quant.json at 50793d0, us): int8 at K = 2048 on (4, 2, 4, 2), six
# blocks an SM: [11264 x 2048] 8.14 / 8.36 against 9.30 / 9.56, [2560 x 2048] 3.89 / 4.01
# against 4.02 / 4.21 ([2048 x 2048] 3.60 against 3.35; at K = 4096 and up it lost:
# [4096 x 11008] 15.25 against 13.84). Asymmetric int4 with 4 chunks a stage and 2 stages
# where that leaves no more of the warps' stages empty than 2 (K = 4096, 11008; not 2048
# or 5632, where it lost 20-50%): [12288 x 4096] 12.09 against 12.50, [4096 x 11008]
# 11.24 against 12.10, [22016 x 4096] 21.18 against 21.00. Symmetric int4 gained nothing
# from it ((8, 2, 4, 3): 11.40 / 18.37 / 11.47 against 11.22 / 18.72 / 10.68).
SMALL_K_INT8 = 2048
# Wide rows (K past this, one row of x): int8 and fp8 take five 16 KB stages a block (2
# chunks a warp) instead of two of 32 KB, so four of them (64 KB, not 32) are in flight before
# the predecessor wait, in the same blocks an SM. The Llama-2-7B down projection [4096 x
# 11008] is one 176 KB tile a block. H200, batch-1 decode step, A/B in one process, the
# better of two (ms, default -> wide): int8 2.133 -> 2.086 and 2.128 -> 2.099, fp8 2.077 ->
# 2.037 and 2.060 -> 2.052; four such stages 2.089 / 2.047, six (one block an SM) 2.169 /
# 2.105, two or three of 16 KB 2.18-2.22. Four stages at K = 4096 lost at gate|up (int8
# 2.196 against 2.133) and the output projection (2.173).
WIDE_K = 8192
WIDE_STAGES = (2, 5)  # (chunks per stage, stages per warp)
# 16-byte pieces of the RMSNorm gain a lane of the staged kernel loads at once (PGK_QGB), per
# format: only what ptxas makes of the kernel differs (K = 4096 over 8 warps is 2 pieces a
# lane either way). H200, NVRTC 13.0, batch 1, early loads, the gain before the wait, us at
# QKV / gate|up with SwiGLU / LM head (quant_fused, one interleaved run): int8 with 2
# (80 registers, three blocks an SM) 16.28 / 26.32 / 37.51 against 4 (128 registers and
# 24-40 bytes of spills, two) 17.55 / 29.34 / 42.20; fp8 b128 with 4 (122 registers)
# 16.48 / 29.12 / 41.00 against 2 (85, and 80 with 16 bytes of spills at gate|up) 16.90 /
# 31.23 / 42.17; int4 g128 with 4 (127, 123) 11.62 / 18.98 / 26.15 against 2 (64 and
# 8-24 bytes of spills) 13.15 / 21.61 / 29.64.
GAIN_BATCH = {"int8": 2, "fp8": 4, "int4": 4}
# Under f16 products (half_mma) the gain batch is 2 for int8 and fp8 alike: fp8 b128 with 4
# took 41.06 / 17.10 / 28.55 us at the 7B LM head / QKV and TinyLlama LM head, with 2
# 32.74 / 13.82 / 18.34 (H200, one interleaved run).
F16_GAIN_BATCH = 2


def default_gain_batch(spec: QuantSpec, f16: bool) -> int:
    """The staged RMSNorm prologue's gain batch by default: F16_GAIN_BATCH under f16
    products, else the format's GAIN_BATCH."""
    return F16_GAIN_BATCH if f16 else GAIN_BATCH[spec.format]


# Registers are allocated to a warp in units of this many; an SM holds 64 Ki of them and
# reserves 1 KiB of shared memory per block.
REG_UNIT = 256
SM_REGS = 65536
BLOCK_SMEM_RESERVED = 1024


def row_groups(m: int, per_launch: int = QUANT_ROWS) -> list[tuple[int, int]] | None:
    """(first row, rows) of each GEMV launch for m rows of x, as even as per_launch rows a
    launch allow; None past MAX_ROW_GROUPS launches (the scratch-weight path is then the
    cheaper)."""
    g = -(-m // per_launch)
    if m < 1 or g > MAX_ROW_GROUPS:
        return None
    base, extra = divmod(m, g)  # the first `extra` groups take one row more
    return [(i * base + min(i, extra), base + (i < extra)) for i in range(g)]


# int8 at this K and up to this N with one row of x (the Llama-2-7B output projection,
# [4096 x 4096]: its 256 tiles a block each) on four warps of four stages (TILE_BLOCK_INT8):
# the same shared memory as the default's eight warps of two stages, each warp's range of
# K (twice as long) still all in flight before the predecessor wait, but blocks of 128
# threads, half the registers, that fit beside the decode attention's. H200, the 7B
# batch-1 decode step (separate processes, two alternating rounds each, ms): int8 2.056 /
# 2.059 / 2.061 / 2.070 -> 2.031 / 2.033 / 2.031 / 2.034; slower for fp8 (1.983-1.986 ->
# 2.055-2.057) and int4 (1.641-1.643 -> 1.660-1.661), which keep their geometry.
TILE_BLOCK_INT8_K = 4096
TILE_BLOCK_INT8_MAX_N = 4096
TILE_BLOCK_INT8 = (4, 2, 4, 4)


def staged_config(spec: QuantSpec, k: int, m: int = 1, n: int = 0) -> tuple[int, int, int, int]:
    """The staged kernel's default (warps, n8 tiles per warp, chunks per stage, stages per
    warp) for this weight, K, m rows of x and N outputs (0: not known): the format's
    STAGED_CONFIG, or where the H200 sweeps found better (see SMALL_K_INT8, WIDE_K,
    TILE_BLOCK_INT8)."""
    gw, nt, u, ns = STAGED_CONFIG[spec.format]
    if spec.format == "int8" and k <= SMALL_K_INT8:
        return (4, 2, 4, 2)
    if (spec.format == "int8" and k == TILE_BLOCK_INT8_K and m == 1
            and 0 < n <= TILE_BLOCK_INT8_MAX_N):  # fmt: skip
        return TILE_BLOCK_INT8
    if spec.format in ("int8", "fp8") and k > WIDE_K and m == 1:
        return (gw, nt, *WIDE_STAGES)
    if spec.format == "int4" and spec.has_zero:
        per_warp = cdiv(cdiv(k, chunk_cols(spec)), gw)  # chunks of a warp's range
        if cdiv(per_warp, 4) * 4 <= cdiv(per_warp, u) * u:
            return (gw, nt, 4, 2)
    return (gw, nt, u, ns)


# Symmetric int4 under bf16 x at this K and N multiplies the biased codes (biased_codes). H200,
# batch 1, early loads, us against main's kernel in one run (q4gemv8): [22016 x 4096] 17.76
# against 18.43, [12288 x 4096] 11.09 against 10.96 (q4gemv6's run: 16.86 / 18.25 and
# 10.87 / 11.43); slower at K = 5632 (4.68 / 4.27) and 11008 (11.91 / 10.49), level at
# K = 2048 (the once-per-x pass sits before the first stage where a warp has few chunks).
BIASED_INT4_K = 4096
# ... and from this N: at N = 4096 (the Llama-2-7B output projection, a tile a block) the
# once-per-x pass is not paid back. H200, one interleaved run, us, biased / plain codes:
# [4096 x 4096] 5.54 / 5.02, with the residual 5.67 / 5.16; [12288 x 4096] with the RMSNorm
# prologue 11.42 / 12.32, [22016 x 4096] with SwiGLU 19.80 / 21.98. The 7B int4 decode step
# (A/B in one process, two rounds) 1.7025 / 1.7049 -> 1.6925 / 1.6915 ms.
BIASED_INT4_MIN_N = 8192


def biased_codes(spec: QuantSpec, dtype: str, k: int, n: int) -> bool:
    """Whether the staged int4 kernel multiplies the biased codes 128 + q (PGK_QBIAS: x
    permuted once in shared memory, (128 + z) times each chunk's sum of x taken off its
    partial sums in fp32): symmetric int4 under bf16 x at K = BIASED_INT4_K and N from
    BIASED_INT4_MIN_N, where the H200 A/B found it faster."""
    return (spec.format == "int4" and not spec.has_zero and dtype == "bfloat16"
            and k == BIASED_INT4_K and n >= BIASED_INT4_MIN_N)  # fmt: skip


# Symmetric int4 under bf16 x multiplies in f16 (half_mma) with the RMSNorm prologue, no
# SwiGLU, from this N: the LM heads. H200, one interleaved run, us, f16 products / the
# default (biased codes at K = 4096): [32000 x 2048] 14.70 / 16.76, [32000 x 4096] 25.39 /
# 26.14; elsewhere level or slower ([12288 x 4096] 11.68 / 11.42, [22016 x 4096] with SwiGLU
# 20.42 / 19.80, [2048 x 2048] with the residual 2.83 / 2.46: the once-per-x conversion),
# and asymmetric int4 slower with any fusion ([22016 x 4096] with SwiGLU 29.02 / 23.23).
# Decode step, A/B in one process, two rounds (ms): TinyLlama 0.5691 / 0.5662 -> 0.5641 /
# 0.5624, Llama-2-7B (with BIASED_INT4_MIN_N) 1.7025 / 1.7049 -> 1.6876 / 1.6884.
HALF_INT4_MIN_N = 16384
# Asymmetric int4 under bf16 x multiplies in f16 at K from 4096 to 8192 and N from 8192,
# its registers bounded to two blocks an SM (ASYM_F16_MIN_BLOCKS: unbounded, the prologue
# and SwiGLU kernels took 140 and held one). H200, one interleaved run, us, f16 bounded /
# the default: plain [12288 x 4096] 11.13 / 11.91, [22016 x 4096] 18.66 / 20.91, [32000 x
# 4096] 27.32 / 30.92; with the RMSNorm prologue 12.18 / 12.81 and 28.77 / 31.42, with
# SwiGLU 21.47 / 23.29; slower at N = 4096 (5.53 / 5.23: a tile a block) and at K = 2048
# (2-17%); [4096 x 11008] 10.99 / 11.20. Unbounded f16: 14.89 / 29.15 / 36.04 with the
# fusions; bounded to three blocks (80 registers, 24-56 bytes of spills) slower still.
HALF_INT4_ASYM_K = (4096, 8192)
HALF_INT4_ASYM_MIN_N = 8192
ASYM_F16_MIN_BLOCKS = 2


# int8 and fp8 take f16 products up to this many rows of x (half_max_rows). Turning x into
# f16 is a pass per row (its largest magnitude, then the scaled copy) before the first
# stage; past a few rows it costs more than the f16 pairs save. H200, early loads, us at 1 /
# 2 / 4 / 8 rows, f16 against bf16 products (one run): int8 [2560 x 2048] 3.59 / 4.65 / 6.65
# / 8.84 against 3.66 / 4.11 / 5.18 / 5.81, with the RMSNorm prologue 5.09 / 6.12 / 8.45 /
# 11.37 against 5.19 / 5.80 / 7.34 / 8.69; [2048 x 5632] 5.16 / 5.81 / 8.28 / 11.39 against
# 5.49 / 6.16 / 7.61 / 8.40; fp8 b128 [11264 x 2048] 6.98 / 7.68 / 9.72 / 12.44 against
# 8.99 / 9.01 / 9.94 / 10.75; at the Llama-2-7B shapes level at 8 rows (int8 [12288 x 4096]
# 19.92 against 19.87, with the prologue 23.81 against 22.18) and f16 ahead at 2 (14.56
# against 16.60). Decode step (ms, f16 up to 8 rows -> up to 3, separate processes, two
# rounds): TinyLlama int8 at 4 / 8 rows 1.055 -> 0.936, 1.274 -> 1.008, fp8 0.831 -> 0.740,
# 1.093 -> 0.880; Llama-2-7B int8 2.84 -> 2.75, 3.41 -> 3.23, fp8 at 8 rows 3.61 -> 3.42, but
# fp8 at 4 rows 2.57 -> 2.76, so fp8 at K from HALF_FP8_WIDE_K keeps f16 products to 4 rows.
# (int4's f16 forms keep them at any rows: not measured past one.)
HALF_MAX_ROWS = 3
HALF_FP8_WIDE_K = 4096
HALF_FP8_WIDE_ROWS = 4


def half_max_rows(spec: QuantSpec, k: int) -> int:
    """Rows of x up to which an int8 or fp8 weight takes f16 products (half_mma)."""
    if spec.format == "fp8" and k >= HALF_FP8_WIDE_K:
        return HALF_FP8_WIDE_ROWS
    return HALF_MAX_ROWS


def half_mma(spec: QuantSpec, dtype: str, n: int = 0, prologue: str = "none",
             glu: bool = False, k: int = 0, m: int = 1) -> bool:  # fmt: skip
    """Whether the staged kernel multiplies in f16 under bf16 x (PGK_QF16: x turned into
    f16 once in shared memory, times a power of two per row and warp) for m rows of x:
    int8 and fp8 up to half_max_rows rows, symmetric int4 at the LM heads
    (HALF_INT4_MIN_N: N, the RMSNorm prologue and no SwiGLU), asymmetric int4 at the K and
    N of HALF_INT4_ASYM_K and _MIN_N. The int8
    bytes become f16 pairs in half the instructions of bf16 pairs (ncu had the bf16
    form's kernel ALU-bound on PRMT), e4m3 pairs in one conversion (cvt.rn.f16x2.e4m3x2,
    SM 8.9+; four instructions a pair into bf16) and an int4 word in one shift instead of
    three (x permuted into its pair order on the way). H200, batch 1,
    early loads, us, bf16 products against f16 with the step's fusions
    (default_min_blocks, F16_GAIN_BATCH; one interleaved run each): int8 Llama-2-7B QKV
    16.19 -> 13.84, o 7.63 -> 5.84, gate|up 26.53 -> 24.70, down 14.47 -> 13.32, LM head
    37.61 -> 33.29; TinyLlama 4.97 -> 4.81, 3.81 -> 4.05, 9.02 -> 8.57, 5.70 -> 5.40,
    20.41 -> 18.30. fp8 b128, the same shapes: 16.66 -> 13.82, 6.77 -> 5.62, 29.91 ->
    25.29, 15.22 -> 12.66, 40.71 -> 32.74; 3.96 -> 3.93, 3.49 -> 3.49, 10.45 -> 8.54,
    5.88 -> 5.39, 23.57 -> 18.34; fp8 per row, the ten launches 154.0 -> 127.7. (fp8
    through f16 by the bit trick, its multiply by 2^8 moved to the partial sums, was 2-9%
    slower: one instruction a pair saved of four.)"""
    if dtype != "bfloat16":
        return False
    if spec.format == "int4" and spec.has_zero:
        lo, hi = HALF_INT4_ASYM_K
        return lo <= k <= hi and n >= HALF_INT4_ASYM_MIN_N
    if spec.format == "int4":
        return n >= HALF_INT4_MIN_N and prologue != "none" and not glu
    return m <= half_max_rows(spec, k)


# int8 under f16 products multiplies the biased bytes 1152 + q (PGK_QB8: two PRMT a word of
# four weights instead of two PRMT and two HSUB2), 1152 times the warp's sums of x taken off
# its partial sums in fp32 once a tile: at wide rows (K past WIDE_K) only. H200, batch 1,
# early loads, the Llama-2-7B step's fusions, us, plain / biased (one interleaved run):
# down [4096 x 11008] 13.64 / 12.49, QKV 13.87 / 13.70, LM head 33.16 / 33.08, but o 5.88 /
# 6.09, gate|up with SwiGLU 24.39 / 25.60 (registers bounded), TinyLlama down 5.38 / 5.50.
# The 7B int8 decode step (separate processes, two rounds, two runs each, ms): biased
# everywhere 2.099 / 2.096 and 2.103 / 2.101 against 2.076 / 2.068 and 2.067 / 2.063;
# biased at the down projection only 2.034 / 2.031 and 2.036 / 2.035 against 2.072 / 2.066
# and 2.067 / 2.064 (at QKV and the LM heads as well: 2.033 / 2.033, 2.031 / 2.032).
BIASED_INT8 = True


def biased_bytes(spec: QuantSpec, f16: bool, k: int) -> bool:
    """Whether the staged kernel multiplies int8's biased bytes (PGK_QB8): int8 under f16
    products (half_mma) at K past WIDE_K, while BIASED_INT8."""
    return BIASED_INT8 and f16 and spec.format == "int8" and k > WIDE_K


def default_min_blocks(gw: int, staged: bool, f16: bool, glu: bool, fmt: str,
                       zero: bool = False) -> int:  # fmt: skip
    """Blocks an SM the kernel's registers are bounded to leave room for (0: none): the
    asymmetric int4 f16 kernel's ASYM_F16_MIN_BLOCKS, and the int8 f16 kernel's
    persistent grid (STAGED_EARLY_WARPS_PER_SM) with the SwiGLU epilogue
    (fp8's f16 SwiGLU launches run unbounded: bounded, the 7B gate|up took 28.39 against
    25.62 us with b128 scales, 27.58 against 23.10 per row; H200, one interleaved run).
    Unbounded, the f16 kernel takes 102-143 registers (ptxas, NVRTC 13.0), a block an SM
    fewer than its shared memory allows; bounded (80, 16-40 bytes of stack) it was faster
    only with the SwiGLU epilogue. H200, batch 1, early loads, us, bf16 products / f16 /
    f16 bounded (one interleaved run): [11264 x 2048] SwiGLU 9.02 / 10.02 / 8.57,
    [22016 x 4096] 26.53 / 25.10 / 24.70; plain [12288 x 4096] 15.86 / 12.87 / 13.32,
    [4096 x 4096] 7.41 / 5.41 / 6.58, [32000 x 4096] 36.48 / 32.06 / 33.63. Under f16 the
    gain batch stays GAIN_BATCH's 2 (1 or 4, bounded or not: 0.3-9 us slower at the 7B
    RMSNorm launches, one interleaved run). A bounded kernel keeps one partial-sum buffer
    (red_buffers). The Llama-2-7B int8 QKV launch bounded (80 registers) on two blocks an SM,
    so the decode attention's blocks could wait beside it, made the step slower: 2.048-2.057
    -> 2.184-2.193 ms (on three bounded blocks 2.061-2.064; two alternating rounds)."""
    if staged and f16 and fmt == "int4" and zero:
        return ASYM_F16_MIN_BLOCKS
    bounded = staged and f16 and glu and fmt == "int8"
    return STAGED_EARLY_WARPS_PER_SM // gw if bounded else 0


def words_per_lane(spec: QuantSpec) -> int:
    """32-bit words of W a lane loads per chunk: 16 bytes, or 8 for int4 groups of 64 (a
    chunk must not span two groups)."""
    return 2 if spec.format == "int4" and spec.group < 128 else 4


def chunk_cols(spec: QuantSpec) -> int:
    """K columns of one chunk (four lanes' loads of one row)."""
    per_word = 8 if spec.format == "int4" else 4
    return 4 * per_word * words_per_lane(spec)


def supported(spec: QuantSpec, k: int) -> bool:
    """Whether the GEMV takes this weight: the chunk divides the group (int4, groups of 64
    or any multiple of 128) and whole 16-byte runs of each row (8-bit formats: K % 16 == 0)."""
    if spec.format == "int4":
        return spec.group % chunk_cols(spec) == 0 and k % spec.group == 0
    return k % 16 == 0 and (not spec.block or spec.block % chunk_cols(spec) == 0)


def epilogue_early(spec: QuantSpec) -> bool:
    """Whether the epilogue's row scale, bias and residual load as each tile starts rather
    than after the block's barrier (PGK_QEPRE): int8 only. H100, batch 1, w_early, one A/B
    in one run (q4gemv7): int8 at the TinyLlama shapes 3.93 -> 3.72, 3.64 -> 3.36, 9.20 ->
    8.56, 6.91 -> 6.67 us, at the Llama-2-7B shapes within 1.2% either way; fp8 (17.10 ->
    18.12 at [12288 x 4096]) and int4 (2-6%, which has no row scale) slower."""
    return spec.format == "int8"


def defines(spec: QuantSpec, dtype: str, scale_numel: int) -> dict[str, object]:
    """The format's macros of gemv_quant.cuh."""
    return {
        **loader.type_defines(dtype),
        "PGK_QFMT": FORMATS[spec.format],
        "PGK_QSK": int(spec.format == "int4" or bool(spec.block)),
        "PGK_QTENSOR": int(spec.format == "fp8" and not spec.block and scale_numel == 1),
        "PGK_QGROUP": spec.group if spec.format == "int4" else (spec.block or FP8_BLOCK),
        "PGK_QZERO": int(spec.has_zero),
        "PGK_QLW": words_per_lane(spec),
        "PGK_QEPRE": int(epilogue_early(spec)),
    }


def scale_ld(spec: QuantSpec, k: int) -> int:
    """Scales per row of the scale array (groups or blocks along K; 1 otherwise)."""
    if spec.format == "int4":
        return k // spec.group
    return cdiv(k, spec.block) if spec.block else 1


def stage_bytes(spec: QuantSpec, nt: int, u: int) -> int:
    """Shared memory of one warp's stage: 8 * nt rows of u 64-byte chunks of W, with
    grouped scales the rows' scale of each chunk, with zero points each lane's own."""
    grouped = spec.format == "int4" or bool(spec.block)
    b = 8 * nt * 64 * u + (4 * 8 * nt * u if grouped else 0) + (32 * nt * u if spec.has_zero else 0)
    return cdiv(b, 16) * 16


# Buffers of the staged kernel's partial sums (PGK_QREDB): with two, a tile's epilogue has
# one barrier, not two, and the block's tiles rotate its output threads over the warps (the
# others go on to the next tile's loads and MMAs meanwhile). H200, batch 1, early loads, the
# Llama-2-7B decode step's fusions, us, one buffer / two (one interleaved run): QKV int8
# 13.83 / 13.00, fp8 b128 13.63 / 13.14, int4 11.42 / 11.10; gate|up fp8 23.78 / 22.64,
# int4 19.45 / 18.68; LM head int8 32.83 / 32.05, fp8 32.73 / 31.46, int4 25.52 / 24.82;
# the launches of a tile a block (o, down) and TinyLlama's within 2-3% either way; the
# Llama-2-7B decode step (A/B in separate processes, two rounds each in two runs, ms) fp8
# 2.015 / 2.019 -> 1.931 / 1.928 and 2.020 / 2.037 -> 1.942 / 1.944, int4 1.685 / 1.679 ->
# 1.643 / 1.645 and 1.686 / 1.681 -> 1.643 / 1.640; int8 keeps one (red_buffers).
STAGED_RED_BUFFERS = 2


def red_buffers(fmt: str, min_blocks: int) -> int:
    """Partial-sum buffers of a staged launch: STAGED_RED_BUFFERS, or one for int8 and
    where the registers are bounded (min_blocks). H200, Llama-2-7B int8 decode step, one
    buffer / two (two rounds each): 1.994 / 1.994 against 2.016 / 2.016 ms, the SwiGLU
    kernel bounded either way (bounded to 80 registers it spilled 24 bytes a thread with
    two: [22016 x 4096] 26.47 us against 24.32; unbounded with two 22.70 alone, but the
    step 2.019 / 2.023 ms against 1.977 / 1.980)."""
    return 1 if min_blocks or fmt == "int8" else STAGED_RED_BUFFERS


def red_bytes(gw: int, nt: int, m: int, buffers: int = 1) -> int:
    """Shared memory of the warps' partial sums of the m rows (8 * nt outputs each, padded
    by one) in `buffers` buffers, at the end of the kernel's dynamic shared memory."""
    return cdiv(buffers * gw * m * (8 * nt + 1) * 4, 16) * 16


def xsum_bytes(gw: int, k: int, m: int, spec: QuantSpec) -> int:
    """Shared memory of the biased int4 kernel's sums of x per chunk of each warp's range
    and row (after the partial sums)."""
    return gw * cdiv(cdiv(k, chunk_cols(spec)), gw) * m * 4


def staged_smem(spec: QuantSpec, config: tuple[int, int, int, int], k: int, m: int,
                biased: bool = False, buffers: int = STAGED_RED_BUFFERS) -> int:  # fmt: skip
    """Dynamic shared memory of the staged kernel: each warp's stages, then the m rows of
    x, each all of K (in whole chunks) plus 8, then the partial sums (red_bytes) and, with
    biased int4 codes, the sums of x (xsum_bytes). The RMSNorm prologue needs none more:
    the gain is read once, as x is scaled in place."""
    gw, nt, u, stages = config
    x_row = (cdiv(k, chunk_cols(spec)) * chunk_cols(spec) + 8) * 2
    xsum = xsum_bytes(gw, k, m, spec) if biased else 0
    red = red_bytes(gw, nt, m, buffers)
    return gw * stages * stage_bytes(spec, nt, u) + m * x_row + red + xsum


def static_smem(gw: int, mx: int = 1) -> int:
    """The kernel's static shared memory: the warps' sums of squares (RMSNorm prologue) of
    8 * mx rows."""
    return gw * 8 * mx * 4


def wide_rows_config(spec: QuantSpec, k: int, dtype: str, n: int = 0
                     ) -> tuple[int, int, int, int] | None:  # fmt: skip
    """The staged geometry one launch of WIDE_ROWS rows of x (PGK_QMX 2, bf16 products)
    takes: staged_config's, or with WIDE_ROWS_STAGES stages (then also four warps) where
    its own leave no room for the rows of x in shared memory; None where none fits."""
    if words_per_lane(spec) != 4:
        return None
    gw, nt, u, ns = staged_config(spec, k, WIDE_ROWS)
    biased = biased_codes(spec, dtype, k, n)
    buffers = red_buffers(spec.format, 0)
    few = min(ns, WIDE_ROWS_STAGES)
    for cfg in ((gw, nt, u, ns), (gw, nt, u, few), (min(gw, 4), nt, u, few)):
        smem = staged_smem(spec, cfg, k, WIDE_ROWS, biased, buffers) + static_smem(cfg[0], 2)
        if smem <= loader.max_shared_optin():
            return cfg
    return None


def rows_a_launch(spec: QuantSpec, k: int, dtype: str, m: int, n: int = 0) -> int:
    """Rows of x a launch takes for m rows: all of 9-16 rows in one where they fit
    (wide_rows_config has a geometry), else QUANT_ROWS (more rows keep the launches of 8
    they were measured with: MAX_ROW_GROUPS)."""
    if QUANT_ROWS < m <= WIDE_ROWS and wide_rows_config(spec, k, dtype, n) is not None:
        return WIDE_ROWS
    return QUANT_ROWS


def resident_blocks(num_regs: int, static_bytes: int, threads: int, smem: int,
                    smem_per_sm: int) -> int:  # fmt: skip
    """Blocks of a kernel one SM holds at once, by its shared memory (dynamic smem plus
    static_bytes, and the per-block reserve) and its registers (num_regs a thread)."""
    by_smem = smem_per_sm // (smem + static_bytes + BLOCK_SMEM_RESERVED)
    per_warp = cdiv(num_regs * 32, REG_UNIT) * REG_UNIT
    by_regs = SM_REGS // (cdiv(threads, 32) * per_warp) if num_regs else by_smem
    return min(by_smem, by_regs)


def gemv_quant(
    x: int,
    w: int,
    scale: int,
    y: int,
    spec: QuantSpec,
    n: int,
    k: int,
    dtype: str,
    *,
    scale_numel: int,
    zero: int = 0,
    m: int = 1,
    bias: int = 0,
    activation: str = "none",
    x_stride: int | None = None,
    y_stride: int | None = None,
    config: tuple[int, int] | None = None,
    slab: int | None = None,
    prologue: str = "none",
    pro: int = 0,
    eps: float = 0.0,
    residual: int = 0,
    residual_stride: int | None = None,
    glu: bool = False,
    blocks_per_sm: int | None = None,
    w_early: bool = False,
    pipe: bool | None = None,
    stages: int | None = None,
    biased: bool | None = None,
    pro_early: bool = False,
    gain_batch: int | None = None,
    f16: bool | None = None,
    min_blocks: int | None = None,
    stream: Any = None,
) -> None:
    """y[i, :] = act(dequantize(W) @ p(x[i, :]) + bias) + residual[i, :] for i < m <= 8
    (16 on the staged path under bf16 products: rows_a_launch);
    W's data [n, packed k] dense at `w`, its float32 scales at `scale` (scale_numel of
    them), int4 zero points at `zero`. bf16/f16 x with 16-byte aligned rows; prologue,
    glu, blocks_per_sm and w_early as gemv.gemv. stages: W's stages per warp through
    shared memory (None: staged_config's where the kernel takes the weight and
    x fits beside the stages, else 0; 0: fragments straight into registers). config:
    (warps, n8 tiles per warp); slab: chunks per warp per stage (staged: default from
    staged_config; a power of two >= 2) or per step (registers: default from K); pipe
    (registers): the next slab's loads in flight while the current one is multiplied
    (PGK_QPIPE). config and pipe default to the format's FORMAT_CONFIG. biased (staged int4,
    bf16 x): multiply the biased codes (None: biased_codes). pro_early (staged path, with
    w_early and the RMSNorm prologue): the gain is read-only too, so each lane's first
    batch of it loads before the predecessor wait. gain_batch: 16-byte pieces of the gain
    a lane loads at once (PGK_QGB; None: default_gain_batch). f16 (staged, bf16 x; not
    with biased): multiply in f16 (None: half_mma). min_blocks: blocks an SM the kernel's
    registers must leave room for (PGK_QMINB; None: default_min_blocks; 0: no bound)."""
    loader.check_dtype(dtype, loader.HALF_DTYPES, "gemv_quant")
    positive("gemv_quant", n=n, k=k, m=m)
    int32_range("gemv_quant", n=n, k=k, m=m)
    if activation not in gemv.ACTS or prologue not in gemv.PROLOGUES:
        raise ShapeError(f"gemv_quant: unknown activation {activation!r} or prologue "
                         f"{prologue!r}")  # fmt: skip
    if m > WIDE_ROWS:
        raise ShapeError(f"gemv_quant: m={m} rows (the GEMV takes up to {WIDE_ROWS})")
    mx = 2 if m > QUANT_ROWS else 1
    if not supported(spec, k):
        raise ShapeError(f"gemv_quant: a {spec.label} weight with K={k} (chunks of "
                         f"{chunk_cols(spec)} columns must fit its groups and rows)")  # fmt: skip
    if glu and (n % 2 or activation != "none"):
        raise ShapeError(f"gemv_quant: the SwiGLU epilogue needs an even N (got {n}) and no "
                         f"activation (got {activation!r})")  # fmt: skip
    xs = k if x_stride is None else x_stride
    n_out = n // 2 if glu else n
    ys = n_out if y_stride is None else y_stride
    rs = n_out if residual_stride is None else residual_stride
    ptrs = (x, w) + ((pro,) if prologue != "none" else ())
    if any(p % 16 for p in ptrs) or (m > 1 and xs % 8):
        raise ShapeError("gemv_quant: x, W and the gain must be 16-byte aligned rows")
    sgw, snt, su, sns = staged_config(spec, k, m, n)
    wide_cfg = wide_rows_config(spec, k, dtype, n) if mx == 2 else None
    if wide_cfg is not None:
        sgw, snt, su, sns = wide_cfg
    if f16 and dtype != "bfloat16":
        raise ShapeError(f"gemv_quant: f16 products for a {spec.label} weight under {dtype} "
                         f"(bfloat16 x only: f16 x multiplies in f16 as it is)")  # fmt: skip
    # Asymmetric int4's biased form carries (128 + z) times x's sums in fp32: its error
    # reached 1.08e-3 against float64 with the SwiGLU epilogue (H200), over the kernels' 1e-3.
    if biased and (spec.format != "int4" or spec.has_zero or dtype != "bfloat16"):
        raise ShapeError(f"gemv_quant: biased codes for a {spec.label} weight under {dtype} "
                         f"(symmetric int4 under bfloat16 only)")  # fmt: skip
    if biased and f16:
        raise ShapeError(f"gemv_quant: biased codes and f16 products for a {spec.label} weight "
                         f"(one or the other)")  # fmt: skip
    if mx == 2 and (f16 or stages == 0):
        raise ShapeError(f"gemv_quant: {m} rows of x take the staged kernel under bf16 "
                         f"products (up to {QUANT_ROWS} rows otherwise)")  # fmt: skip
    if f16 is None:
        f16 = mx == 1 and not biased and half_mma(spec, dtype, n, prologue, glu, k, m)
    if biased is None:
        biased = not f16 and biased_codes(spec, dtype, k, n)
    if stages is None:
        cfg = (*(config or (sgw, snt)), slab or su, sns)
        fits = staged_smem(spec, cfg, k, m, biased) + static_smem(cfg[0], mx)
        stages = sns if words_per_lane(spec) == 4 and fits <= loader.max_shared_optin() else 0
        if mx == 2 and not stages:
            raise ShapeError(f"gemv_quant: {m} rows of x of K={k} do not fit in shared "
                             f"memory beside a {spec.label} weight's stages")  # fmt: skip
    biased = biased and bool(stages)
    f16 = f16 and bool(stages)
    if stages:
        gw, nt = config or (sgw, snt)
        u = slab or su
        if words_per_lane(spec) != 4 or u < 2 or u & (u - 1):
            raise ShapeError(f"gemv_quant: {stages} stages of {u} chunks for a {spec.label} "
                             f"weight (staging takes 16-byte chunks, 2+ a stage)")  # fmt: skip
        pipe = False
    else:
        fgw, fnt, fpipe = FORMAT_CONFIG[spec.format]
        gw, nt = config or (fgw, fnt)
        pipe = fpipe if pipe is None else pipe
        nch = cdiv(k, chunk_cols(spec))
        u = slab or min(MAX_SLAB, pow2_at_least(cdiv(nch, gw)))
    if min_blocks is None:
        min_blocks = default_min_blocks(gw, bool(stages), f16, glu, spec.format, spec.has_zero)
    buffers = red_buffers(spec.format, min_blocks) if stages else 1
    if stages:
        smem = staged_smem(spec, (gw, nt, u, stages), k, m, biased, buffers)
        if smem + static_smem(gw, mx) > loader.max_shared_optin():
            raise ShapeError(f"gemv_quant: {stages} stages of ({gw}, {nt}, {u}) with {m} rows "
                             f"of K={k} need {smem} bytes of shared memory")  # fmt: skip
    else:
        smem = red_bytes(gw, nt, m)
    d = {**defines(spec, dtype, scale_numel), "PGK_GW": gw, "PGK_NT": nt, "PGK_U": u,
         "PGK_ACT": gemv.ACTS[activation], "PGK_PRO": gemv.PROLOGUES[prologue],
         "PGK_GLU": int(glu), "PGK_QPIPE": int(pipe), "PGK_QSTAGES": stages}  # fmt: skip
    if stages and buffers != 2:  # the template's default
        d["PGK_QREDB"] = buffers
    staged_pro = bool(stages) and prologue != "none"
    if staged_pro:
        gb = default_gain_batch(spec, f16) if gain_batch is None else gain_batch
        if gb < 1:
            raise ShapeError(f"gemv_quant: a gain batch of {gb} pieces (1 or more)")
        d["PGK_QGB"] = gb
    if biased:
        d["PGK_QBIAS"] = 1
    if f16:
        d["PGK_QF16"] = 1
    if biased_bytes(spec, f16, k):
        d["PGK_QB8"] = 1
    if min_blocks:
        d["PGK_QMINB"] = min_blocks
    if mx == 2:
        d["PGK_QMX"] = 2
    fn = loader.get_kernel("gemv_quant", "pgk_gemv_quant", d)
    fn.set_dynamic_smem(smem)
    tiles = gemv.mma_tiles(n, nt, glu)
    per_sm = blocks_per_sm
    if per_sm is None:
        per_sm = EARLY_BLOCKS_PER_SM
        if stages:
            per_sm = max(1, STAGED_EARLY_WARPS_PER_SM // gw)
        per_sm = per_sm if w_early else 0
        if per_sm and stages:
            # A persistent block that is not resident runs in a second wave: its tiles wait
            # for a whole block's worth of others (K = 11008 leaves room for fewer blocks).
            fit = resident_blocks(fn.fn.num_regs, fn.fn.shared_bytes, gw * 32, smem,
                                  toolchain.device_info()["max_shared_per_sm"])  # fmt: skip
            per_sm = max(1, min(per_sm, fit))
    grid_x = min(tiles, per_sm * toolchain.sm_count()) if per_sm else tiles
    row_bytes = k // 2 if spec.format == "int4" else k
    fn.launch(
        (grid_x, 1),
        (gw * 32,),
        (
            x,
            w,
            scale,
            zero,
            bias,
            y,
            m,
            n,
            k,
            xs,
            row_bytes,
            ys,
            scale_ld(spec, k),
            residual,
            pro,
            rs,
            eps,
            int(w_early) | (2 if w_early and pro_early and staged_pro else 0),
        ),
        smem,
        stream,
    )
