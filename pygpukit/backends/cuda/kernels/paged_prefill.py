"""Launcher for paged_prefill.cuh: the rows of prompt pieces in a paged attention launch
of one query per row, on tensor cores (after paged_decode.attend with pieces=True, which
takes every other row)."""

from __future__ import annotations

from typing import Any

from pygpukit.errors import ShapeError

from ..codegen.prelude import ERR_INDEX
from . import loader
from ._common import cdiv

DTYPES = loader.HALF_DTYPES
HEAD_DIMS = (64, 128)
ROWS = 64  # PGK_PM: consecutive rows a block
HEAD_THREADS = 128  # threads a query head of a block (PGK_PT / PGK_PHG)
HEADS_PER_BLOCK = 2  # PGK_PHG where the GQA group divides by it
KEYS = 64  # PGK_PN: keys a tile
STAGES = 2  # PGK_PSTAGES
MAX_GRID = 2**31 - 1


def smem_bytes(head_dim: int) -> int:
    """Dynamic shared memory: the stages of a K and a V tile, rows padded by 16 bytes."""
    return STAGES * 2 * KEYS * (head_dim + 8) * 2


def heads_per_block(group: int) -> int:
    """Query heads a block takes (PGK_PHG): they share one KV head's tiles, so a block
    holds heads of one GQA group only."""
    return HEADS_PER_BLOCK if group % HEADS_PER_BLOCK == 0 else 1


def supports(dtype: str, head_dim: int, heads: int, kv_heads: int, rows: int) -> bool:
    """Whether the kernel takes this launch: bf16 / f16, head dim 64 or 128, GQA, at least
    two rows (a piece has two), and its stages fit the device's shared memory."""
    return (dtype in DTYPES and head_dim in HEAD_DIMS and kv_heads > 0
            and heads % kv_heads == 0 and rows > 1 and cdiv(rows, ROWS) * heads <= MAX_GRID
            and smem_bytes(head_dim) <= loader.max_shared_optin())  # fmt: skip


def fits(q: int, q_strides: tuple[int, int], k_pool: int, v_pool: int, out: int) -> bool:
    """Whether the operands are aligned for it: q rows, the pools 16-byte aligned (a
    cp.async moves 8 elements), out 4-byte aligned (pairs are stored)."""
    return (q % 16 == 0 and all(x % 8 == 0 for x in q_strides) and k_pool % 16 == 0
            and v_pool % 16 == 0 and out % 4 == 0)  # fmt: skip


def attend(
    q: int,
    k_pool: int,
    v_pool: int,
    table: int,
    lens: int,
    out: int,
    *,
    rows: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    n_blocks: int,
    max_blocks: int,
    dtype: str,
    scale: float,
    q_strides: tuple[int, int],
    table_strides: tuple[int, int],
    lens_stride: int,
    err: int,
    tag: int,
    inputs_early: bool = True,
    pool_block_stride: int | None = None,
    rope: tuple[int, int, int] | None = None,
    stream: Any = None,
) -> None:
    """out[b, h] = softmax(scale q[b, h] . k[j], j < lens[b]) @ v[j] for the rows of prompt
    pieces (rows whose block table agrees with a neighbour's), keys read through table[b]
    (int32) from pools [n_blocks, kv_heads, block_size, head_dim] whose blocks are
    pool_block_stride elements apart (default: contiguous pools); other rows untouched.

    q [rows, heads, 1, head_dim] with strides (row, head) in elements; out [rows, heads, 1,
    head_dim] contiguous. inputs_early: launched right after paged_decode.attend on the
    same operands (its wait has seen them written), so the kernel reads them before its
    own wait. rope (cos, sin, row stride): q[b] is attended rotated by table row b, as
    paged_decode.attend's rope (whose rule, rope_fits, the tables follow)."""
    if not supports(dtype, head_dim, heads, kv_heads, rows):
        raise ShapeError(f"paged_prefill: unsupported shape (dtype {dtype}, head_dim "
                         f"{head_dim}, heads {heads}/{kv_heads}, rows {rows})")  # fmt: skip
    if not fits(q, q_strides, k_pool, v_pool, out):
        raise ShapeError("paged_prefill: q and the pools need 16-byte aligned rows")
    p_sb = kv_heads * block_size * head_dim if pool_block_stride is None else pool_block_stride
    if p_sb < kv_heads * block_size * head_dim or p_sb % 8:
        raise ShapeError(f"paged_prefill: pool blocks {p_sb} elements apart overlap or are "
                         f"not 16-byte aligned")  # fmt: skip
    phg = heads_per_block(heads // kv_heads)
    defines: dict[str, object] = {**loader.type_defines(dtype), "PGK_D": head_dim,
                                  "PGK_PSTAGES": STAGES, "PGK_PHG": phg,
                                  "PGK_ERR_INDEX": ERR_INDEX}  # fmt: skip
    if rope is not None:
        if rope[0] % 4 or rope[1] % 4 or rope[2] % 2:
            raise ShapeError("paged_prefill: the rope tables need 4-byte aligned rows")
        defines["PGK_QROPE"] = 1
    cs, sn, cs_s = rope if rope is not None else (0, 0, 0)
    fn = loader.get_kernel("paged_prefill", "pgk_paged_prefill", defines)
    smem = smem_bytes(head_dim)
    fn.set_dynamic_smem(smem)
    fn.launch((cdiv(rows, ROWS) * (heads // phg),), (HEAD_THREADS * phg,),
              (q, k_pool, v_pool, table, lens, out, rows, heads, heads // kv_heads, kv_heads,
               block_size, n_blocks, max_blocks, p_sb, float(scale), *q_strides, *table_strides,
               lens_stride, err, tag, int(inputs_early), cs, sn, cs_s), smem,
              stream)  # fmt: skip
