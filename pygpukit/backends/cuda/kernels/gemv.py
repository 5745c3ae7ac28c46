"""Launcher for gemv.cuh: y = act(x @ W^T + bias) for a few rows of x, W [N, K] row-major."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from .. import toolchain
from . import loader
from ._common import cdiv, int32_range, positive

DTYPES = ("float32", "float16", "bfloat16")
WARPS = 8
# Rows of x one tensor-core launch covers (the mma tile's M); routing sends M <= this here.
MMA_ROWS = 16
ACTS = {"none": 0, "gelu_tanh": 1, "gelu_erf": 2, "silu": 3}
PROLOGUES = {"none": 0, "rms_norm": 1}
# Tensor-core geometry: (warps splitting K, n8 tiles per warp, 32-column chunks per slab,
# cp.async stages per warp; 0 stages loads fragments straight from global memory).
# H200 at M = 1 (h200-2026-11-22-kernels.json, in git history; us for 4096x4096 / 5632x2048 /
# 2048x5632): 4x1x8x2 11.0 / 8.8 / 8.6, 8x1x8x2 11.5 / 10.9 / 8.3, 8x2x4x2 10.4 / 9.4 / 8.5,
# unstaged 8x1x8x0 13.5 / 11.7 / 15.3. Up to MMA_STAGED_ROWS rows of x the staged kernel
# serves; above, each warp's slab would carry more x than W (16 rows: 2x slower), so the
# unstaged one does.
MMA_CONFIG = (4, 1, 8, 2)
MMA_CONFIG_MANY_ROWS = (8, 1, 8, 0)
MMA_STAGED_ROWS = 4
# Batch-1 decode shapes, swept on an H200 (h200-2026-11-22-gemv-sweep.json in git history,
# us): long rows over many outputs share each x fragment over two n8 tiles (4096x4096:
# 8x2x4x2 9.97 against 11.6-12.3); long rows over few outputs keep 132 SMs busy with one
# (2048x5632: 8x1x8x2 7.9 against 8.7-8.9 with two tiles); short rows over many outputs
# take three shallower stages (11264x2048 14.3 against 14.7, 5632x2048 8.3 against 8.9-9.1).
# With the RMSNorm prologue (scripts/gemv_probe.py, in git history): many outputs take
# two tiles (the LM head 36.1 us against 40.9), few outputs three shallow stages (the
# 2048 -> 2560 QKV projection 5.9 against 7.3 for MMA_CONFIG).
MMA_CONFIG_LONG_K = (8, 2, 4, 2)
MMA_CONFIG_LONG_K_FEW_N = (8, 1, 8, 2)
MMA_CONFIG_MANY_N = (8, 1, 4, 3)
# One row of x (batch-1 decode), swept again on an H200 at fe3b0bd (h200-2026-11-23-kernels.json in
# git history, us, each shape timed twice): long rows over few outputs take three shallow stages
# (2048x5632, the MLP down projection: 8x1x4x3 7.71/7.73 against 8x1x8x2 8.31/8.31), short rows
# over at most 2048 outputs eight warps (2048x2048, the attention output projection: 8x1x8x2 4.18
# against 4x1x8x2 4.79).
MMA_CONFIG_LONG_K_FEW_N_M1 = MMA_CONFIG_MANY_N
MMA_CONFIG_FEW_N_M1 = MMA_CONFIG_LONG_K_FEW_N
FEW_N = 2048
MMA_CONFIG_PRO_MANY_N = MMA_CONFIG_LONG_K
MMA_CONFIG_PRO = MMA_CONFIG_MANY_N
LONG_K = 4096
MANY_N = 4096
# Blocks per SM of the staged kernel's persistent grid (0: one block per tile).
PERSIST_BLOCKS_PER_SM = 0
# With W read before the predecessor wait (w_early), as in a decode step's CUDA graph: a
# persistent grid of two blocks per SM and these batch-1 geometries, from the 88-GEMV
# TinyLlama chain on an H200 (scripts/gemv_probe.py --combos, in git history; us per chain:
# 828 for the geometries above without early loads, 599/605 with these; one block per SM 1069-1127).
EARLY_BLOCKS_PER_SM = 2
# Slabs per warp the staged kernel hints into L2 before its loop (gemv.cuh's PGK_PF): none.
# H200 (scripts/gemv_pf_probe.py in git history, us at depth 0/1/2, without and with early loads):
# 2048 -> 11264 14.3/15.1/17.0 and 12.1/12.0/12.8, 2048 -> 32000 36.7/39.2/45.4 and
# 31.6/31.6/32.3, 4096^2 10.2/9.8/10.1 and 8.9/9.2/9.6; the TinyLlama chain 591/599/630.
STAGED_PREFETCH = 0
EARLY_CONFIG = (8, 2, 4, 2)  # the QKV projection (2048 -> 2560), wide rows of outputs
EARLY_CONFIG_FEW_N = (8, 1, 4, 3)  # at most 2048 outputs (the attention output, 2048^2)
EARLY_CONFIG_LONG_K_FEW_N = (8, 1, 8, 2)  # the MLP down projection (5632 -> 2048)


# Short rows over a middling count of outputs (2048 -> 5632, H200, w_early, us by blocks
# per SM 0/3/4): four warps of two tiles, three stages, one block per tile 6.26/6.26/6.25,
# against 7.5-8.0 for the wide geometry on two blocks per SM (the tiles, 352, then leave a
# third of the blocks a second one).
EARLY_CONFIG_MID_N = (4, 2, 4, 3)
MID_N = 8192


def early_config(x_rows: int, k: int, n: int, glu: bool) -> tuple[int, int, int, int]:
    """The geometry with early weight loads (gemv's w_early), up to MMA_STAGED_ROWS rows."""
    if not glu and k < LONG_K and MANY_N < n <= MID_N:
        return EARLY_CONFIG_MID_N
    if glu or n > MANY_N:
        return MMA_CONFIG_GLU  # the gate/up projection and the LM head: two tiles a warp
    if k >= LONG_K:
        return EARLY_CONFIG_LONG_K_FEW_N if n < MANY_N else MMA_CONFIG_LONG_K
    return EARLY_CONFIG_FEW_N if n <= FEW_N else EARLY_CONFIG


def default_config(x_rows: int, k: int, n: int, glu: bool = False,
                   prologue: str = "none") -> tuple[int, int, int, int]:  # fmt: skip
    """The tensor-core geometry for x_rows rows of length k against n rows of W."""
    if glu:
        return MMA_CONFIG_GLU_MANY_ROWS if x_rows > MMA_STAGED_ROWS else MMA_CONFIG_GLU
    if x_rows > MMA_STAGED_ROWS:
        return MMA_CONFIG_MANY_ROWS
    if k >= LONG_K:
        if n >= MANY_N:
            return MMA_CONFIG_LONG_K
        return MMA_CONFIG_LONG_K_FEW_N_M1 if x_rows == 1 else MMA_CONFIG_LONG_K_FEW_N
    if n > MANY_N:
        return MMA_CONFIG_PRO_MANY_N if prologue != "none" else MMA_CONFIG_MANY_N
    if prologue != "none":
        return MMA_CONFIG_PRO
    return MMA_CONFIG_FEW_N_M1 if x_rows == 1 and n <= FEW_N else MMA_CONFIG


# The SwiGLU epilogue pairs gate and up tiles, so its geometries have an even tile count;
# two tiles per warp also share each x fragment, which the 2048 -> 11264 gate/up
# projection with the RMSNorm prologue ran fastest with (gemv_probe, H200).
MMA_CONFIG_GLU = (8, 2, 4, 2)
MMA_CONFIG_GLU_MANY_ROWS = (8, 2, 4, 0)
DEFAULT_CONFIGS = tuple(dict.fromkeys((MMA_CONFIG, MMA_CONFIG_LONG_K, MMA_CONFIG_LONG_K_FEW_N,
                                        MMA_CONFIG_MANY_N, MMA_CONFIG_PRO_MANY_N,
                                        MMA_CONFIG_PRO, MMA_CONFIG_MANY_ROWS)))  # fmt: skip
GLU_CONFIGS = (MMA_CONFIG_GLU, MMA_CONFIG_GLU_MANY_ROWS)
EARLY_CONFIGS = tuple(dict.fromkeys((EARLY_CONFIG, EARLY_CONFIG_FEW_N, EARLY_CONFIG_LONG_K_FEW_N,
                                      MMA_CONFIG_LONG_K, EARLY_CONFIG_MID_N)))  # fmt: skip


def beats_gemm(m: int, n: int, k: int) -> bool:
    """Whether a plain linear/matmul of m rows should take the GEMV rather than cuBLASLt.

    From h200-2026-11-22-kernels.json (git history) (bf16, us, ours vs torch F.linear on
    cuBLASLt): M = 1 wins or ties up to N = 5632 (2048->2560 5.5 vs 6.4, 2048->2048 5.1 vs
    6.3, 5632->2048 8.6 vs 11.3, 4096->4096 11.0 vs 13.4, 2048->5632 8.8 vs 8.7) and trails
    slightly on wide short-K weights (2048->11264 14.2 vs 13.2, 2048->32000 33.6 vs 33.1);
    M = 4 wins only up to N = 2560 or K >= 4096 (2048->11264 19.5 vs 13.3); M = 16 trails
    everywhere (0.73-0.94x). Folded linears of up to MMA_STAGED_ROWS rows take the GEMV
    regardless: their prologue and residual would otherwise be kernels of their own."""
    if m == 1:
        return k >= 4096 or n <= 5632
    return m <= MMA_STAGED_ROWS and (k >= 4096 or n <= 2560)


def mma_smem(config: tuple[int, int, int, int], k: int, x_rows: int = 1,
             prologue: str = "none") -> int:  # fmt: skip
    """Dynamic shared memory of the tensor-core kernel: each warp's stages of 8 * NT rows
    of W (32 * U columns), then x_rows rows of x and (RMSNorm prologue) the gain row, each
    all of K (rounded up to 32 columns) plus 32."""
    gw, nt, u, stages = config
    rows = x_rows + (1 if prologue == "rms_norm" else 0)
    return (gw * stages * 8 * nt * 32 * u + rows * (cdiv(k, 32) * 32 + 32)) * 2


def mma_tiles(n: int, nt: int, glu: bool) -> int:
    """Tiles of the tensor-core kernel: 8 * nt rows of W each (SwiGLU: 4 * nt outputs)."""
    return cdiv(n // 2, 4 * nt) if glu else cdiv(n, 8 * nt)


def uses_mma(dtype: str, k: int, strides: tuple[int, ...], ptrs: tuple[int, ...]) -> bool:
    """Whether gemv() takes the tensor-core kernel: bf16/f16, K % 8 == 0, 16-byte aligned
    pointers of x and W and row strides (in elements) that keep every row aligned."""
    return (
        dtype in loader.HALF_DTYPES
        and k % 8 == 0
        and all(s % 8 == 0 for s in strides)
        and all(p % 16 == 0 for p in ptrs)
    )


def gemv(
    x: int,
    w: int,
    y: int,
    n: int,
    k: int,
    dtype: str,
    *,
    m: int = 1,
    bias: int = 0,
    activation: str = "none",
    x_stride: int | None = None,
    w_stride: int | None = None,
    y_stride: int | None = None,
    unroll: int = 4,
    config: tuple[int, int, int, int] | None = None,
    prologue: str = "none",
    pro: int = 0,
    eps: float = 0.0,
    residual: int = 0,
    residual_stride: int | None = None,
    prefetch: int | None = None,
    glu: bool = False,
    blocks_per_sm: int | None = None,
    w_early: bool = False,
    stream: Any = None,
) -> None:
    """y[i, :] = act(W @ p(x[i, :]) + bias) + residual[i, :] for i < m; strides in
    elements (default dense).

    bf16/f16 with 16-byte aligned rows run on tensor cores, W read once per 16 rows of x;
    otherwise one warp per output row. unroll: the fallback's 16-byte loads in flight per
    lane. config: MMA_CONFIG's geometry for the tensor-core kernel.
    prologue p (tensor cores only): "rms_norm" with the gain at `pro` (x / rms(x) * gain,
    eps). glu (tensor cores only): W's n rows are gate then up, and y[i, :] (n / 2 wide) is
    silu(gate) * up, the bias added to both before, the residual after.
    blocks_per_sm (staged tensor-core kernel): a persistent grid of that many blocks per SM
    walking the tiles (None: PERSIST_BLOCKS_PER_SM; 0: one block per tile). w_early: W may
    be read before the kernel waits for its predecessor (programmatic dependent launch):
    only where nothing launched before it can still be writing W (read-only weights in a
    captured graph)."""
    loader.check_dtype(dtype, DTYPES, "gemv")
    positive("gemv", n=n, k=k, m=m)
    int32_range("gemv", n=n, k=k, m=m)
    if activation not in ACTS:
        raise ShapeError(f"gemv: unknown activation {activation!r} ({', '.join(ACTS)})")
    xs = k if x_stride is None else x_stride
    ws = k if w_stride is None else w_stride
    n_out = n // 2 if glu else n
    ys = n_out if y_stride is None else y_stride
    if n == 0 or m == 0:
        return
    if prologue not in PROLOGUES:
        raise ShapeError(f"gemv: unknown prologue {prologue!r} ({', '.join(PROLOGUES)})")
    rs = n_out if residual_stride is None else residual_stride
    if glu and (n % 2 or activation != "none"):
        raise ShapeError(f"gemv: the SwiGLU epilogue needs an even N (got {n}) and no "
                         f"activation (got {activation!r})")  # fmt: skip
    act = ACTS[activation]
    pptrs = (pro,) if prologue != "none" else ()
    if uses_mma(dtype, k, (xs if m > 1 else 0, ws), (x, w, *pptrs)):
        x_rows = min(m, MMA_ROWS)
        early = w_early and x_rows <= MMA_STAGED_ROWS
        if config is None and early:
            cfg = early_config(x_rows, k, n, glu)
        else:
            cfg = config or default_config(x_rows, k, n, glu, prologue)
        gw, nt, u, stages = cfg
        if stages and u < 2:
            raise ShapeError(f"gemv: config {cfg} stages slabs of {u} chunk; staging needs 2+")
        if stages and x_rows > 8:
            raise ShapeError(f"gemv: config {cfg} stages x, which takes up to 8 rows (got {m})")
        if m > 16 * 65535:
            raise ShapeError(f"gemv: m={m} rows is a GEMM, not a GEMV")
        defines = {**loader.type_defines(dtype), "PGK_GW": gw, "PGK_NT": nt, "PGK_U": u,
                   "PGK_ACT": act, "PGK_PRO": PROLOGUES[prologue],
                   "PGK_GSTAGES": stages}  # fmt: skip
        if glu:
            defines["PGK_GLU"] = 1
        if prefetch is None and stages:
            prefetch = STAGED_PREFETCH
        if prefetch is not None:  # slabs per warp hinted into L2 before the loop (gemv.cuh)
            defines["PGK_PF"] = prefetch
        smem = mma_smem(cfg, k, x_rows, prologue) if stages else 0
        if smem > loader.max_shared_optin() and config is None:
            # Very long rows of x do not fit beside the stages: read x from global memory.
            cfg = (gw, nt, u, 0)
            stages = smem = 0
            defines["PGK_GSTAGES"] = 0
        if smem > loader.max_shared_optin():
            raise ShapeError(f"gemv: config {cfg} needs {smem} bytes of shared memory")
        fn = loader.get_kernel("gemv", "pgk_gemv_mma", defines)
        fn.set_dynamic_smem(smem)
        tiles = mma_tiles(n, nt, glu)
        per_sm = blocks_per_sm
        if per_sm is None:
            per_sm = PERSIST_BLOCKS_PER_SM
            if early and cfg != EARLY_CONFIG_MID_N:
                per_sm = EARLY_BLOCKS_PER_SM
        grid_x = min(tiles, per_sm * toolchain.sm_count()) if stages and per_sm else tiles
        fn.launch(
            (grid_x, cdiv(m, MMA_ROWS)),
            (gw * 32,),
            (x, w, bias, y, m, n, k, xs, ws, ys, residual, pro, rs, eps, x_rows, int(w_early)),
            smem,
            stream,  # the kernel waits on its predecessor (gemv.cuh)
        )
        return
    if prologue != "none" or residual or glu:
        raise ShapeError(
            f"gemv: a {prologue} prologue, a residual or the SwiGLU epilogue needs the "
            f"tensor-core kernel "
            f"(bf16/f16, K % 8 == 0, 16-byte aligned rows); got {dtype}, K={k}"
        )
    if m > 65535:
        raise ShapeError(f"gemv: m={m} rows is a GEMM, not a GEMV (limit 65535)")
    vec = loader.vec_width(dtype, xs, ws, ptrs=(x, w))
    defines = {
        **loader.type_defines(dtype),
        "PGK_VEC": vec,
        "PGK_WARPS": WARPS,
        "PGK_UNROLL": unroll,
        "PGK_ACT": act,
    }
    fn = loader.get_kernel("gemv", "pgk_gemv", defines)
    fn.launch(
        (cdiv(n, WARPS), m),
        (WARPS * 32,),
        (x, w, bias, y, n, k, xs, ws, ys),
        0,
        stream,
    )
