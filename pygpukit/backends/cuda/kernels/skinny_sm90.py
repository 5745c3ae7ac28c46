"""Launcher of skinny_sm90.cuh: y [M, N] = x [M, K] W^T (+ res), W [N, K] row-major, for a
few dozen token rows (batched decode) on Hopper (SM 9.0 only: wgmma and the bulk tensor copy
engine), bf16 / f16, with an optional SwiGLU epilogue (gate|up weight, y [M, N/2]). The
tensor maps of W and x are made here, where the pointers are known (a captured graph keeps
the maps it was captured with, as it keeps the pointers)."""

from __future__ import annotations

import functools
from typing import Any

from pygpukit import _native
from pygpukit.errors import ShapeError

from .. import toolchain
from . import loader
from ._common import cdiv

FAMILY = "skinny_sm90"
KERNEL = "pgk_skinny_sm90"
DTYPES = ("bfloat16", "float16")
MIN_ROWS, MAX_ROWS = 17, 128  # token rows it is built for (fewer: the GEMV)
_AB = {"bfloat16": "bf16", "float16": "f16"}
SM_SHARED = 228 * 1024  # shared memory of an SM 9.0 multiprocessor (blocks resident at once)

# (consumer warpgroups, stages, blocks an SM the split count aims at, cluster): cluster 1
# splits K over blocks reduced through an L2 workspace; 2, 4 or 8 splits K over the blocks
# of one cluster, reduced through distributed shared memory (blocks an SM then unused).
Config = tuple[int, int, int, int]
DEFAULT_CONFIG: Config = (1, 6, 2, 4)
CLUSTERS = (1, 2, 4, 8)


def token_cols(m: int) -> int:
    """The wgmma N a block computes for m token rows (PGK_SN)."""
    return 32 if m <= 32 else 64 if m <= 64 else 128


def defines(dtype: str, sn: int, wg: int, stages: int, glu: bool,
            cluster: int = 1) -> dict[str, Any]:  # fmt: skip
    """The template defines of one variant."""
    loader.check_dtype(dtype, DTYPES, "skinny_sm90")
    return {**loader.type_defines(dtype), "PGK_HAB": _AB[dtype], "PGK_SN": sn, "PGK_SWG": wg,
            "PGK_SSTAGES": stages, "PGK_SGLU": int(glu), "PGK_SCL": cluster}  # fmt: skip


def smem_bytes(sn: int, wg: int, stages: int) -> int:
    """Dynamic shared memory: the stages (64 W rows a warpgroup and sn x rows, 128 bytes
    each), 1 KB to align them to the swizzle."""
    return stages * (8192 * wg + 128 * sn) + 1024


def available() -> bool:
    """Whether this kernel can run here: an SM 9.0 device (its CUBIN is sm_90a)."""
    return tuple(toolchain.device_info()["compute_capability"]) == (9, 0)


def beats_lt(m: int, n: int, k: int, epilogue: str) -> bool:
    """Whether the planner takes this kernel over cuBLASLt for m token rows of an [n, k]
    weight with `epilogue` ("none", "residual" or "swiglu"). Provisional until measured."""
    return MIN_ROWS <= m <= MAX_ROWS


def tiles(n: int, wg: int, glu: bool) -> int:
    """Output column tiles: 64 W rows a warpgroup (SwiGLU: 64 outputs, gate and up rows)."""
    return cdiv(n // 2, 64) if glu else cdiv(n, 64 * wg)


def plan(m: int, n: int, k: int, glu: bool = False, config: Config | None = None
         ) -> tuple[int, int, int, int, int]:  # fmt: skip
    """(wg, stages, splits, tiles, cluster) of a launch. A cluster > 1 splits K into that
    many (fewer where K has fewer 64-column panels); otherwise the most splits whose grid
    fits in one wave of `blocks an SM` (fewer where shared memory holds fewer) x the SMs,
    each split keeping at least two panels."""
    wg, stages, per_sm, cluster = config or DEFAULT_CONFIG
    if glu:
        wg = 2
    t = tiles(n, wg, glu)
    panels = cdiv(k, 64)
    while cluster > panels:
        cluster //= 2
    if cluster > 1:
        return wg, stages, cluster, t, cluster
    resident = min(per_sm, max(1, SM_SHARED // smem_bytes(token_cols(m), wg, stages)))
    splits = max(1, min(resident * toolchain.sm_count() // t, panels // 2))
    return wg, stages, splits, t, 1


def workspace_floats(m: int, n: int, k: int, glu: bool = False,
                     config: Config | None = None) -> int:  # fmt: skip
    """fp32 workspace the splits' partials take (0 with one split)."""
    wg, _, splits, t, cluster = plan(m, n, k, glu, config)
    return 0 if splits == 1 or cluster > 1 else splits * t * (token_cols(m) // 2) * 128 * wg


def counters_needed(n: int, glu: bool = False, config: Config | None = None) -> int:
    """Arrival counters (uint32, zeroed before the first launch) a launch may use (the
    L2 workspace's splits; clusters use none)."""
    wg = 2 if glu else (config or DEFAULT_CONFIG)[0]
    return tiles(n, wg, glu)


@functools.lru_cache(maxsize=512)
def _tensor_map(ptr: int, dtype: str, cols: int, rows: int, row_stride: int,
                box_rows: int) -> bytes:  # fmt: skip
    """A [rows, cols] row-major matrix as a 2-d tensor map of 64-column x box_rows boxes
    in the 128-byte swizzle (rows and columns past the end read as zeros)."""
    return _native.tensor_map_tiled(dtype, ptr, [cols, rows], [2 * row_stride], [64, box_rows])


def fits(m: int, n: int, k: int, dtype: str, x_stride: int, w_stride: int, glu: bool) -> bool:
    """Whether the kernel takes these shapes: bf16 / f16, MIN_ROWS..MAX_ROWS token rows,
    row strides that keep every row 16-byte aligned (tensor maps), an even N with SwiGLU."""
    return (
        dtype in DTYPES and MIN_ROWS <= m <= MAX_ROWS and n > 0 and k > 0
        and x_stride % 8 == 0 and w_stride % 8 == 0 and x_stride >= k and w_stride >= k
        and (not glu or n % 2 == 0)
    )  # fmt: skip


def skinny(x: int, w: int, y: int, m: int, n: int, k: int, dtype: str, *, res: int = 0,
           x_stride: int | None = None, w_stride: int | None = None,
           y_stride: int | None = None, res_stride: int | None = None, glu: bool = False,
           workspace: int = 0, counters: int = 0, config: Config | None = None,
           w_early: bool = False, stream: Any = None) -> None:  # fmt: skip
    """y [m, n'] = x [m, k] @ w [n, k]^T (+ res [m, n']), n' = n (SwiGLU: n / 2, y =
    silu(gate) * up with the gate in w's first n / 2 rows). x and w 16-byte aligned with
    row strides (elements) multiples of 8. With more than one split (plan()), workspace
    reduced through L2 (cluster 1), workspace (workspace_floats() fp32, 16-byte aligned)
    and counters (counters_needed() uint32, zeroed; the kernel leaves them zeroed) are
    required. w_early: w is never written by
    the work ahead on the stream, so the kernel may load it before that work ends."""
    op = "skinny_sm90"
    xs = k if x_stride is None else x_stride
    wst = k if w_stride is None else w_stride
    n_out = n // 2 if glu else n
    ys = n_out if y_stride is None else y_stride
    rs = n_out if res_stride is None else res_stride
    if not fits(m, n, k, dtype, xs, wst, glu):
        raise ShapeError(f"{op}: x [{m}, {k}] (row stride {xs}) @ w [{n}, {k}]^T (row stride "
                         f"{wst}) {dtype}{' glu' if glu else ''} is outside the kernel's "
                         f"shapes (fits())")  # fmt: skip
    if x % 16 or w % 16:
        raise ShapeError(f"{op}: x and w need 16-byte aligned addresses, got {x:#x} {w:#x}")
    wg, stages, splits, t, cluster = plan(m, n, k, glu, config)
    global_splits = splits > 1 and cluster == 1  # reduced through L2
    if global_splits and (not workspace or workspace % 16 or not counters or counters % 4):
        raise ShapeError(f"{op}: {splits} splits need a workspace and counters, got "
                         f"workspace={workspace:#x} counters={counters:#x}")  # fmt: skip
    sn = token_cols(m)
    smem = smem_bytes(sn, wg, stages)
    if smem > loader.max_shared_optin():
        raise ShapeError(f"{op}: needs {smem} bytes of shared memory, the device has "
                         f"{loader.max_shared_optin()}")  # fmt: skip
    tm_w = _tensor_map(w, dtype, k, n, wst, 64)
    tm_x = _tensor_map(x, dtype, k, m, xs, sn)
    fn = loader.get_kernel(FAMILY, KERNEL, defines(dtype, sn, wg, stages, glu, cluster))
    fn.set_dynamic_smem(smem)
    args = (tm_w, tm_x, y, res, ys, rs, workspace if global_splits else 0,
            counters if global_splits else 0, m, n, k, splits, int(w_early))  # fmt: skip
    fn.launch((t * splits,), (128 * wg + 32,), args, smem, stream)
